"""OTR loss (systems.md §12): worked example, vanishing gradient on a one-hot policy, and the
expected gradient pi(y*) grad log pi(y*)."""

from __future__ import annotations

import math

import pytest
import torch

from rollwise.config import load_config
from rollwise.objectives.otr import OtrOptions, otr_loss


def test_exact_worked_example():
    # pi = softmax([0, 0]) = [0.5, 0.5], gold 0: loss = -0.5 log 0.5; d/d logit_0 = -0.5 (1 - 0.5) = -0.25
    logits = torch.zeros(1, 1, 2, requires_grad=True)
    loss = otr_loss(logits, torch.tensor([[0]]), torch.ones(1, 1), OtrOptions(mode="exact"))
    assert loss.item() == pytest.approx(-0.5 * math.log(0.5))
    loss.backward()
    assert logits.grad[0, 0].tolist() == pytest.approx([-0.25, 0.25])


def test_one_hot_policy_on_gold_has_no_gradient():
    logits = torch.tensor([[[30.0, 0.0, 0.0]]], requires_grad=True)
    for mode in ("exact", "sample"):
        logits.grad = None
        otr_loss(logits, torch.tensor([[0]]), torch.ones(1, 1), OtrOptions(mode=mode, negative=-0.1)).backward()
        assert logits.grad.abs().max().item() < 1e-10


def test_expected_gradient_is_pi_gold_times_sft_gradient():
    torch.manual_seed(0)
    base = torch.tensor([[[0.3, -0.2, 1.0, 0.1]]])
    gold = torch.tensor([[2]])
    # SFT: grad of -log pi(y*); OTR (negative 0) expects pi(y*) times it
    x = base.clone().requires_grad_(True)
    torch.nn.functional.cross_entropy(x[0], gold[0]).backward()
    pi_gold = torch.softmax(base, -1)[0, 0, 2].item()
    expected = pi_gold * x.grad
    x = base.clone().requires_grad_(True)
    otr_loss(x, gold, torch.ones(1, 1), OtrOptions(mode="exact")).backward()
    assert torch.allclose(x.grad, expected, atol=1e-6)
    # Monte Carlo with many samples approaches the exact expectation
    x = base.clone().requires_grad_(True)
    gen = torch.Generator().manual_seed(3)
    otr_loss(x, gold, torch.ones(1, 1), OtrOptions(samples=40000), generator=gen).backward()
    assert torch.allclose(x.grad, expected, atol=5e-3)


def test_mask_selects_reference_positions():
    logits = torch.zeros(1, 2, 2)
    full = otr_loss(logits, torch.tensor([[0, 1]]), torch.tensor([[1.0, 0.0]]), OtrOptions(mode="exact"))
    assert full.item() == pytest.approx(-0.5 * math.log(0.5))


def test_config_and_cache_key():
    cfg = load_config(overrides=["model.warm_start.objective=otr", "model.warm_start.otr.samples=4"])
    assert cfg.model.warm_start.otr.samples == 4
    from rollwise.config import UserError

    with pytest.raises(UserError):
        load_config(overrides=["model.warm_start.otr.negative=0.5"])  # rewards of wrong tokens are <= 0
