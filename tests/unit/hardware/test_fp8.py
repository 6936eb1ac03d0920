"""FP8 rollouts, Jet-RL's way (arXiv 2601.14243; rollwise.hardware.fp8): e4m3 block quantisation on
hand-worked numbers, straight-through gradients, the sampler's copy sharing the policy's weights,
the sampler/trainer gap with and without the matched trainer, and the refusals at load."""

from __future__ import annotations

import pytest
import torch

from rollwise.backends.hf import HFBackend
from rollwise.collate import collate
from rollwise.config import load_config
from rollwise.hardware.fp8 import (
    fake_quantise,
    fp8_operand,
    quantise_activation,
    quantise_linears,
    sampler_copy,
    scaled_linear,
)
from rollwise.objectives import OBJECTIVES
from rollwise.registry import UserError
from rollwise.trainer.tiny import build_tiny
from rollwise.trainer.trainer import Trainer
from rollwise.types import Advantages, Rollout, Sampling

T = torch.tensor


def close(x, expected, rel=1e-6):
    return torch.allclose(x, T(expected, dtype=x.dtype), rtol=rel, atol=0.0)


def test_fake_quantise_hand_worked():
    # one 1x2 tile [1, 0.3]: scale 1/448; 0.3 * 448 = 134.4 -> e4m3 128 (step 16 in [128, 256)) -> 128/448
    assert close(fake_quantise(T([[1.0, 0.3]]), 1, 2), [[1.0, 128 / 448]])
    # two rows, 1x2 tiles: each row its own scale, so [100, 30] keeps the same relative grid
    x = T([[1.0, 0.3], [100.0, 30.0]])
    assert close(fake_quantise(x, 1, 2), [[1.0, 128 / 448], [100.0, 100 * 128 / 448]])
    # one 2x2 tile: scale 100/448; 1 * 4.48 -> 4.5 (step 0.5 in [4, 8)) -> 4.5 * 100 / 448; 0.3 * 4.48 = 1.344 -> 1.375
    assert close(fake_quantise(x, 2, 2), [[4.5 * 100 / 448, 1.375 * 100 / 448], [100.0, 100 * 128 / 448]])
    # values on e4m3's grid at scale 1 come back unchanged; a tile of zeros stays zero; a ragged edge tile
    assert fake_quantise(T([[448.0, 1.0, 0.5, -2.0]]), 1, 4).tolist() == [[448.0, 1.0, 0.5, -2.0]]
    assert fake_quantise(torch.zeros(2, 3), 2, 2).tolist() == [[0.0] * 3] * 2
    assert close(fake_quantise(T([[1.0, 0.3, 7.0]]), 1, 2), [[1.0, 128 / 448, 7.0]])
    # activations: one scale per group of features of each token
    a = T([[[1.0, 0.3, 100.0, 30.0]]])
    assert close(quantise_activation(a, 2), [[[1.0, 128 / 448, 100.0, 100 * 128 / 448]]])


def test_quantised_linear_forward_and_straight_through_gradient():
    lin = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        lin.weight.copy_(T([[1.0, 0.3]]))
    x = T([[1.0, 0.3]], requires_grad=True)
    quantise_linears(lin, block=2)
    y = lin(x)
    q = 128 / 448
    assert y.item() == pytest.approx(1 + q * q)  # q(x) . q(W)
    y.sum().backward()
    # straight through: dy/dW = q(x), dy/dx = q(W)
    assert close(lin.weight.grad, [[1.0, q]])
    assert close(x.grad, [[1.0, q]])


def test_fp8_operand_codes_times_scales_are_the_fake_quantised_values():
    # the tile [[1, 0.3]] at scale 1/448: codes 448 and 128 (e4m3), so q * s = [1, 128/448]
    q, s = fp8_operand(T([[1.0, 0.3]]), 1, 2)
    assert q.dtype == torch.float8_e4m3fn and q.float().tolist() == [[448.0, 128.0]] and close(s, [[1 / 448]])
    # a ragged matrix: padded columns are zero codes; codes times their tile's scale = fake_quantise
    x = torch.randn(5, 7, generator=torch.Generator().manual_seed(0)) * 10
    q, s = fp8_operand(x, 2, 4)
    assert q.shape == (5, 8) and s.shape == (3, 2) and q[:, 7].float().abs().sum() == 0
    back = q.float()[:, :7] * s.repeat_interleave(2, 0)[:5].repeat_interleave(4, 1)[:, :7]
    assert torch.equal(back, fake_quantise(x, 2, 4))


def test_scaled_mm_path_is_the_emulated_product_and_gradient():
    """model.fp8_gemm = "scaled_mm": e4m3 codes multiplied by torch._scaled_mm block by block give the
    emulated path's output up to fp32 rounding, and the same straight-through gradients (ragged sizes,
    a bias, a batch axis)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, 40, generator=g, requires_grad=True)
    w = torch.randn(24, 40, generator=g, requires_grad=True)
    b = torch.randn(24, generator=g, requires_grad=True)
    y = scaled_linear(x, w, b, 16)
    lin = torch.nn.Linear(40, 24)
    with torch.no_grad():
        lin.weight.copy_(w), lin.bias.copy_(b)
    quantise_linears(lin, block=16)
    x2 = x.detach().clone().requires_grad_(True)
    y2 = lin(x2)
    assert torch.allclose(y, y2, rtol=0, atol=1e-5 * y2.abs().max().item())
    dy = torch.randn(y.shape, generator=g)
    gx, gw, gb = torch.autograd.grad(y, (x, w, b), dy)
    y2.backward(dy)
    assert torch.allclose(gx, x2.grad, atol=1e-5) and torch.allclose(gw, lin.weight.grad, atol=1e-5)
    assert torch.allclose(gb, lin.bias.grad)


def test_scaled_mm_sampler_matches_the_emulated_sampler():
    model, _ = build_tiny("tiny-s", seed=0)
    ids = T([[5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        emulated = sampler_copy(model, block=128)(ids).logits
        real = sampler_copy(model, block=128, gemm="scaled_mm")(ids).logits
        plain = model(ids).logits
    assert torch.allclose(real, emulated, atol=1e-4) and not torch.allclose(real, plain, atol=1e-4)


def test_sampler_copy_shares_weights_and_follows_updates():
    model, _ = build_tiny("tiny-s", seed=0)
    sampler = sampler_copy(model, block=128)
    q_proj = sampler.model.layers[0].self_attn.q_proj
    assert q_proj.weight is model.model.layers[0].self_attn.q_proj.weight and sampler.lm_head is not model.lm_head
    assert sampler.lm_head.weight is model.lm_head.weight  # the head is shared and not quantised
    ids = T([[5, 6, 7, 8]])
    with torch.no_grad():
        plain, fp8 = model(ids).logits, sampler(ids).logits
        assert not torch.allclose(plain, fp8)  # the sampler computes in e4m3, the policy does not
        model.model.layers[0].self_attn.q_proj.weight.mul_(2.0)  # an optimizer step, in place
        assert not torch.allclose(sampler(ids).logits, fp8)  # the cached q(W) followed the update
        assert torch.allclose(model(ids).logits, model(ids).logits)


def _rollouts(backend, tok, n=6):
    prompts = [tok.encode(f"{10 + i}+{20 + i}=") for i in range(n)]
    done = backend.generate(prompts, Sampling(temperature=1.0, max_new_tokens=12))
    return [
        Rollout(f"p{i}", tuple(p), c.token_ids, c.logprobs, c.finish, 0) for i, (p, c) in enumerate(zip(prompts, done))
    ]


def _gap(model, batch):
    grpo = OBJECTIVES.get("grpo")
    trainer = Trainer(model, grpo, grpo.Options(), load_config().train, temperature=1.0)
    acc = trainer.accumulate(batch)  # the step's forward and backward (no update)
    trainer.optimizer.zero_grad(set_to_none=True)
    return acc.gap.metrics()


@pytest.mark.parametrize("gemm", ["emulated", "scaled_mm"])
def test_mismatch_is_larger_unmatched_than_matched(gemm):
    # FP8 rollouts from the sampler's copy; the trainer recomputes the same tokens in full precision
    # (unmatched) or through the same quantisation (matched, Jet-RL); mismatch/* is the trainer's gap meter
    model, tok = build_tiny("tiny-s", seed=0)
    sampler = sampler_copy(model, block=128, gemm=gemm)
    backend = HFBackend(sampler, [tok.eos_token_id], tok.pad_token_id, max_batch=8, seed=0)
    rows = _rollouts(backend, tok)
    b = len(rows)
    adv = Advantages(torch.ones(b), torch.ones(b, dtype=torch.bool))
    batch = collate(rows, torch.zeros(b), torch.zeros(b, dtype=torch.long), adv, tok.pad_token_id)
    unmatched = _gap(model, batch)
    matched = _gap(quantise_linears(model, block=128, gemm=gemm), batch)
    assert unmatched["mismatch/abs_mean"] > 10 * matched["mismatch/abs_mean"]
    assert unmatched["mismatch/k3_kl"] > matched["mismatch/k3_kl"]
    assert matched["mismatch/abs_mean"] < 1e-3


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["train.matched_quantisation=true"], "model.rollout_precision"),
        (["model.rollout_precision=fp8", "model.lora.enabled=true"], "model.lora.enabled"),
        (["model.rollout_precision=fp8", "train.async.max_staleness=1"], "train.async"),
        (["model.rollout_precision=fp8", "model.fp8_block_size=0"], "fp8_block_size"),
        (["model.fp8_gemm=scaled_mm"], "model.rollout_precision"),
        (["model.rollout_precision=fp8", "model.fp8_gemm=int8"], "fp8_gemm"),
    ],
)
def test_refused_at_load(overrides, key):
    with pytest.raises(UserError, match=key.replace(".", r"\.")):
        load_config(overrides=overrides)


def test_loads():
    cfg = load_config(overrides=["model.rollout_precision=fp8", "train.matched_quantisation=true"])
    assert cfg.model.rollout_precision == "fp8" and cfg.train.matched_quantisation and cfg.model.fp8_block_size == 128
