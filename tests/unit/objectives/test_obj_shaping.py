"""DAPO overlong punishment and VCPO ESS learning-rate scaling: pure functions."""

from __future__ import annotations

import math

import pytest
import torch

from rollwise.objectives.dapo import overlong_penalty
from rollwise.objectives.ess import Options as EssOptions
from rollwise.objectives.ess import ess_lr_scale, ess_ratio


def test_overlong_penalty_three_regions():
    # max_len 10, cache 4: free up to 6 -> 0; linear (6 - L) / 4 on (6, 10]; -1 beyond 10
    assert [overlong_penalty(n, 10, 4) for n in (0, 6, 7, 8, 10, 11, 50)] == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0]
    # paper defaults: L_max 20480, L_cache 4096 -> 18432 tokens = (16384 - 18432) / 4096 = -0.5
    assert overlong_penalty(18432, 20480, 4096) == -0.5
    with pytest.raises(ValueError):
        overlong_penalty(5, 10, 0)
    with pytest.raises(ValueError):
        overlong_penalty(5, 10, 11)


def _seq(log_ws: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    # one loss token per row carrying the whole sequence log weight, plus a padded column
    lw = torch.tensor([[w, 123.0] for w in log_ws], dtype=torch.float64)
    mask = torch.tensor([[1.0, 0.0]] * len(log_ws), dtype=torch.float64)
    return lw, mask


def test_ess_on_policy_is_one():
    lw, mask = _seq([0.0, 0.0, 0.0])
    assert ess_ratio(lw, mask) == 1.0 and ess_lr_scale(lw, mask) == 1.0


def test_ess_hand_example_and_rules():
    # w = [1, 3]: rho = (1 + 3)^2 / (2 * (1 + 9)) = 16 / 20 = 0.8
    lw, mask = _seq([0.0, math.log(3)])
    assert math.isclose(ess_ratio(lw, mask), 0.8)
    assert math.isclose(ess_lr_scale(lw, mask), math.sqrt(0.8))
    assert math.isclose(ess_lr_scale(lw, mask, rule="linear"), 0.8)
    # rho_base 0.5: min(1, 0.8 / 0.5) = 1 -> no reduction
    assert ess_lr_scale(lw, mask, base_ess_ratio=0.5) == 1.0


def test_ess_dominant_weight_and_scale_invariance():
    B = 16
    lw, mask = _seq([200.0] + [0.0] * (B - 1))  # one weight e^200 dominates (no overflow)
    assert math.isclose(ess_lr_scale(lw, mask), 1 / math.sqrt(B), rel_tol=1e-6)
    lw, mask = _seq([0.3, -1.2, 0.8, 0.0])
    assert math.isclose(ess_ratio(lw, mask), ess_ratio(lw + 5.0 * mask, mask), rel_tol=1e-12)


def test_ess_sums_token_log_weights_and_skips_empty_rows():
    # row 0 tokens [log 2, log 1.5] -> w 3; row 1 empty (ignored); row 2 w 1 -> rho 0.8
    lw = torch.tensor([[math.log(2), math.log(1.5)], [9.0, 9.0], [0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0]])
    assert math.isclose(ess_ratio(lw, mask), 0.8, rel_tol=1e-6)
    assert EssOptions().rule == "sqrt" and EssOptions().base_ess_ratio == 1.0
