"""rollwise's own controller v3 (control/wise3.py, issue #43 item 4): the levers composed, each
switchable. Defining properties: every lever off is uniform (same prompts, same plans); the skip
refills, so a step keeps prompts_per_step x G rollouts, and what it skips are the prompts predicted
degenerate (GRESO's streaks, or the value prior's p^G + (1-p)^G); allocation is DARS's top-up
scaled back to the step's total; reuse generates (1 - reuse) of the prompts and rollout replay
fills the batch back to prompts_per_step groups."""

import json
from collections import Counter

import pytest

import rollwise
from conftest import as_sets, scripted_arithmetic, tiny_overrides
from rollwise.config import load_config
from rollwise.control import REGISTRY
from rollwise.control.uniform import Uniform
from rollwise.control.wise3 import Wise3, Wise3Options, fresh_prompts
from rollwise.registry import UserError
from rollwise.types import Group, Prompt, Rollout, RunState, Services, Verdict


def _prompts(n):
    return [Prompt(f"p{i}", "t", f"{i}+{i}=", str(2 * i)) for i in range(n)]


def _rollouts(pid, scores):
    return tuple(Rollout(pid, (1,), (2, 3), (-1.0, -1.0), "stop", 0, "", Verdict(s)) for s in scores)


def _cfg(b=2, g=4):
    return load_config(overrides=[f"control.prompts_per_step={b}", f"control.rollouts_per_prompt={g}"]).control


def _wise3(options=None, n=8, b=2, g=4):
    return Wise3(_prompts(n), _cfg(b, g), Wise3Options(**(options or {})), seed=0)


class FakeValue:
    """Predicted pass rate per prompt id (the predictor's interface: ``predict(prompts, version)``)."""

    def __init__(self, rates):
        self.rates = rates

    def predict(self, prompts, version):
        return {p.id: self.rates[p.id] for p in prompts}


def _record(ctrl, scores_by_id, step=0):
    ctrl.history.record(
        [Group(p, _rollouts(p.id, scores_by_id[p.id])) for p in _prompts(8) if p.id in scores_by_id], step
    )


def test_registered():
    assert REGISTRY.get("wise3") is Wise3


def test_every_lever_off_is_uniform():
    off = {"skip": "off", "allocate": False, "reuse": 0.0}
    a, u = _wise3(off), Uniform(_prompts(8), _cfg(), None, seed=0)
    for step in range(6):  # over an epoch boundary (8 prompts, 2 a step)
        st = RunState(step=step)
        pa, pu = a.plan(a.select(st), st), u.plan(u.select(st), st)
        assert [(r.prompt.id, r.n) for r in pa.requests] == [(r.prompt.id, r.n) for r in pu.requests]
        groups = [Group(r.prompt, _rollouts(r.prompt.id, [1.0] * r.n)) for r in pa.requests]
        a.observe(groups, st), u.observe(groups, st)


def test_history_skip_refills_the_step_with_prompts_without_a_streak():
    # p0..p5 solved at their last visit, p6, p7 mixed; p_easy tiny and no floor: a one-visit
    # all-correct streak is skipped with probability 1 - max(1e-9, 0) = 1. Two prompts a step:
    # whatever the stream order, the step is p6 and p7 (each looked-at solved prompt is refilled),
    # 2 x 4 = 8 rollouts as uniform's.
    c = _wise3({"p_easy": 1e-9, "keep_floor": 0.0, "oversample": 4.0})
    _record(c, {**{f"p{i}": [1.0] * 4 for i in range(6)}, "p6": [1.0, 0.0] * 2, "p7": [0.0, 1.0] * 2})
    st = RunState(step=1)
    plan = c.plan(c.select(st), st)
    assert sorted(r.prompt.id for r in plan.requests) == ["p6", "p7"]
    assert sum(r.n for r in plan.requests) == 2 * 4
    assert c.metrics["control/wise3_skipped"] == c.metrics["control/wise3_candidates"] - 2
    assert c.metrics["control/wise3_left_out"] == c.metrics["control/wise3_skipped"]


def test_skip_keeps_the_step_full_from_the_first_skipped_when_all_are_degenerate():
    # every prompt all-wrong last time, p_hard tiny, no floor: all 2 x 3 = 6 candidates are skipped
    # and the first two in stream order fill the step (the step never shrinks)
    c = _wise3({"p_hard": 1e-9, "keep_floor": 0.0, "oversample": 3.0})
    _record(c, {f"p{i}": [0.0] * 4 for i in range(8)})
    order = [p.id for p in Uniform(_prompts(8), _cfg(), None, seed=0).select(RunState(step=0))]
    st = RunState(step=1)
    chosen = c.select(st)
    assert [p.id for p in chosen] == order[:2]
    assert c.metrics == {"control/wise3_candidates": 6.0, "control/wise3_skipped": 6.0, "control/wise3_left_out": 4.0}
    assert sum(r.n for r in c.plan(chosen, st).requests) == 8


def test_history_skip_probability_is_grescos():
    # one all-correct visit, p_easy 0.5, floor 0: skipped with probability 1 - 0.5 = 0.5; a prompt
    # never seen is never skipped
    c = _wise3({"p_easy": 0.5, "keep_floor": 0.0})
    _record(c, {"p0": [1.0, 1.0]})
    ps = _prompts(2)
    draws = Counter(tuple(c.skipped(ps, RunState(step=1))) for _ in range(4000))
    assert set(draws) == {(True, False), (False, False)}
    assert draws[(True, False)] / 4000 == pytest.approx(0.5, abs=0.03)


def test_value_skip_skips_the_predicted_degenerate_ones():
    # G = 4: p 0.99 -> 0.99^4 + 0.01^4 = 0.9606 >= 0.8 (skipped); p 0.5 -> 2 x 0.0625 = 0.125 (kept);
    # p 0.05 -> 0.8145 + 6e-6 >= 0.8 (skipped); p 0.1 -> 0.6561 + 1e-4 = 0.6562 < 0.8 (kept)
    rates = {"p0": 0.99, "p1": 0.5, "p2": 0.05, "p3": 0.1, "p4": 0.99, "p5": 0.99, "p6": 0.99, "p7": 0.99}
    c = _wise3({"skip": "value", "skip_above": 0.8, "keep_floor": 0.0, "oversample": 4.0})
    c.bind(Services(value=FakeValue(rates)))
    chosen = c.select(RunState(step=0))
    assert sorted(p.id for p in chosen) == ["p1", "p3"]


def test_value_skip_needs_the_predictor():
    with pytest.raises(UserError, match="control.options.skip = 'value'"):
        load_config(overrides=['control.name="wise3"', 'control.options={skip = "value"}'])
    load_config(overrides=['control.name="wise3"', 'control.options={skip = "value"}', "value.enabled=true"])


def test_allocate_is_dars_top_up_scaled_to_the_step_total():
    # G 8, 4 prompts a step (32 rollouts). p0 solved 1 of 8 last time: DARS et, mean-only
    # advantages: s = 2 x 0.125 x 0.875 = 0.21875, A_peak = 4, dN = ceil(4 / 0.21875 - 8) = 11,
    # capped at n_max - G = 8 -> 16. p1 solved 4 of 8 (p_hat 0.5: no top-up), p2, p3 never seen -> 8.
    # (16, 8, 8, 8) = 40 scaled to 32: 12.8, 6.4, 6.4, 6.4 -> floors 12, 6, 6, 6 (30), the two left to
    # the largest remainders, p0 (.8) then p1 (first .4) -> (13, 7, 6, 6).
    c = _wise3({"skip": "off", "allocate": True, "n_max": 16}, b=4, g=8)
    _record(c, {"p0": [1.0] + [0.0] * 7, "p1": [1.0, 0.0] * 4})
    plan = c.plan(_prompts(4), RunState(step=1))
    assert [(r.prompt.id, r.n) for r in plan.requests] == [("p0", 13), ("p1", 7), ("p2", 6), ("p3", 6)]
    assert c.metrics["control/wise3_topped_up"] == 1.0


def test_allocate_without_a_top_up_is_uniforms_plan():
    c = _wise3({"skip": "off", "allocate": True}, b=4, g=8)
    _record(c, {"p0": [1.0] * 8, "p1": [1.0, 0.0] * 4})  # p_hat 1 and 0.5: no top-up
    assert [r.n for r in c.plan(_prompts(4), RunState(step=1)).requests] == [8, 8, 8, 8]


def test_reuse_generates_the_fresh_share_only():
    assert [fresh_prompts(32, r) for r in (0.0, 0.25, 0.5)] == [32, 24, 16]
    assert fresh_prompts(1, 0.9) == 1
    c = _wise3({"skip": "off", "reuse": 0.5}, b=4, g=4)
    st = RunState(step=0)
    plan = c.plan(c.select(st), st)
    assert len(plan.requests) == 2 and sum(r.n for r in plan.requests) == 8


def test_state_round_trip_keeps_skip_draws():
    a = _wise3({"p_easy": 0.5, "keep_floor": 0.0})
    _record(a, {f"p{i}": [1.0] * 4 for i in range(4)})
    a.select(RunState(step=1))
    b = _wise3({"p_easy": 0.5, "keep_floor": 0.0})
    b.load_state_dict(a.state_dict())
    for step in range(2, 6):
        assert [p.id for p in a.select(RunState(step=step))] == [p.id for p in b.select(RunState(step=step))]


def test_preset_loads():
    cfg = load_config(path="configs/wise3.toml")
    assert cfg.control.name == "wise3" and cfg.replay.name == "rollout_replay"
    assert cfg.control.options["reuse"] == cfg.replay.options["replay_fraction"]


def test_reuse_with_rollout_replay_in_the_loop_trains_full_batches_on_half_the_generation(tmp_path):
    # 4 prompts x 4 a step, reuse 0.5: 2 prompts (8 rollouts) generated a step; from step 1 on the
    # replay buffer adds round(2 x 0.5 / 0.5) = 2 old groups, so the step trains twice what it generated
    o = tiny_overrides(
        tmp_path,
        steps=3,
        **{
            "control.name": "wise3",
            "control.options": {"skip": "off", "reuse": 0.5},
            "replay.name": "rollout_replay",
            "replay.options": {"replay_fraction": 0.5},
            "eval.at_start": False,
            "model.warm_start.steps": 0,
            "eval.n_prompts": 2,
        },
    )
    result = rollwise.train(
        load_config(overrides=as_sets(o)), backend=scripted_arithmetic(lambda i: i % 2 == 0), log=lambda m: None
    )
    lines = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    rollouts = [m["cost/rollouts"] for m in lines]
    assert rollouts == [8, 16, 24]  # cumulative: 8 a step, half of uniform's 16
    gen = [b["cost/generated_tokens"] - a.get("cost/generated_tokens", 0) for a, b in zip([{}] + lines, lines)]
    trained = [b["cost/trained_tokens"] - a.get("cost/trained_tokens", 0) for a, b in zip([{}] + lines, lines)]
    assert trained[0] == gen[0] and all(t > g for t, g in zip(trained[1:], gen[1:]))


def test_reuse_must_equal_the_replay_fraction():
    # 0.5 left to a replay that fills 0.25 would train 16 fresh + 5 replayed groups, not 32
    base = ['control.name="wise3"', 'control.options={skip = "off", reuse = 0.5}']
    with pytest.raises(UserError, match=r"control.options.reuse = 0.5 must equal replay.options.replay_fraction"):
        load_config(overrides=[*base, 'replay.name="rollout_replay"', "replay.options={replay_fraction = 0.25}"])
    with pytest.raises(UserError, match=r"replay.options.replay_fraction \(now unset"):  # the default is not assumed
        load_config(overrides=[*base, 'replay.name="rollout_replay"'])
    with pytest.raises(UserError, match="replay.name = 'on_policy'"):  # reuse with nothing to replay
        load_config(overrides=base)
    with pytest.raises(UserError, match="control.options.reuse = 0.0"):  # a replay the controller leaves no room for
        load_config(
            overrides=['control.name="wise3"', 'replay.name="rollout_replay"', "replay.options={replay_fraction = 0.5}"]
        )
    load_config(overrides=[*base, 'replay.name="rollout_replay"', "replay.options={replay_fraction = 0.5}"])
