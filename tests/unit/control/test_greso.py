"""GRESO (control/greso.py, docs/specs/selection.md §1): the §1.8 properties worked by hand (streaks,
skip probability, the p controller, round sizes, invariants), the rounds on hand-made groups, the
budget, the state round trip, and the real loop with dynamic sampling and a scripted backend."""

import json

import pytest

import rollwise
from conftest import as_sets, scripted_arithmetic, tiny_overrides
from rollwise.config import load_config
from rollwise.control import REGISTRY
from rollwise.control.greso import GRESO, GRESOOptions, keep_probability, round_size, skip_probability, streaks, tune
from rollwise.registry import UserError
from rollwise.types import Group, Prompt, Rollout, RunState, Verdict


def _prompts(n):
    return [Prompt(f"p{i}", "t", f"{i}", "0") for i in range(n)]


def _group(prompt, scores):
    rs = tuple(Rollout(prompt.id, (1,), (2, 3), (-1.0, -1.0), "stop", 0, "", Verdict(s)) for s in scores)
    return Group(prompt, rs)


def _greso(*overrides, options=None, prompts=20):
    cfg = load_config(overrides=["control.prompts_per_step=4", "control.rollouts_per_prompt=2", *overrides]).control
    return GRESO(_prompts(prompts), cfg, GRESOOptions(**(options or {})), seed=0)


class FixedRng:
    """Stands in for the skip RNG: ``random()`` returns the given values in turn."""

    def __init__(self, *values):
        self.values = list(values)

    def random(self):
        return self.values.pop(0)


# ------------------------------------------------------------------ §1.8 streaks


def test_streaks_of_the_spec_traces():
    # code thresholds 0.98 / 0.11 (reward scale 1 / 0.1 / 0)
    assert streaks([1.0, 0.1, 1.0, 1.0], 0.98, 0.11) == (2, 0)  # the last two are easy, 0.1 breaks it
    assert streaks([0.0, 0.1, 0.1], 0.98, 0.11) == (0, 3)  # 0 and 0.1 are both <= 0.11
    assert streaks([0.1, 0.1, 0.5], 0.98, 0.11) == (0, 0)  # the last record is neither
    assert streaks([], 0.98, 0.11) == (0, 0)
    # binary defaults 1 / 0: one success out of n is not "hard"
    assert streaks([0.0, 0.0, 0.125]) == (0, 0) and streaks([0.5, 0.0, 0.0]) == (0, 2)
    assert streaks([0.0, 1.0, 1.0, 1.0]) == (3, 0)


def test_streaks_come_from_the_shared_history():
    g = _greso()
    p = _prompts(1)[0]
    for step, scores in enumerate([[1, 0], [0, 0], [0, 0]]):  # means 0.5, 0, 0
        g.history.record([_group(p, scores)], step)
    assert g.streaks("p0") == (0, 2) and g.streaks("unseen") == (0, 0)


# ------------------------------------------------------------------ §1.8 skip probability


def test_skip_probability_table():
    # p = 0.5: keep 0.5^z -> skip 0.5, 0.75, 0.875; 0.5^6 = 0.015625 -> 0.984375;
    # 0.5^7 = 0.0078 < 0.01 -> the floor: skip 0.99 for every z >= 7
    assert skip_probability(0.5, 1) == 0.5 and skip_probability(0.5, 2) == 0.75 and skip_probability(0.5, 3) == 0.875
    assert skip_probability(0.5, 6) == pytest.approx(0.984375)
    for z in range(7, 40):
        assert skip_probability(0.5, z) == pytest.approx(0.99)
    for p in (0.05, 0.3, 0.5, 0.95, 1.0):
        assert skip_probability(p, 0) == 0.0  # z = 0 is never skipped
        for z in range(0, 60):
            assert keep_probability(p, z) >= 0.01


def test_skip_decisions_at_the_probability_boundary():
    g = _greso()
    p = _prompts(1)[0]
    for step in range(2):  # z_easy = 2 -> P_easy = 0.75
        g.history.record([_group(p, [1, 1])], step)
    g.rng = FixedRng(0.74)
    assert g.skip("p0") == "easy"
    g.rng = FixedRng(0.76, 0.0)  # kept by the easy test; z_hard = 0 draws nothing (0.0 stays unused)
    assert g.skip("p0") is None and g.rng.values == [0.0]
    for step in range(2, 22):  # now 20 all-wrong visits: z_hard = 20, p_hard 0.5 -> the floor, P_hard = 0.99
        g.history.record([_group(p, [0, 0])], step)
    g.rng = FixedRng(0.9899)
    assert g.skip("p0") == "hard"
    g.rng = FixedRng(0.9901)
    assert g.skip("p0") is None


def test_a_prompt_without_history_is_never_skipped():
    g = _greso(options={"p_easy": 0.05, "p_hard": 0.05})
    g.rng = FixedRng()  # any draw would fail: none may happen
    chosen = g.select(RunState())
    assert len(chosen) == g.s_max == 6  # ceil(1.5 * 4)
    assert g._count == {"candidates": 6, "skipped_easy": 0, "skipped_hard": 0}


def test_streaky_prompts_are_skipped_and_a_round_looks_at_one_pass_at_most():
    g = _greso(prompts=10)
    for p in _prompts(10)[:5]:  # p0..p4 were all correct 10 times: P_easy = 1 - max(0.5^10, 0.01) = 0.99
        for step in range(10):
            g.history.record([_group(p, [1, 1])], step)
    g.rng = FixedRng(*[0.5] * 5)  # one draw per streaky candidate, each 0.5 < 0.99: skipped
    chosen = g.select(RunState())
    # S_max = 6 wanted, but one pass over the 10 prompts holds only the 5 without a streak
    assert sorted(p.id for p in chosen) == [f"p{i}" for i in range(5, 10)]
    assert g._count == {"candidates": 10, "skipped_easy": 5, "skipped_hard": 0} and g.rng.values == []
    g.rng = FixedRng(0.995)  # above 0.99: the exploration floor keeps it
    assert g.skip("p0") is None


# ------------------------------------------------------------------ §1.8 controller


def test_tune_steps_and_bounds():
    # hard target 2 * 0.25 / 3 = 0.1667: r_hard 0.20 >= it -> 0.50 - 0.01
    assert tune(0.50, 0.20, 2 * 0.25 / 3) == 0.49
    # easy target 0.25 / 3 = 0.0833: r_easy 0.05 < it -> 0.50 + 0.01
    assert tune(0.50, 0.05, 0.25 / 3) == 0.51
    assert tune(0.05, 0.9, 0.1) == 0.05 and tune(0.95, 0.0, 0.1) == 0.95  # stays put at the bounds
    p = 0.5
    for _ in range(100):
        p = tune(p, 1.0, 0.1)
    assert p == 0.05  # no float drift below the bound


def _observed(g, scores_list, step=0):
    groups = [_group(p, s) for p, s in zip(_prompts(len(scores_list)), scores_list)]
    g.observe(groups, RunState(step=step))


def test_controller_waits_for_epoch_one_then_moves_both_probabilities():
    # 10 groups: 2 all correct (r_easy 0.2 >= 0.0833 -> p_easy down), 1 all wrong
    # (r_hard 0.1 < 0.1667 -> p_hard up), 7 mixed
    scores = [[1, 1]] * 2 + [[0, 0]] + [[1, 0]] * 7
    g = _greso()
    _observed(g, scores)
    assert (g.p_easy, g.p_hard) == (0.5, 0.5)  # epoch 0: no update
    assert g.metrics["control/greso_r_easy"] == 0.2 and g.metrics["control/greso_r_hard"] == 0.1
    g.stream.epoch = 1
    _observed(g, scores, step=1)
    assert (g.p_easy, g.p_hard) == (0.49, 0.51)
    assert g.metrics["control/greso_p_easy"] == 0.49 and g.metrics["control/greso_zv_frac"] == 0.3


# ------------------------------------------------------------------ §1.8 round size


def test_round_size_of_the_spec():
    # B = 256, n = 8, S_max 384, S_min 64
    assert round_size(128, 256, 8, 0.6, 384, 64) == (384, False)  # int(1024 / 0.4 / 8 * 1.25) = 400 > 384
    assert round_size(224, 256, 8, 0.5, 384, 64) == (80, True)  # int(256 / 0.5 / 8 * 1.25) = 80
    assert round_size(250, 256, 8, 0.5, 384, 64) == (64, True)  # int(48 / 0.5 / 8 * 1.25) = 15 -> 64
    # zeta = 1 is clamped to 0.95: int(256 / 0.05 / 8 * 1.25) = 800 -> 384, not last
    assert round_size(224, 256, 8, 1.0, 384, 64) == (384, False)


# ------------------------------------------------------------------ rounds on hand-made groups


def _run_round(g, plan, groups, scores):
    """Generate ``plan`` with the given score lists (one per request), merged as the pool does."""
    by_id = {x.prompt.id: x for x in groups}
    for req, s in zip(plan.requests, scores):
        assert req.n == len(s)
        by_id[req.prompt.id] = _group(req.prompt, s)
    return list(by_id.values())


def test_rounds_stop_when_the_pool_is_full():
    g = _greso()  # B = 4, n = 2, S_max = 6
    plan = g.plan(g.select(RunState()), RunState())
    assert plan.total == 6 * 2
    groups = _run_round(g, plan, [], [[1, 0]] * 4 + [[0, 0]] * 2)  # pool 4 >= B
    assert not g.next_round(groups, RunState()) and g.stream.take(3) == []  # closed for DS's refill


def test_adaptive_round_then_last_round():
    g = _greso()
    plan = g.plan(g.select(RunState()), RunState())
    first = {r.prompt.id for r in plan.requests}
    # round 1: 3 mixed, 3 ZV -> pool 3, zeta 0.5: int(1 * 2 / 0.5 / 2 * 1.25) = 2 <= 6 -> last, S = 2
    groups = _run_round(g, plan, [], [[1, 0]] * 3 + [[1, 1]] * 3)
    plan2 = g.next_round(groups, RunState())
    assert [r.n for r in plan2.requests] == [2, 2]
    assert not {r.prompt.id for r in plan2.requests} & first
    groups = _run_round(g, plan2, groups, [[0, 0], [0, 0]])
    assert not g.next_round(groups, RunState())  # after the last round: train on the 3 it has
    # history: exactly one record per rolled-out prompt
    g.observe(groups, RunState())
    assert len(groups) == 8 and all(len(g.history.of(x.prompt.id)) == 1 for x in groups)
    assert sum(len(v) for v in g.history.records.values()) == 8
    assert g.metrics["control/greso_pool"] == 3 and g.metrics["control/greso_zv_frac"] == 5 / 8


def test_rounds_stop_at_max_rounds():
    g = _greso("control.dynamic_sampling.max_rounds=2")
    plan = g.plan(g.select(RunState()), RunState())
    groups = _run_round(g, plan, [], [[0, 0]] * 6)  # zeta 1 -> 0.95: int(8 / 0.05 / 2 * 1.25) = 100 -> 6
    plan2 = g.next_round(groups, RunState())
    assert plan2.total == 12
    groups = _run_round(g, plan2, groups, [[0, 0]] * 6)
    assert not g.next_round(groups, RunState())  # 2 rounds of 2 run, pool still 0


def test_budget_caps_every_round():
    g = _greso("control.budget_rollouts=10")
    plan = g.plan(g.select(RunState()), RunState())
    assert [r.n for r in plan.requests] == [2] * 5  # 6 prompts x 2 = 12 trimmed to 10
    groups = _run_round(g, plan, [], [[0, 0]] * 5)
    assert not g.next_round(groups, RunState())  # nothing left of the budget
    assert _greso().budget == 4 * 6 * 2  # default: max_rounds x S_max x n, never binds


# ------------------------------------------------------------------ state


def _fake_step(g, step, reward):
    """One step of rounds; ``reward(i, step)`` is the constant reward of prompt ``p<i>``'s group,
    except that prompts with i % 5 == 0 get mixed groups. Returns every group's (prompt id, size)
    in order and the probabilities after the step."""

    def scores(req):
        i = int(req.prompt.id[1:])
        return [1, 0] if i % 5 == 0 else [reward(i, step)] * req.n

    st = RunState(step=step)
    plan = g.plan(g.select(st), st)
    groups = []
    while plan:
        groups = _run_round(g, plan, groups, [scores(r) for r in plan.requests])
        plan = g.next_round(groups, st)
    g.observe(groups, st)
    return [(x.prompt.id, x.size) for x in groups], (g.p_easy, g.p_hard)


def test_state_round_trip_continues_identically():
    reward = lambda i, step: (i + step // 3) % 2  # noqa: E731  mostly ZV groups, prompts i % 5 == 0 mixed
    a = _greso(options={"tune_from_epoch": 0}, prompts=12)
    for s in range(4):
        _fake_step(a, s, reward)
    assert (a.p_easy, a.p_hard) != (0.5, 0.5)
    saved = json.loads(json.dumps(a.state_dict()))  # plain data, as in a checkpoint
    b = _greso(options={"tune_from_epoch": 0}, prompts=12)
    b.load_state_dict(saved)
    assert b.history.records == a.history.records and (b.p_easy, b.p_hard) == (a.p_easy, a.p_hard)
    skipped = 0
    for s in range(4, 10):
        assert _fake_step(a, s, reward) == _fake_step(b, s, reward)
        assert a.metrics == b.metrics
        skipped += a.metrics["control/greso_skipped_easy"] + a.metrics["control/greso_skipped_hard"]
    assert skipped > 0  # the restored streaks and skip RNG were exercised


def test_registry_and_options():
    assert REGISTRY.get("greso") is GRESO
    with pytest.raises(UserError, match="p_min"):
        load_config(overrides=['control.name="greso"', "control.options={p_min = 0.9, p_max = 0.1}"])
    with pytest.raises(UserError, match="threshold"):
        load_config(overrides=['control.name="greso"', "control.options={easy_threshold = 0.1, hard_threshold = 0.5}"])
    with pytest.raises(UserError, match="nope"):
        load_config(overrides=['control.name="greso"', "control.options={nope = 1}"])
    for name, info in GRESOOptions.model_fields.items():
        assert info.description, name
    g = _greso(options={"round_prompts": 10, "min_round_prompts": 3})
    assert (g.s_max, g.s_min, g.target) == (10, 3, 4)
    g = _greso(
        "control.dynamic_sampling.enabled=true",
        "control.dynamic_sampling.target_groups=8",
        'filter.names=["zero_variance"]',
    )
    assert (g.target, g.s_max, g.s_min) == (8, 12, 2)  # B from target_groups


# ------------------------------------------------------------------ the real loop


def test_loop_with_dynamic_sampling_runs_greso_rounds_only(tmp_path):
    # B = 4, n = 4, S_max = 6. Round 1 (calls 0-23, request order): groups 0-2 alternate right/wrong
    # (calls 0-11), groups 3-5 all wrong -> pool 3, zeta 0.5 -> int(1 * 4 / 0.5 / 4 * 1.25) = 2,
    # last round of 2 prompts (calls 24-31, all wrong). GRESO then stops with 3 of 4 groups, and
    # dynamic sampling (max_rounds 4) must not refill: 2 rounds, 24 + 8 = 32 rollouts, all charged.
    schedule = lambda i: i < 12 and i % 2 == 0  # noqa: E731
    o = tiny_overrides(
        tmp_path,
        steps=1,
        **{
            "control.name": "greso",
            "control.dynamic_sampling.enabled": True,
            "filter.names": ["zero_variance"],
            "eval.at_start": False,
            "model.warm_start.steps": 0,
            "eval.n_prompts": 2,
        },
    )
    result = rollwise.train(
        load_config(overrides=as_sets(o)), backend=scripted_arithmetic(schedule), log=lambda m: None
    )
    m = json.loads((result.run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert m["control/rounds"] == 2 and m["control/budget_used"] == 32 == m["cost/rollouts"] == m["cost/verifier_calls"]
    assert m["groups/count"] == 8 and m["filter/all_wrong"] == 5
    assert m["control/greso_candidates"] == 8 and m["control/greso_skip_frac"] == 0
    assert m["control/greso_pool"] == 3 and m["control/greso_p_easy"] == 0.5
    assert m["cost/trained_tokens"] > 0


def test_greso_refuses_replace_sampling_at_load():
    from rollwise.compat import check
    from rollwise.config import load_config
    from rollwise.registry import UserError

    base = ["control.name=greso", "control.dynamic_sampling.enabled=true", 'filter.names=["zero_variance"]']
    check(load_config(overrides=base))
    with pytest.raises(UserError, match="replace"):
        check(load_config(overrides=[*base, "control.dynamic_sampling.type=replace"]))
