"""The fused LM-head log-prob function (rollwise.trainer.head): values and gradients equal the
autograd formula, hand-checked on a 3-word vocabulary, gradient-checked in float64."""

import math
from types import SimpleNamespace

import pytest
import torch

from rollwise.trainer.head import fusable, head_logprobs, reference_head_logprobs


def test_values_by_hand_on_a_three_word_vocabulary():
    # one hidden state h = (1, 0), head weight rows (w_v . h) = logits 0, ln 2, ln 5 at T = 1:
    # p = (1, 2, 5) / 8; lp of word 2 = ln(5/8); H = -(1/8 ln 1/8 + 2/8 ln 2/8 + 5/8 ln 5/8)
    head = torch.nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[0.0, 7.0], [math.log(2), 7.0], [math.log(5), 7.0]]))
    lp, ent = head_logprobs(torch.tensor([[1.0, 0.0]]), head, torch.tensor([2]), 1.0, True)
    p = [1 / 8, 2 / 8, 5 / 8]
    assert lp.item() == pytest.approx(math.log(5 / 8), abs=1e-6)
    assert ent.item() == pytest.approx(-sum(q * math.log(q) for q in p), abs=1e-6)
    # d lp / d logits = onehot - p: the weight row of word 0 gets -1/8 * h, of word 2 (1 - 5/8) * h
    lp.sum().backward()
    assert head.weight.grad[:, 0].tolist() == pytest.approx([-1 / 8, -2 / 8, 3 / 8], abs=1e-6)
    assert head.weight.grad[:, 1].tolist() == pytest.approx([0.0, 0.0, 0.0], abs=1e-7)


@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.parametrize("temperature,with_entropy,bias", [(1.0, False, False), (0.7, True, True), (1.3, True, False)])
def test_gradcheck_float64(temperature, with_entropy, bias, keep):
    torch.manual_seed(0)
    head = torch.nn.Linear(4, 7, bias=bias).double()
    h = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([0, 6, 3, 3, 1])

    def f(h, w, *b):  # head_logprobs reads only the head's weight and bias
        lp, ent = head_logprobs(
            h, SimpleNamespace(weight=w, bias=b[0] if b else None), targets, temperature, with_entropy, keep=keep
        )
        return lp * 1.5 + (0.3 * ent if with_entropy else 0)  # both outputs carry gradient

    w = head.weight.detach().clone().requires_grad_(True)
    args = (h, w) + ((head.bias.detach().clone().requires_grad_(True),) if bias else ())
    assert torch.autograd.gradcheck(f, args, eps=1e-6, atol=1e-6)


def test_equals_autograd_reference_in_values_and_gradients():
    torch.manual_seed(1)
    head = torch.nn.Linear(8, 50)
    h = torch.randn(6, 8, requires_grad=True)
    targets = torch.randint(0, 50, (6,))
    lp, ent = head_logprobs(h, head, targets, 0.8, True)
    (lp.sum() - 0.2 * ent.sum()).backward()
    fused = [h.grad.clone(), head.weight.grad.clone(), head.bias.grad.clone()]
    h.grad, head.weight.grad, head.bias.grad = None, None, None
    lp2, ent2 = reference_head_logprobs(h, head, targets, 0.8, True)
    (lp2.sum() - 0.2 * ent2.sum()).backward()
    assert torch.allclose(lp, lp2, atol=1e-6) and torch.allclose(ent, ent2, atol=1e-6)
    for a, b in zip(fused, [h.grad, head.weight.grad, head.bias.grad]):
        assert torch.allclose(a, b, atol=1e-6)


def test_only_log_probs_used_and_no_entropy():
    torch.manual_seed(2)
    head = torch.nn.Linear(8, 20, bias=False)
    h = torch.randn(3, 8, requires_grad=True)
    t = torch.tensor([1, 2, 3])
    lp, ent = head_logprobs(h, head, t, 1.0, False)
    assert bool((ent == 0).all())
    lp.sum().backward()
    g = h.grad.clone()
    h.grad = None
    reference_head_logprobs(h, head, t, 1.0, False)[0].sum().backward()
    assert torch.allclose(g, h.grad, atol=1e-6)


def test_bf16_products_fp32_results_and_gradients():
    torch.manual_seed(3)
    head = torch.nn.Linear(16, 40, bias=False)
    h = torch.randn(4, 16, requires_grad=True)
    t = torch.tensor([0, 1, 2, 3])
    lp16, _ = head_logprobs(h, head, t, 1.0, False, compute_dtype=torch.bfloat16)
    lp16.sum().backward()
    assert lp16.dtype == torch.float32 and head.weight.grad.dtype == torch.float32 and h.grad.dtype == torch.float32
    lp32, _ = head_logprobs(h, head, t, 1.0, False)
    assert torch.allclose(lp16, lp32, atol=0.1) and not torch.equal(lp16, lp32)  # bf16 did run


def test_only_plain_linear_heads_are_fused():
    assert fusable(torch.nn.Linear(2, 3)) and not fusable(torch.nn.Identity())


@pytest.mark.parametrize("keep,products", [(False, 2), (True, 1)])
def test_keep_saves_the_rebuild_of_the_logits(monkeypatch, keep, products):
    import rollwise.trainer.head as head_mod

    calls = []
    real = head_mod._logits
    monkeypatch.setattr(head_mod, "_logits", lambda *a: (calls.append(1), real(*a))[1])
    head = torch.nn.Linear(4, 9, bias=False)
    h = torch.randn(3, 4, requires_grad=True)
    lp, _ = head_logprobs(h, head, torch.tensor([0, 4, 8]), 1.0, True, keep=keep)
    lp.sum().backward()
    assert len(calls) == products and h.grad is not None
