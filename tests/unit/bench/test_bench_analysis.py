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
    r = A.analyse(evals, "base", auc_x_max=200, ks=[2], target="gain:1")
    # gain:1 (the default before issue #43): baseline mean curve's final value (0.6 + 0.4) / 2 = 0.5
    assert r["target"]["value"] == pytest.approx(0.5) and r["target"]["rule"] == "gain:1"
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
    assert r["target"]["rule"] == "absolute 0.9" and r["target"]["value"] == 0.9
    for arm in r["arms"].values():
        assert arm["metrics"]["tokens_to_target"]["value"] is None
        assert arm["metrics"]["tokens_to_target"]["ci"] == [None, None]
        assert arm["ratios"]["tokens_to_target"] is None


# ---------------------------------------------------------------- the target, fixed in advance (issue #43)

TWO_SEEDS = {
    # seed 0: 0.2 -> 0.4 -> 0.6; seed 1: 0.2 -> 0.2 -> 0.4. Mean curve 0.2, 0.3, 0.5
    "base": {0: _evals([(0, 0.2), (100, 0.4), (200, 0.6)]), 1: _evals([(0, 0.2), (100, 0.2), (200, 0.4)])},
    # seed 0: 0.2 -> 0.6 -> 0.7; seed 1: 0.2 -> 0.4 -> 0.5
    "fast": {0: _evals([(0, 0.2), (100, 0.6), (200, 0.7)]), 1: _evals([(0, 0.2), (100, 0.4), (200, 0.5)])},
}


def test_the_default_target_is_three_quarters_of_the_baselines_gain():
    r = A.analyse(TWO_SEEDS, "base", auc_x_max=200, ks=[2])
    t = r["target"]
    # start 0.2, final 0.5: 0.2 + 0.75 * (0.5 - 0.2) = 0.425
    assert t["rule"] == "gain:0.75" and t["fraction"] == 0.75
    assert (t["baseline_start"], t["baseline_final"]) == (pytest.approx(0.2), pytest.approx(0.5))
    assert t["value"] == pytest.approx(0.425)
    # base mean curve 0.3 at 100, 0.5 at 200: 100 + (0.425 - 0.3) / 0.2 * 100 = 162.5, inside its curve
    assert r["arms"]["base"]["metrics"]["tokens_to_target"]["value"] == pytest.approx(162.5)


def test_a_gain_target_is_taken_from_the_baselines_mean_curve_not_the_arms():
    # the same rule with the other arm as baseline: fast's mean curve 0.2 -> 0.6, gain:0.5 -> 0.4
    r = A.analyse(TWO_SEEDS, "fast", auc_x_max=200, ks=[2], target="gain:0.5")
    assert r["target"]["value"] == pytest.approx(0.4) and r["target"]["baseline_final"] == pytest.approx(0.6)


def test_the_baseline_reaching_the_target_in_fewer_than_all_seeds_is_warned():
    # gain:0.75 = 0.425: seed 0 of base reaches it (at 100 + 0.025 / 0.2 * 100 = 112.5), seed 1 never (0.4 at most)
    r = A.analyse(TWO_SEEDS, "base", auc_x_max=200, ks=[2])
    assert r["arms"]["base"]["metrics"]["tokens_to_target"]["per_seed"] == {"0": pytest.approx(112.5), "1": None}
    assert r["target"]["baseline_seeds_reached"] == "1/2"
    (w,) = r["warnings"]
    assert w.startswith("the baseline 'base' reaches the target 0.425 in 1 of 2 seeds")
    # gain:0.5 = 0.35: seed 0 at 75, seed 1 at 100 + 0.15 / 0.2 * 100 = 175; both reach it, no warning
    r = A.analyse(TWO_SEEDS, "base", auc_x_max=200, ks=[2], target="gain:0.5")
    assert r["target"]["baseline_seeds_reached"] == "2/2" and r["warnings"] == []


@pytest.mark.parametrize(
    "value, expected",
    [(0.4, ("absolute", 0.4)), (1, ("absolute", 1.0)), (0, ("absolute", 0.0)), ("gain:0.75", ("gain", 0.75))],
)
def test_target_rule_reads_both_forms(value, expected):
    assert A.target_rule(value) == expected


@pytest.mark.parametrize("value", [1.2, -0.1, "gain:0", "gain:1.5", "gain:", "gain:x", "final", "0.4", True, None])
def test_target_rule_refuses_what_is_neither(value):
    with pytest.raises(ValueError, match="gain:F|pass@1 in"):
        A.target_rule(value)


# ---------------------------------------------------------------- paired seeds (issue #43)


def test_paired_saving_by_hand():
    # baseline 100, 200, 300 tokens; arm 50, 100, 100: savings 2, 2, 3; geometric mean (2 * 2 * 3)^(1/3)
    p = A.paired_saving([50, 100, 100], [100, 200, 300], [400] * 3, [400] * 3)
    assert [s["saving"] for s in p["per_seed"]] == [2.0, 2.0, 3.0]
    assert all(s["bound"] == "exact" for s in p["per_seed"]) and p["censored"] == 0
    assert p["value"] == pytest.approx(12 ** (1 / 3))
    # every resample's geometric mean lies in [2, 3]; three draws all of the two seeds at 2 happen with
    # probability 8/27 (> 2.5%), all of the seed at 3 with 1/27 (> 2.5%): the bounds are 2 and 3 exactly
    assert p["ci"] == [pytest.approx(2.0), pytest.approx(3.0)]
    assert A.paired_saving([50, 100, 100], [100, 200, 300], [400] * 3, [400] * 3) == p  # fixed RNG seed
    assert A.paired_separation(p) == 1


def test_paired_saving_is_the_same_ratio_both_ways():
    # geometric means: the arm's saving against the baseline is 1 / the baseline's against the arm
    a = A.paired_saving([50, 100, 100], [100, 200, 300], [400] * 3, [400] * 3)
    b = A.paired_saving([100, 200, 300], [50, 100, 100], [400] * 3, [400] * 3)
    assert a["value"] * b["value"] == pytest.approx(1.0)
    assert b["ci"] == [pytest.approx(1 / 3), pytest.approx(1 / 2)] and A.paired_separation(b) == -1


def test_censored_seeds_bound_the_saving_and_widen_the_interval():
    # seed 0: both reach the target: 100 / 50 = 2
    # seed 1: the arm never does, after spending 300 tokens: it needs >= 300, so saving <= 200 / 300
    # seed 2: the baseline never does, after 400 tokens: saving >= 400 / 100 = 4
    p = A.paired_saving([50, None, 100], [100, 200, None], [300, 300, 300], [400, 400, 400])
    assert [(s["bound"], s["saving"]) for s in p["per_seed"]] == [
        ("exact", 2.0),
        ("at most", pytest.approx(2 / 3)),
        ("at least", 4.0),
    ]
    assert p["censored"] == 2
    # the value takes each bound: (2 * 2/3 * 4)^(1/3) = (16/3)^(1/3)
    assert p["value"] == pytest.approx((16 / 3) ** (1 / 3))
    # lower end: seed 1 at its worst (the arm at +inf: saving 0) is drawn in 19/27 of the resamples -> 0;
    # upper end: seed 2 at its best (the baseline at +inf) is drawn in 19/27 too -> open (None)
    assert p["ci"] == [0.0, None] and A.paired_separation(p) == 0


def test_a_baseline_that_never_reaches_the_target_counts_at_the_tokens_it_spent_for_the_lower_end():
    # seed 0: 100 / 50 = 2; seed 1: the baseline spent 400 without reaching it, the arm took 100: >= 4
    p = A.paired_saving([50, 100], [100, None], [200, 200], [400, 400])
    assert p["value"] == pytest.approx(8**0.5)
    # lower end at the worst (seed 1 = 4): resampled geometric means 2 (1/4), sqrt(8) (1/2), 4 (1/4) -> 2.0;
    # upper end at the best (seed 1 = +inf) -> open
    assert p["ci"] == [pytest.approx(2.0), None] and A.paired_separation(p) == 1
    # neither reaches it in a seed: that seed says nothing (saving None), the interval is open at both ends' worst
    q = A.paired_saving([None], [None], [300], [400])
    assert q["per_seed"] == [{"saving": None, "bound": "unknown"}] and q["ci"] == [0.0, None]


def test_analyse_pairs_each_arm_with_the_baselines_same_seeds():
    r = A.analyse(TWO_SEEDS, "base", auc_x_max=200, ks=[2], target=0.35)
    assert r["arms"]["base"]["paired"] == {}
    fig = r["arms"]["fast"]["paired"]["tokens_to_target"]
    # target 0.35: base seed 0 at 75, seed 1 at 175; fast seed 0 at 0.15 / 0.4 * 100 = 37.5, seed 1 at 75
    # savings 75 / 37.5 = 2 and 175 / 75 = 7/3
    assert fig["per_seed"]["0"] == {
        "saving": pytest.approx(2.0),
        "bound": "exact",
        "arm": pytest.approx(37.5),
        "baseline": pytest.approx(75.0),
        "arm_spent": 200.0,
        "baseline_spent": 200.0,
    }
    assert fig["per_seed"]["1"]["saving"] == pytest.approx(7 / 3)
    assert fig["value"] == pytest.approx((2 * 7 / 3) ** 0.5)
    assert fig["ci"] == [pytest.approx(2.0), pytest.approx(7 / 3)] and fig["separation"] == 1
