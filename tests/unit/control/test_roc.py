"""GRPO-RoC (control/roc.py, arXiv 2508.20722): oversampled groups, successes kept by quality,
failures uniformly, all-equal groups dropped."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from rollwise.config import load_config
from rollwise.control import REGISTRY
from rollwise.control.roc import Options, RoC, downsample, group_rng, penalty, shares
from rollwise.filter.chain import apply_filters
from rollwise.types import Episode, Group, Prompt, Rollout, RunState, ToolCall, Turn, Verdict


def _call(outcome: str) -> ToolCall:
    return ToolCall("python", "print(1)", 0.1, outcome)


def _r(score: float, outcomes: tuple[str, ...] = (), k: int = 0, reason: str = "") -> Rollout:
    """A rollout with one turn per tool call (2 policy + 1 observation tokens each) and a final answer turn."""
    turns, at = [], 0
    for o in outcomes:
        turns.append(Turn(at, at + 2, at + 3, tool_calls=(_call(o),)))
        at += 3
    turns.append(Turn(at, at + 2, at + 2))
    ids = tuple(range(k, k + at + 2))
    return Rollout(
        "p", (1,), ids, (-0.1,) * len(ids), "stop", 0, verdict=Verdict(score, reason), episode=Episode(tuple(turns))
    )


# A group of 8 (G = 4 trained): index -> (reward, tool outcomes) and RoC's penalty p_err + p_format
EIGHT = [
    _r(1.0, ("ok", "ok"), 0),  # 0: success, p = 0 + 0
    _r(0.0, ("error",), 1),  # 1: failure
    _r(1.0, ("ok", "error"), 2),  # 2: success, p = 1/2 + 0
    _r(1.0, (), 3),  # 3: success, no tool call: p = 0.5 + 0 (ties with 2; 2 has the lower index)
    _r(0.0, ("ok",), 4),  # 4: failure
    _r(1.0, ("parse_error", "ok"), 5),  # 5: success, p = 1/2 + 1/3 (one of its 3 turns has a parse error)
    _r(1.0, ("ok", "ok", "ok"), 6),  # 6: success, p = 0
    _r(1.0, ("timeout",), 7),  # 7: success, p = 1 + 0
]
# 6 successes, 2 failures: k_f = round(2 * 4 / 8) = 1, k_s = 3 -> successes {0, 6} (p = 0) and 2 (p = 0.5,
# before 3 by index); the failure is 1 or 4, each with probability 1/2.


def test_penalties():
    o = Options()
    assert [penalty(r, o) for r in EIGHT] == pytest.approx(
        [0, 1.0, 0.5, 0.5, 0, 0.5 + 1 / 3, 0, 1.0]
    )  # failures too (unused)
    assert penalty(_r(1.0, (), reason="no_answer"), o) == 1.5  # p_err 0.5 (no call) + p_format 1
    assert penalty(EIGHT[5], Options(format_penalty=False)) == 0.5
    assert penalty(EIGHT[5], Options(error_penalty=False)) == pytest.approx(1 / 3)


def test_shares_keep_the_failure_share_of_the_oversampled_group():
    o = Options()
    assert shares(2, 6, 4, o) == (1, 3)
    assert shares(3, 5, 4, o) == (2, 2)  # round(1.5) = 2
    assert shares(5, 3, 4, o) == (2, 2)  # round(2.5) = 2 (half to even, as the released code)
    assert shares(1, 7, 4, o) == (1, 3)  # round(0.5) = 0, min_failed 1 keeps the group mixed
    assert shares(7, 1, 4, o) == (3, 1)  # round(3.5) = 4, min_success 1
    assert shares(1, 7, 4, Options(min_failed=0)) == (0, 4)
    assert shares(0, 8, 4, o) == (0, 4) and shares(8, 0, 4, o) == (4, 0)


def test_group_of_eight_successes_by_quality_failures_uniform():
    counts = Counter()
    for seed in range(2000):
        kept = downsample(EIGHT, 4, random.Random(seed), Options())
        assert len(kept) == 4 and {0, 2, 6} <= set(kept)  # the seed-free part: the three cleanest successes
        counts[tuple(i for i in kept if i in (1, 4))] += 1
    assert set(counts) == {(1,), (4,)}
    assert all(abs(c - 1000) < 150 for c in counts.values()), counts  # binomial(2000, 1/2): sd 22


def test_three_failures_keep_two_uniformly():
    """3 failures of 8: k_f = 2; every pair of failures is kept with probability 1/3."""
    group = list(EIGHT)
    group[7] = _r(0.0, ("ok",), 7)  # failures 1, 4, 7; successes 0, 2, 3, 5, 6 -> k_s = 2: {0, 6}
    pairs = Counter()
    for seed in range(3000):
        kept = downsample(group, 4, random.Random(seed), Options())
        assert [i for i in kept if i not in (1, 4, 7)] == [0, 6]
        pairs[tuple(i for i in kept if i in (1, 4, 7))] += 1
    assert set(pairs) == {(1, 4), (1, 7), (4, 7)}
    assert all(abs(c - 1000) < 150 for c in pairs.values()), pairs


def _ctrl(n=4, **opts):
    cfg = load_config(
        overrides=["control.name=roc", "control.prompts_per_step=2", f"control.rollouts_per_prompt={n}"]
    ).control
    return RoC([Prompt(f"p{i}", "t", "x", None) for i in range(5)], cfg, Options(**opts), seed=3)


def test_plan_oversamples_and_finish_batch_downsamples():
    ctrl = _ctrl()
    st = RunState()
    plan = ctrl.plan(ctrl.select(st), st)
    assert [r.n for r in plan.requests] == [8, 8] and ctrl.budget == 16
    mixed = Group(Prompt("p0", "t", "x", None), tuple(EIGHT))
    equal = Group(Prompt("p1", "t", "x", None), tuple(_r(1.0, (), k) for k in range(8)))
    kept, dropped = apply_filters([], [mixed, equal], controller=ctrl)
    assert dropped == Counter({"roc_all_equal": 1}) and len(kept) == 1
    rows = kept[0].rollouts
    assert len(rows) == 4 and [EIGHT.index(r) for r in rows if r.reward == 1.0] == [0, 2, 6]
    assert ctrl.metrics["control/roc_dropped_rollouts"] == 4.0
    assert ctrl.metrics["control/roc_kept_success_penalty"] == pytest.approx(0.5 / 3)
    # the same group gives the same draw (resume, plans drawn ahead); state is uniform's
    again, _ = apply_filters([], [mixed], controller=_ctrl())
    assert again[0].rollouts == rows
    assert group_rng(3, mixed).random() == group_rng(3, mixed).random()
    assert set(ctrl.state_dict()) == {"stream", "history"}


def test_a_small_group_is_kept_whole_and_drop_equal_is_optional():
    ctrl = _ctrl(drop_equal=False)
    small = Group(Prompt("p0", "t", "x", None), tuple(EIGHT[:3]))
    equal = Group(Prompt("p1", "t", "x", None), tuple(_r(0.0, (), k) for k in range(8)))
    kept, dropped = apply_filters([], [small, equal], controller=ctrl)
    assert kept[0] is small and len(kept[1].rollouts) == 4 and not dropped


def test_single_turn_rollouts_rank_as_ties_by_index():
    """No episode: every success has p_err = no_tool_penalty, so the first successes are kept."""
    rows = [Rollout("p", (1,), (i,), (-0.1,), "stop", 0, verdict=Verdict(float(i % 2))) for i in range(8)]
    kept = downsample(rows, 4, random.Random(0), Options())
    assert [i for i in kept if i % 2] == [1, 3]


def test_registered_and_refused_with_dynamic_sampling():
    from rollwise.registry import UserError

    assert REGISTRY.get("roc") is RoC
    for info in Options.model_fields.values():
        assert info.description
    load_config(overrides=["control.name=roc"])
    with pytest.raises(UserError):
        load_config(
            overrides=["control.name=roc", "control.dynamic_sampling.enabled=true", 'filter.names=["zero_variance"]']
        )
