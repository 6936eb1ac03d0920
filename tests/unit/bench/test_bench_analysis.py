"""compare.json's numbers on hand-made curves (rollwise.bench.analysis)."""

import numpy as np
import pytest

from rollwise.bench import analysis as A


def C(*pts):
    return np.array([p[0] for p in pts], float), np.array([p[1] for p in pts], float)


# ---------------------------------------------------------------- tokens to target


def test_crossing_interpolates_between_the_two_eval_points():
    # (0, 0.2) -> (100, 0.6), target 0.5: 0 + (0.5 - 0.2) / (0.6 - 0.2) * 100 = 75
    assert A.crossing(*C((0, 0.2), (100, 0.6)), 0.5) == pytest.approx(75.0)


def test_crossing_is_the_first_one():
    # rises through 0.4 between 0 and 10 (0.1 -> 0.5): 0 + 0.3 / 0.4 * 10 = 7.5; later dips do not matter
    x, y = C((0, 0.1), (10, 0.5), (20, 0.2), (30, 0.8))
    assert A.crossing(x, y, 0.4) == pytest.approx(7.5)
    # 0.6 is only reached after the dip: 20 + (0.6 - 0.2) / (0.8 - 0.2) * 10 = 26.67
    assert A.crossing(x, y, 0.6) == pytest.approx(20 + 10 * 0.4 / 0.6)


def test_crossing_at_a_point_at_the_start_and_never():
    x, y = C((0, 0.3), (50, 0.5), (100, 0.4))
    assert A.crossing(x, y, 0.5) == 50.0  # exactly at an eval point
    assert A.crossing(x, y, 0.2) == 0.0  # already there at 0 tokens
    assert A.crossing(x, y, 0.51) is None  # never reached: None, not a number


# ---------------------------------------------------------------- AUC


def test_auc_is_the_mean_pass_at_1_over_the_budget():
    # triangle (0, 0) -> (100, 1): area 50 over 100 tokens = 0.5
    assert A.auc(*C((0, 0.0), (100, 1.0)), 100) == pytest.approx(0.5)
    # a curve that ends at 100 holds 1.0 up to 200: (50 + 100) / 200 = 0.75
    assert A.auc(*C((0, 0.0), (100, 1.0)), 200) == pytest.approx(0.75)
    # a curve past the budget is cut there: value 0.5 at 100, area 25 -> 0.25
    assert A.auc(*C((0, 0.0), (200, 1.0)), 100) == pytest.approx(0.25)
    # steps: (0, .2), (40, .4), (100, .4): (0.2 + 0.4) / 2 * 40 + 0.4 * 60 = 12 + 24 = 36 -> 0.36
    assert A.auc(*C((0, 0.2), (40, 0.4), (100, 0.4)), 100) == pytest.approx(0.36)


# ---------------------------------------------------------------- seeds


def test_mean_curve_on_the_union_grid():
    # A: (0, 0) -> (100, 1); B: (0, .2) -> (50, .4), flat after 50.
    # grid 0, 50, 100: A = 0, .5, 1; B = .2, .4, .4; mean = .1, .45, .7
    m = A.mean_curve([C((0, 0.0), (100, 1.0)), C((0, 0.2), (50, 0.4))])
    assert m["x"] == [0.0, 50.0, 100.0]
    assert m["mean"] == pytest.approx([0.1, 0.45, 0.7])
    assert m["lo"] == pytest.approx([0.0, 0.4, 0.4])
    assert m["hi"] == pytest.approx([0.2, 0.5, 1.0])


def test_bootstrap_is_deterministic_and_handles_never():
    vals = np.array([0.1, 0.3, 0.2, 0.6])
    stat = lambda idx: float(vals[idx].mean())  # noqa: E731
    a, b = A.bootstrap_ci(4, stat), A.bootstrap_ci(4, stat)
    assert a == b  # fixed RNG seed
    assert a[0] < vals.mean() < a[1]
    # identical seeds: a degenerate interval
    assert A.bootstrap_ci(3, lambda idx: 0.25) == [0.25, 0.25]
    # two seeds 0 and 1: resampled means are 0 (1/4), 0.5 (1/2) or 1 (1/4); the 2.5% and 97.5%
    # order statistics of 2000 draws fall in the outer quarters
    two = np.array([0.0, 1.0])
    assert A.bootstrap_ci(2, lambda idx: float(two[idx].mean())) == [0.0, 1.0]
    # a statistic that is never reached counts as +inf: both bounds None
    assert A.bootstrap_ci(3, lambda idx: None) == [None, None]
    # reached only when seed 0 is drawn both times (1/4 of draws): upper bound None
    lo, hi = A.bootstrap_ci(2, lambda idx: 5.0 if (idx == 0).all() else None)
    assert lo == 5.0 and hi is None


def test_ratio():
    assert A.ratio(1.0, 2.0) == 0.5
    assert A.ratio(None, 2.0) is None and A.ratio(1.0, None) is None
    assert A.ratio(1.0, 0.0) is None


def test_train_seconds_exclude_evaluation_and_set_up():
    # wall_s after each eval; eval times 0.5, 0.25, 0.25; set-up before the first eval 0.1 s
    lines = [
        {"step": 0, "wall_s": 0.6, "time/eval_s": 0.5},
        {"step": 2, "wall_s": 3.85, "time/eval_s": 0.25},  # 3.85 - 0.75 - 0.1 = 3.0
        {"step": 4, "wall_s": 6.1, "time/eval_s": 0.25},
    ]  # 6.1 - 1.0 - 0.1 = 5.0
    assert A.train_seconds(lines) == pytest.approx([0.0, 3.0, 5.0])
    # the key's older name is read too
    old = [{k.replace("time/eval_s", "eval/time_s"): v for k, v in line.items()} for line in lines]
    assert A.train_seconds(old) == pytest.approx([0.0, 3.0, 5.0])


# ---------------------------------------------------------------- a whole comparison


def _evals(points, wall_per_token=0.01, k=2):
    """Eval lines from (tokens, pass@1) points; pass@k = pass@1 + 0.1; no eval time."""
    return [
        {
            "step": i,
            "cost/generated_tokens": t,
            "wall_s": t * wall_per_token,
            "eval/pass@1": p,
            f"eval/pass@{k}": p + 0.1,
        }
        for i, (t, p) in enumerate(points)
    ]


def test_analyse_by_hand():
    evals = {
        "base": {0: _evals([(0, 0.2), (100, 0.4), (200, 0.6)]), 1: _evals([(0, 0.2), (100, 0.2), (200, 0.4)])},
        "fast": {
            0: _evals([(0, 0.2), (100, 0.6), (200, 0.7)], wall_per_token=0.02),
            1: _evals([(0, 0.2), (100, 0.4), (200, 0.5)], wall_per_token=0.02),
        },
    }
    r = A.analyse(evals, "base", auc_x_max=200, ks=[2])
    # default target: baseline mean curve's final value (0.6 + 0.4) / 2 = 0.5
    assert r["target"]["value"] == pytest.approx(0.5)
    base, fast = r["arms"]["base"]["metrics"], r["arms"]["fast"]["metrics"]
    # base mean curve 0.2, 0.3, 0.5: reaches 0.5 at its end, 200 tokens (2 s)
    assert base["tokens_to_target"]["value"] == pytest.approx(200)
    assert base["seconds_to_target"]["value"] == pytest.approx(2.0)
    # seed 0 alone: 100 + (0.5 - 0.4) / 0.2 * 100 = 150; seed 1 never reaches 0.5
    assert base["tokens_to_target"]["per_seed"] == {"0": pytest.approx(150.0), "1": None}
    assert base["tokens_to_target"]["seeds_reached"] == 1
    # fast mean curve 0.2, 0.5, 0.6: 100 tokens, at 0.02 s per token 2 s
    assert fast["tokens_to_target"]["value"] == pytest.approx(100)
    assert fast["seconds_to_target"]["value"] == pytest.approx(2.0)
    # AUC base: seed 0 (0.3 * 100 + 0.5 * 100) / 200 = 0.4; seed 1 (0.2 * 100 + 0.3 * 100) / 200 = 0.25
    assert base["auc"]["per_seed"] == {"0": pytest.approx(0.4), "1": pytest.approx(0.25)}
    assert base["auc"]["value"] == pytest.approx(0.325)
    # AUC fast: (0.4 + 0.65) / 2 = 0.525 and (0.3 + 0.45) / 2 = 0.375 -> 0.45
    assert fast["auc"]["value"] == pytest.approx(0.45)
    assert fast["final_pass@1"]["value"] == pytest.approx(0.6)
    assert fast["final_pass@2"]["value"] == pytest.approx(0.7)
    ratios = r["arms"]["fast"]["ratios"]
    assert ratios["tokens_to_target"] == pytest.approx(0.5)  # 100 / 200
    assert ratios["seconds_to_target"] == pytest.approx(1.0)  # 2 / 2
    assert ratios["auc"] == pytest.approx(0.45 / 0.325)
    assert ratios["final_pass@1"] == pytest.approx(0.6 / 0.5)
    assert r["arms"]["base"]["ratios"]["auc"] == 1.0
    for fig in (*base.values(), *fast.values()):
        lo, hi = fig["ci"]
        assert lo is None or fig["value"] is None or lo <= fig["value"] + 1e-12
    # an explicit target nobody reaches: None everywhere, ratios None
    r = A.analyse(evals, "base", auc_x_max=200, ks=[2], target=0.9)
    assert r["target"]["source"] == "sweep file"
    for arm in r["arms"].values():
        assert arm["metrics"]["tokens_to_target"]["value"] is None
        assert arm["metrics"]["tokens_to_target"]["ci"] == [None, None]
        assert arm["ratios"]["tokens_to_target"] is None
