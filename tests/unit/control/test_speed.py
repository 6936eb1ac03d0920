"""SPEED-RL (control/speed.py, docs/specs/selection.md §2): the §2.6 properties worked by hand
(acceptance, cost, group invariants, carry-over, batch size), one Plan with continuations and
screens, the budget, the state round trip, and the real loop with a scripted backend."""

import json

import pytest

import rollwise
from conftest import as_sets, scripted_arithmetic, tiny_overrides
from rollwise.config import load_config
from rollwise.control import REGISTRY
from rollwise.control.speed import (
    GROUP_SIZE_KEY,
    SPEED,
    SPEEDOptions,
    accepted,
    complete_filter,
    continue_count,
    mixed_probability,
    speed_cost,
)
from rollwise.registry import UserError
from rollwise.types import Group, Prompt, Rollout, RunState, Verdict


def _prompts(n):
    return [Prompt(f"p{i}", "t", f"{i}", "0") for i in range(n)]


def _rollouts(pid, scores):
    return tuple(Rollout(pid, (1,), (2, 3), (-1.0, -1.0), "stop", 0, "", Verdict(s)) for s in scores)


def _group(prompt, scores):
    return Group(prompt, _rollouts(prompt.id, scores))


def _speed(*overrides, options=None, prompts=40):
    cfg = load_config(overrides=["control.prompts_per_step=4", "control.rollouts_per_prompt=6", *overrides]).control
    return SPEED(_prompts(prompts), cfg, SPEEDOptions(**{"n_init": 2, **(options or {})}), seed=0)


def _generate(plan, groups, scores):
    """Merge the plan's rollouts into ``groups`` as the worker pool does; ``scores(request)`` gives
    the request's reward list."""
    merged = {g.prompt.id: g for g in groups}
    for req in plan.requests:
        s = scores(req)
        assert len(s) == req.n
        g = merged.get(req.prompt.id) or Group(req.prompt, ())
        merged[req.prompt.id] = Group(g.prompt, g.rollouts + _rollouts(req.prompt.id, s))
    return list(merged.values())


def _step(ctrl, step, scores):
    """One step of rounds; returns (groups, the plans' totals)."""
    st = RunState(step=step)
    plan = ctrl.plan(ctrl.select(st), st)
    groups, totals = [], []
    while plan:
        totals.append(plan.total)
        groups = _generate(plan, groups, scores)
        plan = ctrl.next_round(groups, st)
    ctrl.observe(groups, st)
    return groups, totals


# ------------------------------------------------------------------ §2.6 acceptance and cost


def test_acceptance_with_four_screening_rollouts():
    p = _prompts(1)[0]
    for k in range(5):
        assert accepted(_group(p, [1] * k + [0] * (4 - k))) == (k in (1, 2, 3))
    assert not accepted(_group(p, [1]))  # fewer than two verified rewards: no variance to see
    # q_4(p) = 1 - p^4 - (1 - p)^4: 1 - 1/16 - 1/16 = 0.875; 1 - 0.0001 - 0.6561 = 0.3438;
    # 1 - 0.00390625 - 0.31640625 = 0.6797
    assert mixed_probability(0.5, 4) == 0.875
    assert mixed_probability(0.1, 4) == pytest.approx(0.3438) == mixed_probability(0.9, 4)
    assert mixed_probability(0.25, 4) == pytest.approx(0.6797, abs=1e-4)


def test_worked_cost_of_the_spec():
    # half the pool at p = 0 (q = 0), half at p = 0.5 (q_4 = 0.875): q = 0.4375
    q = 0.5 * mixed_probability(0.0, 4) + 0.5 * mixed_probability(0.5, 4)
    assert q == 0.4375
    assert speed_cost(q, 4, 20) == pytest.approx(4 / 0.4375 + 20) == pytest.approx(29.14, abs=0.01)
    # DAPO with G = 24 pays 24 / q_24 (q_24 = 0.5 (1 - 2 / 2^24) ~ 0.5): ~ 48; RLOO N = 24 pays 24 per
    # prompt of which half are useful: 48 per useful prompt
    q24 = 0.5 * mixed_probability(0.0, 24) + 0.5 * mixed_probability(0.5, 24)
    assert 24 / q24 == pytest.approx(48, abs=1e-4)


# ------------------------------------------------------------------ §2.6 carry-over


def test_carry_over_to_a_multiple_of_the_gpus():
    assert continue_count(16, 10, 4) == 8  # 10 accepted on 4 GPUs: 8 now, 2 wait
    assert continue_count(2, 10, 4) == 2  # only 2 needed: never rounded down to 0
    assert continue_count(16, 3, 4) == 3 and continue_count(5, 10, 1) == 5
    # in the controller: B = 16, 4 + 20, 10 of the first 12 screens accepted
    c = _speed(
        "control.prompts_per_step=16",
        "control.rollouts_per_prompt=24",
        options={"n_init": 4, "continue_multiple": 4, "screen_prompts": 12},
    )
    st = RunState()
    plan = c.plan(c.select(st), st)
    assert plan.total == 12 * 4
    groups = _generate(plan, [], lambda r: [1, 0, 0, 0] if int(r.prompt.id[1:]) % 6 else [1, 1, 1, 1])
    plan2 = c.next_round(groups, st)
    cont = [r for r in plan2.requests if r.n == 20]
    assert len(cont) == 8 and sum(r.n for r in cont) == 160  # 8 x 5 copies x 4 in the code
    assert len(c._pending) == 2  # carried to the next call
    groups = _generate(plan2, groups, lambda r: [1, 0] * (r.n // 2))
    plan3 = c.next_round(groups, st)
    assert [r.prompt.id for r in plan3.requests if r.n == 20][:2] == c._continued[8:10]


# ------------------------------------------------------------------ one Plan: continue + screen


def test_continuation_and_next_screening_share_one_plan():
    c = _speed()  # B = 4, n_init 2, n_cont 4, screens of 4
    st = RunState()
    first = c.select(st)
    plan = c.plan(first, st)
    assert [r.n for r in plan.requests] == [2] * 4
    assert all(r.prompt.metadata[GROUP_SIZE_KEY] == 6 for r in plan.requests)
    # p0, p1 mixed; the others all wrong -> 2 accepted, 2 more needed -> screen 4 new in the same plan
    mixed = {first[0].id, first[1].id}
    groups = _generate(plan, [], lambda r: [1, 0] if r.prompt.id in mixed else [0, 0])
    plan2 = c.next_round(groups, st)
    assert [(r.prompt.id, r.n) for r in plan2.requests[:2]] == [(first[0].id, 4), (first[1].id, 4)]
    screens = plan2.requests[2:]
    assert [r.n for r in screens] == [2] * 4 and not {r.prompt.id for r in screens} & {p.id for p in first}


# ------------------------------------------------------------------ §2.6 group invariants and batch size


def _scores_by_call(start=0):
    """Rewards from a shared call counter (from ``start``): call i is right iff i % 3 == 0 in
    alternating blocks of 7 calls, so screens are a mix of accepted and rejected."""
    calls = {"i": start}

    def scores(req):
        out = []
        for _ in range(req.n):
            i = calls["i"]
            calls["i"] += 1
            out.append(1.0 if (i % 3 == 0 and (i // 7) % 2 == 0) else 0.0)
        return out

    return scores


def test_every_trained_group_is_finished_and_mixed_and_a_step_trains_exactly_b():
    c = _speed(options={"screen_prompts": 6})  # B = 4, 2 + 4 = 6
    scores = _scores_by_call()
    surplus_total = 0
    for step in range(8):
        queued = list(c.queue)
        groups, totals = _step(c, step, scores)
        if queued:  # last step's surplus is screened first
            assert [g.prompt.id for g in groups[: len(queued)]] == queued
        kept = [g for g in groups if complete_filter(g).keep]
        assert len(kept) == 4  # exactly B
        for g in kept:
            k = sum(r.reward for r in g.rollouts)
            assert g.size == 6 and 1 <= k <= 5  # never ZV
        reasons = [complete_filter(g).reason for g in groups if not complete_filter(g).keep]
        assert reasons.count("speed_unfinished") == c.metrics["control/speed_surplus"] == len(c.queue)
        assert reasons.count("speed_rejected") == c.metrics["control/speed_rejected"]
        m = c.metrics
        assert m["control/speed_screen_rollouts"] == 2 * m["control/speed_screened"] == 2 * len(groups)
        # every group was screened (2 each), exactly B = 4 were continued (4 each)
        assert (
            sum(totals) == m["control/speed_screen_rollouts"] + m["control/speed_cont_rollouts"] == 2 * len(groups) + 16
        )
        surplus_total += m["control/speed_surplus"]
    assert surplus_total > 0  # the carry-over path was exercised


def test_complete_filter_reasons():
    p = _prompts(1)[0]
    tagged = Prompt("q", "t", "1", "0", metadata={GROUP_SIZE_KEY: 6})
    assert complete_filter(_group(p, [0, 0])).keep  # not a SPEED group
    assert complete_filter(_group(tagged, [1, 0, 1, 0, 0, 0])).keep
    assert complete_filter(_group(tagged, [0, 0])).reason == "speed_rejected"
    assert complete_filter(_group(tagged, [1, 0])).reason == "speed_unfinished"


# ------------------------------------------------------------------ stopping and budget


def test_max_calls_last_round_only_continues():
    c = _speed(options={"max_calls": 2})
    st = RunState()
    plan = c.plan(c.select(st), st)
    first = [r.prompt.id for r in plan.requests]
    groups = _generate(plan, [], lambda r: [1, 0] if r.prompt.id == first[0] else [0, 0])
    plan2 = c.next_round(groups, st)
    assert [(r.prompt.id, r.n) for r in plan2.requests] == [(first[0], 4)]  # no screening in the last call
    groups = _generate(plan2, groups, lambda r: [1] * r.n)
    assert not c.next_round(groups, st)


def test_budget_continues_whole_groups_first_and_never_overspends():
    # budget 20: screens 4 x 2 = 8 (left 12); all accepted: continue min(4, 12 // 4) = 3 (left 0),
    # the 4th is surplus; no screening (nothing left)
    c = _speed("control.budget_rollouts=20")
    groups, totals = _step(c, 0, lambda r: [1, 0] * (r.n // 2))
    assert totals == [8, 12] and sum(totals) <= 20
    assert c.metrics["control/speed_surplus"] == 1 and len(c.queue) == 1
    assert sum(complete_filter(g).keep for g in groups) == 3
    assert _speed().budget == 50 * 4 * 2 + 4 * 4  # default: max_calls x screens x n_init + B x n_cont


def test_budget_below_one_full_group_screens_nothing():
    c = _speed("control.budget_rollouts=5")
    st = RunState()
    assert not c.plan(c.select(st), st)  # 5 < 2 + 4
    assert len(c.queue) == 4  # the drawn prompts wait for the next step


# ------------------------------------------------------------------ state, options


def test_state_round_trip_continues_identically():
    a = _speed(options={"screen_prompts": 6}, prompts=15)
    sa = _scores_by_call()
    for s in range(2):
        _step(a, s, sa)
    assert a.queue == ["p1"]  # step 1 accepted one prompt more than it needed
    saved = json.loads(json.dumps(a.state_dict()))
    b = _speed(options={"screen_prompts": 6}, prompts=15)
    b.load_state_dict(saved)
    assert b.queue == a.queue and b.history.records == a.history.records
    # b's rewards continue from the call a has reached (all of a's rollouts are in its history)
    sb = _scores_by_call(start=sum(r.rollouts for recs in a.history.records.values() for r in recs))
    for s in range(2, 7):
        ga, _ = _step(a, s, sa)
        gb, _ = _step(b, s, sb)
        assert [(g.prompt.id, g.size) for g in ga] == [(g.prompt.id, g.size) for g in gb]
        assert a.metrics == b.metrics


def test_registry_and_options():
    assert REGISTRY.get("speed") is SPEED
    for name, info in SPEEDOptions.model_fields.items():
        assert info.description, name
    with pytest.raises(UserError, match="n_init"):
        load_config(overrides=['control.name="speed"', "control.options={n_init = 1}"])
    cfg = load_config(overrides=["control.rollouts_per_prompt=4"]).control
    with pytest.raises(UserError, match="must exceed"):
        SPEED(_prompts(4), cfg, SPEEDOptions(n_init=4), seed=0)
    cfg = load_config(overrides=["control.dynamic_sampling.enabled=true", 'filter.names=["zero_variance"]']).control
    with pytest.raises(UserError, match="dynamic_sampling"):
        SPEED(_prompts(4), cfg, None, seed=0)
    c = _speed(options={"n_cont": 10})
    assert (c.n_init, c.n_cont, c.group_size, c.screen_prompts) == (2, 10, 12, 4)


# ------------------------------------------------------------------ the real loop


def test_loop_screens_continues_and_trains_exactly_b_finished_groups(tmp_path, trainer_batches):
    # B = 4, n_init 2 + n_cont 2. Round 1 screens 4 prompts (calls 0-7; right at 0 and 2):
    # screens 1-2 are [R, W] (accepted), 3-4 [W, W] (rejected). Round 2: continue the 2 accepted
    # (calls 8-11) + screen 4 new (calls 12-19), every other call right from 8 on: all 4 accepted,
    # 2 needed. Round 3: continue 2 (calls 20-23); 2 surplus. Rollouts 8 + (4 + 8) + 4 = 24.
    schedule = lambda i: i in (0, 2) if i < 8 else i % 2 == 0  # noqa: E731
    o = tiny_overrides(
        tmp_path,
        steps=1,
        **{
            "control.name": "speed",
            "control.options": {"n_init": 2},
            "filter.names": ["speed_complete"],
            "eval.at_start": False,
            "model.warm_start.steps": 0,
            "eval.n_prompts": 2,
        },
    )
    result = rollwise.train(
        load_config(overrides=as_sets(o)), backend=scripted_arithmetic(schedule), log=lambda m: None
    )
    m = json.loads((result.run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert m["control/rounds"] == 3 and m["control/budget_used"] == 24 == m["cost/rollouts"] == m["cost/verifier_calls"]
    assert m["control/speed_screened"] == 8 and m["control/speed_screen_rollouts"] == 16
    assert m["control/speed_accepted"] == 6 and m["control/speed_rejected"] == 2 and m["control/speed_surplus"] == 2
    assert m["filter/speed_rejected"] == 2 and m["filter/speed_unfinished"] == 2 and m["groups/count"] == 8
    assert trainer_batches == [[4, 4, 4, 4]]  # exactly B finished groups of n_init + n_cont
    assert m["cost/trained_tokens"] > 0


def test_speed_without_its_filter_is_refused_at_load():
    from rollwise.compat import check
    from rollwise.config import load_config
    from rollwise.registry import UserError

    with pytest.raises(UserError, match="speed_complete"):
        check(load_config(overrides=["control.name=speed"]))
    check(load_config(overrides=["control.name=speed", 'filter.names=["speed_complete"]']))


def test_speed_with_dynamic_sampling_is_refused_at_load():
    from rollwise.compat import check
    from rollwise.config import load_config
    from rollwise.registry import UserError

    with pytest.raises(UserError, match="dynamic_sampling"):
        check(
            load_config(
                overrides=[
                    "control.name=speed",
                    'filter.names=["speed_complete", "zero_variance"]',
                    "control.dynamic_sampling.enabled=true",
                ]
            )
        )
