"""The predictor's measures, on numbers worked out by hand (rollwise.value.metrics)."""

import pytest

from rollwise.value.metrics import auc, brier, calibration, degenerate_prob, summary


def test_brier_by_hand():
    assert brier([0.5, 1.0], [1.0, 1.0]) == pytest.approx(0.125)
    assert brier([0.5] * 4, [0.0, 1.0, 0.0, 1.0]) == pytest.approx(0.25)  # the constant 0.5 on 0/1 outcomes
    with pytest.raises(ValueError, match="equal"):
        brier([0.1], [0.1, 0.2])


def test_degenerate_prob_by_hand():
    assert degenerate_prob(0.5, 4) == pytest.approx(0.125)
    assert degenerate_prob(0.9, 2) == pytest.approx(0.82)
    assert degenerate_prob(0.0, 8) == 1.0


def test_auc_by_hand_with_ties_and_one_class():
    assert auc([0.9, 0.2, 0.6], [True, False, False]) == 1.0
    # positives 0.5, 0.3; negatives 0.5, 0.1: pairs (0.5,0.5) tie 0.5, (0.5,0.1) 1, (0.3,0.5) 0, (0.3,0.1) 1 -> 2.5/4
    assert auc([0.5, 0.3, 0.5, 0.1], [True, True, False, False]) == pytest.approx(0.625)
    assert auc([0.1, 0.2], [True, True]) is None


def test_calibration_bins_and_summary():
    bins = calibration([0.05, 0.15, 0.12, 1.0], [0.0, 1.0, 0.0, 1.0], bins=10)
    assert [(b["lo"], b["count"]) for b in bins] == [(0.0, 1), (0.1, 2), (0.9, 1)]
    assert bins[1]["pred_mean"] == pytest.approx(0.135) and bins[1]["obs_mean"] == pytest.approx(0.5)
    s = summary([0.5, 0.9], [0.5, 1.0], [False, True], [2, 2])
    assert s["value/brier"] == pytest.approx((0 + 0.01) / 2)
    assert s["value/auc_degenerate"] == 1.0  # 0.82 (degenerate) > 0.5 (mixed)
