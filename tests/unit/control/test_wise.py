"""rollwise's own composed controller (control/wise.py): GRESO's skip in front of SPEED's screens.
Defining properties: a prompt never rolled out is always screened; a prompt with a degenerate
streak is skipped with GRESO's probability (always, at p = 0 and no floor); what is trained is
SPEED's (finished groups of the baseline's size, mixed screens only); the state round-trips."""

import json

import pytest

import rollwise
from conftest import as_sets, scripted_arithmetic, tiny_overrides
from rollwise.config import load_config
from rollwise.control import REGISTRY
from rollwise.control.speed import complete_filter
from rollwise.control.wise import Wise, WiseOptions
from rollwise.registry import UserError
from rollwise.types import Group, Prompt, Rollout, RunState, Verdict


def _prompts(n):
    return [Prompt(f"p{i}", "t", f"{i}", "0") for i in range(n)]


def _rollouts(pid, scores):
    return tuple(Rollout(pid, (1,), (2, 3), (-1.0, -1.0), "stop", 0, "", Verdict(s)) for s in scores)


def _wise(options=None, prompts=8):
    cfg = load_config(overrides=["control.prompts_per_step=2", "control.rollouts_per_prompt=6"]).control
    return Wise(_prompts(prompts), cfg, WiseOptions(**{"n_init": 2, **(options or {})}), seed=0)


def _step(ctrl, step, scores):
    st = RunState(step=step)
    plan = ctrl.plan(ctrl.select(st), st)
    merged, screened = {}, []
    while plan:
        for req in plan.requests:
            if req.n == ctrl.n_init:
                screened.append(req.prompt.id)
            g = merged.get(req.prompt.id) or Group(req.prompt, ())
            merged[req.prompt.id] = Group(g.prompt, g.rollouts + _rollouts(req.prompt.id, scores(req.prompt.id, req.n)))
        plan = ctrl.next_round(list(merged.values()), st)
    groups = list(merged.values())
    ctrl.observe(groups, st)
    return groups, screened


def test_registered():
    assert REGISTRY.get("wise") is Wise


def test_never_seen_prompts_are_screened_and_solved_ones_skipped():
    # p0..p3 always right (all-correct screens), p4..p7 mixed; p_easy tiny and no floor: a prompt
    # with one all-correct visit is skipped with probability 1 - 1e-6 ** 1
    solved = {f"p{i}" for i in range(4)}
    scores = lambda pid, n: [1.0] * n if pid in solved else [1.0, 0.0] * (n // 2)  # noqa: E731
    ctrl = _wise({"p_easy": 1e-6, "keep_floor": 0.0})
    seen: set[str] = set()
    for step in range(6):  # 8 prompts, several epochs
        groups, screened = _step(ctrl, step, scores)
        repeat_solved = [p for p in screened if p in solved and p in seen]
        assert not repeat_solved, f"step {step}: solved prompts screened again: {repeat_solved}"
        seen.update(screened)
        kept = [g for g in groups if complete_filter(g).keep]
        assert all(g.size == 6 and not g.is_zero_variance() for g in kept)  # SPEED's trained groups
    assert solved <= seen  # each was screened once, on its first visit
    assert ctrl.metrics["control/wise_skipped_easy"] >= 1 and ctrl.metrics["control/wise_skip_frac"] > 0


def test_skip_probability_is_grescos():
    # one all-wrong visit, p_hard 0.5, floor 0: skipped with probability 1 - 0.5 = 0.5
    ctrl = _wise({"p_hard": 0.5, "keep_floor": 0.0})
    p = _prompts(1)[0]
    ctrl.history.record([Group(p, _rollouts(p.id, [0.0, 0.0]))], 0, 0)
    skips = sum(ctrl.skip(p.id) == "hard" for _ in range(4000))
    assert skips / 4000 == pytest.approx(0.5, abs=0.03)
    assert ctrl.skip("never-seen") is None


def test_state_round_trip_keeps_skip_draws():
    scores = lambda pid, n: [1.0] * n if pid in ("p0", "p1") else [1.0, 0.0] * (n // 2)  # noqa: E731
    a = _wise()
    for step in range(3):
        _step(a, step, scores)
    b = _wise()
    b.load_state_dict(a.state_dict())
    assert [_step(a, 3 + i, scores)[1] for i in range(3)] == [_step(b, 3 + i, scores)[1] for i in range(3)]


def test_needs_speed_complete_filter():
    with pytest.raises(UserError, match="'wise' needs 'speed_complete'"):
        load_config(overrides=["control.name=wise"])


def test_runs_in_the_loop(tmp_path):
    # every call right: every screen is all-correct, so nothing is continued or trained on, and
    # from the second epoch of the 8-prompt split on, solved prompts are skipped
    o = tiny_overrides(
        tmp_path,
        steps=4,
        **{
            "control.name": "wise",
            "control.options": {"n_init": 2, "p_easy": 1e-6, "keep_floor": 0.0},
            "filter.names": ["speed_complete"],
            "task.max_train_prompts": 8,
            "eval.at_start": False,
            "model.warm_start.steps": 0,
            "eval.n_prompts": 2,
        },
    )
    result = rollwise.train(
        load_config(overrides=as_sets(o)), backend=scripted_arithmetic(lambda i: True), log=lambda m: None
    )
    lines = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 4
    screened = [m["control/speed_screened"] for m in lines]
    assert sum(screened) == 8  # each of the 8 prompts once; then all skipped
    assert [m["control/budget_used"] for m in lines] == [16, 0, 0, 0]  # 8 screens of 2 at step 0, nothing after
    assert [m["control/wise_skipped_easy"] for m in lines] == [0, 8, 8, 8]
