"""MinPRO (systems.md §13) and R3L's OPMD loss (guidance.md §7a.5), worked by hand."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from objtest_utils import make_batch

from rollwise.objectives import OBJECTIVES
from rollwise.objectives.minpro import prefix_min_log_ratio


def test_prefix_min_spec_properties():
    # log r = [0, -0.5, 0.2, -1.0] -> running min [0, -0.5, -0.5, -1.0]
    lr = torch.tensor([[0.0, -0.5, 0.2, -1.0]])
    m = prefix_min_log_ratio(lr, torch.ones_like(lr))
    assert m.tolist() == [[0.0, -0.5, -0.5, -1.0]]
    assert (m[:, 1:] <= m[:, :-1]).all()  # non-increasing
    assert (m <= lr).all()  # m_t <= r_t


def test_prefix_min_skips_prompt_and_padding():
    # mask [0, 1, 1, 0]: the prompt position's -5 must not count; the padding is ignored
    lr = torch.tensor([[-5.0, 0.1, 0.3, -9.0]])
    m = prefix_min_log_ratio(lr, torch.tensor([[0.0, 1, 1, 0]]))
    assert m[0, 1:3].tolist() == pytest.approx([0.1, 0.1])


def test_minpro_equals_grpo_on_policy():
    b = make_batch([2, 1, 3], [3, 4, 2], [0.5, -1.0, 2.0], seed=3)
    for name_opts in ({}, {"gradient": "min"}):
        leaf = b.old_logprobs.clone().requires_grad_(True)
        mp = OBJECTIVES.get("minpro")(b, leaf, OBJECTIVES.get("minpro").Options(**name_opts))
        mp.loss.backward()
        g1 = leaf.grad.clone()
        leaf = b.old_logprobs.clone().requires_grad_(True)
        gr = OBJECTIVES.get("grpo")(b, leaf)
        gr.loss.backward()
        assert mp.loss.item() == pytest.approx(gr.loss.item())
        assert torch.allclose(g1, leaf.grad)


def test_minpro_damps_tokens_after_a_low_ratio():
    # one row, 3 loss tokens, A = 1, eps = 0.2; log r = [log 0.5, 0, 0]
    # grpo: per-token -min(r A, clip(r) A) = [-0.5, -1, -1] -> mean -2.5/3
    # minpro: m = [0.5, 0.5, 0.5] -> [-0.5, -0.5, -0.5] -> mean -0.5
    b = make_batch([1], [3], [1.0], old=torch.zeros(1, 4))
    new = torch.tensor([[0.0, math.log(0.5), 0.0, 0.0]], dtype=b.old_logprobs.dtype)
    assert OBJECTIVES.get("grpo")(b, new).loss.item() == pytest.approx(-2.5 / 3)
    leaf = new.clone().requires_grad_(True)
    out = OBJECTIVES.get("minpro")(b, leaf)
    assert out.loss.item() == pytest.approx(-0.5)
    out.loss.backward()
    # 'current': d/d log pi_t of -(r_t sg(m_t/r_t))/3 = -m_t/3 for every token (no clip active at 0.5 with A > 0)
    assert leaf.grad[0, 1:].tolist() == pytest.approx([-0.5 / 3] * 3)
    assert out.metrics["minpro_damped_frac_sum"] == 2.0


def test_minpro_micro_batches_add_up():
    b = make_batch([1, 2, 1, 3], [3, 2, 4, 1], [1.0, -0.5, 0.3, 2.0], seed=7)
    gen = torch.Generator().manual_seed(1)
    new = b.old_logprobs + 0.3 * torch.randn(b.loss_mask.shape, generator=gen, dtype=b.loss_mask.dtype) * b.loss_mask
    fn = OBJECTIVES.get("minpro")
    full = fn(b, new).loss.item()
    parts = sum(
        fn(b.rows(s), new[s][:, : b.rows(s).loss_mask.shape[1]]).loss.item() for s in (slice(0, 1), slice(1, 4))
    )
    assert parts == pytest.approx(full)


def test_opmd_zero_advantage_gives_zero_loss_and_gradient_has_no_ratio():
    b = make_batch([1, 2], [2, 3], [0.0, 0.0], seed=2)
    new = (b.old_logprobs + 0.7 * b.loss_mask).requires_grad_(True)
    assert OBJECTIVES.get("opmd")(b, new).loss.item() == 0.0
    # A = [2, -1], tau = 1, N = 5 loss tokens: d loss / d log pi_t = -A / (2 * 5), whatever the old log-probs
    b2 = dataclasses.replace(b, advantages=torch.tensor([2.0, -1.0], dtype=b.loss_mask.dtype))
    leaf = (b2.old_logprobs + 3.0 * b2.loss_mask).clone().requires_grad_(True)
    OBJECTIVES.get("opmd")(b2, leaf).loss.backward()
    m = b2.loss_mask.bool()
    assert leaf.grad[0][m[0]].tolist() == pytest.approx([-0.2, -0.2])
    assert leaf.grad[1][m[1]].tolist() == pytest.approx([0.1, 0.1, 0.1])
