"""VCRL (control/vcrl.py, allocation.md §4): the normalised variance score, the ``vcrl`` filter, the
query bank (capacity, priorities, eviction), the refill round within the step budget, checkpoint
state, and a short loop run that resumes exactly."""

import json

import pytest

import rollwise
from conftest import as_sets, tiny_overrides
from rollwise.components import build_filters
from rollwise.config import load_config
from rollwise.control.vcrl import VCRL, normalized_variance, variance_filter
from rollwise.types import Group, Prompt, Rollout, RunState, Verdict


def _prompts(n):
    return [Prompt(f"p{i}", "t", f"{i}", "0") for i in range(n)]


def _group(prompt, scores):
    return Group(prompt, tuple(Rollout(prompt.id, (1,), (2,), (-1.0,), "stop", 0, "", Verdict(s)) for s in scores))


def _binary(k, g):
    return [1.0] * k + [0.0] * (g - k)


def _ctrl(*overrides, options=None, n=20):
    cfg = load_config(overrides=["control.prompts_per_step=4", "control.rollouts_per_prompt=2", *overrides]).control
    return VCRL(_prompts(n), cfg, VCRL.Options(**(options or {})), seed=0)


# ------------------------------------------------------------------ the score and the filter


@pytest.mark.parametrize("g", [2, 3, 4, 7, 8, 16])
def test_score_is_zero_for_all_equal_groups_and_symmetric(g):
    assert normalized_variance(_binary(0, g)) == 0.0 and normalized_variance(_binary(g, g)) == 0.0
    for k in range(g + 1):
        assert normalized_variance(_binary(k, g)) == pytest.approx(normalized_variance(_binary(g - k, g)))
        assert 0.0 <= normalized_variance(_binary(k, g)) <= 1.0 + 1e-12


def test_score_by_hand():
    # even G: p = 1 at k = G/2. G = 4, k = 2: s2 = 2*2/(4*3) = 1/3 = s2_max = 4/(4*3)
    assert normalized_variance(_binary(2, 4)) == pytest.approx(1.0)
    assert normalized_variance(_binary(4, 8)) == pytest.approx(1.0)
    # binary, even G: p = 4 k (G - k) / G^2. G = 8, k = 1: 28/64 = 0.4375; G = 16, k = 1: 60/256
    assert normalized_variance(_binary(1, 8)) == pytest.approx(0.4375)
    assert normalized_variance(_binary(1, 16)) == pytest.approx(60 / 256)
    # odd G: s2_max = (G+1)/(4G). G = 3, k = 1: s2 = 1*2/(3*2) = 1/3 = 4/12 -> 1
    assert normalized_variance(_binary(1, 3)) == pytest.approx(1.0)
    # G = 5, k = 1: s2 = 4/20 = 0.2, s2_max = 6/20 -> 2/3
    assert normalized_variance(_binary(1, 5)) == pytest.approx(2 / 3)
    assert normalized_variance([1.0]) == 0.0 and normalized_variance([]) == 0.0


def test_filter_keeps_exactly_the_groups_at_or_above_kappa():
    # G = 16, kappa = 0.3: p(k=1) = 0.234 < 0.3 <= p(k=2) = 4*2*14/256 = 0.4375 -> keep k = 2..14
    opts = variance_filter.Options(kappa=0.3)
    p = Prompt("a", "t", "x", "0")
    kept = [k for k in range(17) if variance_filter(_group(p, _binary(k, 16)), opts).keep]
    assert kept == list(range(2, 15))
    assert variance_filter(_group(p, _binary(0, 16)), opts).reason == "low_variance"
    # the registered filter, through the config (same kappa written in filter.options)
    cfg = load_config(overrides=['filter.names=["vcrl"]', "filter.options={vcrl = {kappa = 0.5}}"])
    ((_, f),) = build_filters(cfg)
    assert not f(_group(p, _binary(1, 8))).keep and f(_group(p, _binary(2, 8))).keep  # 0.4375 < 0.5 <= 0.75


def test_unverified_rollouts_are_left_out_of_the_score():
    p = Prompt("a", "t", "x", "0")
    assert normalized_variance([1.0, 0.0]) == 1.0
    from rollwise.control.vcrl import group_score

    assert group_score(_group(p, [1.0, 0.0, None])) == 1.0


# ------------------------------------------------------------------ the bank


def test_bank_never_exceeds_capacity_and_evicts_the_lowest_oldest():
    c = _ctrl(options={"bank_capacity": 3})
    ps = _prompts(6)
    # p: [1,1,0,0] -> 1; [1,0,0,0] -> 0.75 (G = 4)
    c.observe([_group(ps[0], [1, 1, 0, 0]), _group(ps[1], [1, 0, 0, 0]), _group(ps[2], [1, 0, 0, 0])], RunState(step=0))
    assert len(c.bank) == 3
    c.observe([_group(ps[3], [1, 1, 0, 0])], RunState(step=1))
    assert len(c.bank) == 3 and set(c.bank) == {"p0", "p2", "p3"}  # p1: lowest priority and oldest push
    for step in range(2, 6):
        c.observe([_group(p, [1, 0]) for p in ps], RunState(step=step))
        assert len(c.bank) <= 3


def test_low_variance_evicts_and_momentum_mixes_priorities():
    c = _ctrl(options={"momentum": 0.5})
    a, b = _prompts(2)
    c.observe([_group(a, [1, 1, 0, 0]), _group(b, [1, 0, 0, 0])], RunState(step=0))
    assert c.bank["p0"][0] == 1.0 and c.bank["p1"][0] == 0.75
    # revisit: p0 scores 0.75 -> 0.5 * 1 + 0.5 * 0.75 = 0.875; p1 scores 0 (< kappa) -> evicted
    c.observe([_group(a, [1, 0, 0, 0]), _group(b, [0, 0, 0, 0])], RunState(step=1))
    assert c.bank["p0"][0] == pytest.approx(0.875) and "p1" not in c.bank


def test_refill_pops_bank_queries_until_the_batch_has_b_groups():
    c = _ctrl()  # B = 4, G = 2, kappa 0.3, default budget 2 rounds * 4 * 2 = 16
    first = c.select(RunState(step=0))
    assert c.plan(first, RunState(step=0)).total == 8
    c.observe([_group(p, [1, 0]) for p in first], RunState(step=0))  # all p = 1: all banked
    assert len(c.bank) == 4 and c.budget == 16
    step1 = c.select(RunState(step=1))
    assert not {p.id for p in step1} & set(c.bank)  # a fresh epoch position, different prompts
    c.plan(step1, RunState(step=1))
    groups = [_group(step1[0], [1, 0])] + [_group(p, [0, 0]) for p in step1[1:]]  # 1 of 4 kept
    refill = c.next_round(groups, RunState(step=1))
    # 3 missing -> the 3 highest-priority queries (all p = 1: most recently pushed first), G each
    assert [r.n for r in refill.requests] == [2, 2, 2]
    assert [r.prompt.id for r in refill.requests] == [p.id for p in first][::-1][:3]
    assert len(c.bank) == 1  # popped
    groups += [_group(r.prompt, [0, 1]) for r in refill.requests]
    assert sum(variance_filter(g).keep for g in groups) == 4  # batch after refill = B
    assert not c.next_round(groups, RunState(step=1))  # max_rounds = 2
    c.observe(groups, RunState(step=1))
    assert len(c.bank) == 5  # the refilled queries came back with p = 1, plus step1[0]


def test_refill_respects_the_step_budget_and_the_bank_size():
    c = _ctrl("control.budget_rollouts=11")
    first = c.select(RunState(step=0))
    c.plan(first, RunState(step=0))
    c.observe([_group(p, [1, 0]) for p in first], RunState(step=0))
    step1 = c.select(RunState(step=1))
    plan = c.plan(step1, RunState(step=1))
    groups = [_group(p, [0, 0]) for p in step1]  # none kept: 4 missing
    refill = c.next_round(groups, RunState(step=1))
    assert plan.total + refill.total <= 11 and [r.n for r in refill.requests] == [2]  # 11 - 8 = 3 -> one whole group
    # bank smaller than the deficit: everything it has
    c2 = _ctrl(options={"max_rounds": 3})
    first = c2.select(RunState(step=0))
    c2.plan(first, RunState(step=0))
    c2.observe([_group(first[0], [1, 0])] + [_group(p, [0, 0]) for p in first[1:]], RunState(step=0))
    step1 = c2.select(RunState(step=1))
    c2.plan(step1, RunState(step=1))
    refill = c2.next_round([_group(p, [0, 0]) for p in step1], RunState(step=1))
    assert [r.prompt.id for r in refill.requests] == [first[0].id]
    assert not c2.next_round([_group(p, [0, 0]) for p in step1], RunState(step=1))  # bank empty now


def test_state_round_trips_bank_stream_and_history():
    c = _ctrl()
    for step in range(3):
        ps = c.select(RunState(step=step))
        c.plan(ps, RunState(step=step))
        c.observe([_group(p, [1, 0] if i % 2 else [1, 1]) for i, p in enumerate(ps)], RunState(step=step))
    saved = c.state_dict()
    d = VCRL(_prompts(20), c.cfg, c.opts, seed=123)
    d.load_state_dict(saved)
    assert d.bank == c.bank and d.pushes == c.pushes and d.history.records == c.history.records
    assert [p.id for p in d.select(RunState(step=3))] == [p.id for p in c.select(RunState(step=3))]
    assert d.ranked() == c.ranked()


# ------------------------------------------------------------------ the loop


def _stable(path):
    return [
        {k: v for k, v in json.loads(x).items() if k != "wall_s" and not k.startswith("time/")}
        for x in path.read_text().splitlines()
    ]


def _run(tmp_path, name, steps, resume=False):
    o = tiny_overrides(
        tmp_path,
        name=name,
        steps=steps,
        **{
            "eval.at_start": False,
            "run.threads": 1,
            "control.name": "vcrl",
            "filter.names": ["vcrl"],
            "control.options": {"kappa": 0.3, "max_rounds": 2},
        },
    )
    return rollwise.train(load_config(overrides=as_sets(o)), resume=resume, log=lambda m: None)


def test_loop_run_filters_refills_within_budget_and_resumes_exactly(tmp_path):
    full = _run(tmp_path, "full", 4)
    lines = _stable(full.run_dir / "metrics.jsonl")
    assert [m["step"] for m in lines] == [0, 1, 2, 3]
    assert all(m["control/budget_used"] <= 2 * 4 * 4 for m in lines)  # default cap: max_rounds * B * G
    assert all(m["control/rounds"] <= 2 for m in lines)
    _run(tmp_path, "resumed", 2)
    _run(tmp_path, "resumed", 4, resume=True)
    assert _stable(tmp_path / "resumed" / "metrics.jsonl") == lines
