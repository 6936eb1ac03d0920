"""Dynamic sampling (DAPO refill rounds, control/rounds.py): the wrapper on hand-made groups, and
the real loop with a scripted backend, where every round must be charged to the ledger."""

import json

import pytest

import rollwise
from conftest import as_sets, scripted_arithmetic, tiny_overrides
from rollwise.components import build_filters
from rollwise.config import load_config
from rollwise.control.rounds import DynamicSampling, count_passing, target_groups
from rollwise.control.uniform import Uniform
from rollwise.registry import UserError
from rollwise.types import Group, Prompt, Rollout, Verdict

ZV = ['filter.names=["zero_variance"]', "control.prompts_per_step=4", "control.rollouts_per_prompt=2"]


def _prompts(n):
    return [Prompt(f"p{i}", "t", f"{i}", "0") for i in range(n)]


def _group(prompt, scores):
    rs = tuple(Rollout(prompt.id, (1,), (2,), (-1.0,), "stop", 0, "", Verdict(s)) for s in scores)
    return Group(prompt, rs)


def _wrapped(*overrides):
    cfg = load_config(overrides=ZV + ["control.dynamic_sampling.enabled=true", *overrides])
    return DynamicSampling(Uniform(_prompts(20), cfg.control, None, seed=0), build_filters(cfg), cfg.control), cfg


def test_refill_asks_for_the_missing_groups_until_target():
    ds, _ = _wrapped()
    first = ds.select(None)
    plan = ds.plan(first, None)
    assert plan.total == 4 * 2
    # round 1: 1 of 4 groups has mixed rewards -> 3 missing -> 3 fresh prompts x 2 rollouts
    groups = [_group(first[0], [1, 0])] + [_group(p, [0, 0]) for p in first[1:]]
    refill = ds.next_round(groups, None)
    fresh = [r.prompt for r in refill.requests]
    assert [r.n for r in refill.requests] == [2, 2, 2]
    assert not {p.id for p in fresh} & {p.id for p in first}  # new prompts from the stream
    # round 2: all 3 fresh groups pass -> 1 + 3 = 4 = target -> no more rounds
    groups += [_group(p, [1, 0]) for p in fresh]
    assert count_passing(groups, ds.filters) == 4
    assert not ds.next_round(groups, None)


def test_refill_stops_at_max_rounds_and_resets_each_step():
    ds, _ = _wrapped("control.dynamic_sampling.max_rounds=2")
    first = ds.select(None)
    ds.plan(first, None)
    groups = [_group(p, [1, 1]) for p in first]  # all correct: none passes
    assert ds.next_round(groups, None).total == 4 * 2  # after round 1 of 2: refill 4 prompts
    assert not ds.next_round(groups, None)  # after round 2 of 2: stop, though 0 of 4 passed
    ds.plan(ds.select(None), None)  # next step: the round count starts again
    assert ds.next_round(groups, None).total == 8


def test_tolerance_of_the_filter_is_used_and_state_is_the_controllers():
    # float rewards 0.50 and 0.55 differ by less than tol = 0.1: degenerate -> refill
    ds, _ = _wrapped("filter.options={zero_variance = {tol = 0.1}}")
    first = ds.select(None)
    ds.plan(first, None)
    groups = [_group(first[0], [0.5, 0.55])] + [_group(p, [0, 1]) for p in first[1:]]
    assert ds.next_round(groups, None).total == 1 * 2
    assert ds.state_dict() == ds.inner.state_dict() and ds.budget == 8


def test_config_checks():
    with pytest.raises(UserError, match="zero_variance"):
        load_config(overrides=["control.dynamic_sampling.enabled=true"])
    cfg = load_config(
        overrides=ZV + ["control.dynamic_sampling.enabled=true", "control.dynamic_sampling.target_groups=3"]
    )
    assert target_groups(cfg.control) == 3
    assert target_groups(load_config(overrides=ZV).control) is None


# ------------------------------------------------------------------ the real loop, scripted answers


def _run(tmp_path, schedule, **extra):
    """One training step (4 prompts x 4 rollouts) where ``schedule(call_index)`` says whether the
    scripted answer is right; returns the step's metrics line."""
    o = tiny_overrides(
        tmp_path,
        steps=1,
        **{
            "filter.names": ["zero_variance"],
            "eval.at_start": False,
            "model.warm_start.steps": 0,
            "eval.n_prompts": 2,
            "control.dynamic_sampling.enabled": True,
            **extra,
        },
    )
    result = rollwise.train(
        load_config(overrides=as_sets(o)), backend=scripted_arithmetic(schedule), log=lambda m: None
    )
    return json.loads((result.run_dir / "metrics.jsonl").read_text().splitlines()[0])


def test_loop_refills_the_missing_groups_and_charges_every_round(tmp_path):
    # calls 0-7 alternate right/wrong (groups 1-2 pass), 8-15 all wrong (groups 3-4 dropped),
    # then alternate again: round 2 asks for 4 - 2 = 2 prompts x 4 = 8 rollouts, both pass.
    m = _run(tmp_path, lambda i: i % 2 == 0 if (i < 8 or i >= 16) else False)
    assert m["control/rounds"] == 2
    assert m["cost/rollouts"] == 16 + 8 == m["cost/verifier_calls"] == m["control/budget_used"]
    assert m["filter/all_wrong"] == 2 and m["groups/count"] == 6
    assert m["cost/trained_tokens"] > 0


def test_loop_stops_at_max_rounds(tmp_path):
    # always wrong: 3 rounds of 4 prompts x 4 rollouts = 48 rollouts, 12 groups all dropped
    m = _run(tmp_path, lambda i: False, **{"control.dynamic_sampling.max_rounds": 3})
    assert m["control/rounds"] == 3 and m["cost/rollouts"] == 48
    assert m["filter/all_wrong"] == 12 and m["cost/trained_tokens"] == 0


def test_loop_keeps_the_first_target_groups(tmp_path):
    # all 4 groups pass in round 1; target 2 -> no refill, groups 3-4 dropped as surplus
    m = _run(tmp_path, lambda i: i % 2 == 0, **{"control.dynamic_sampling.target_groups": 2})
    assert m["control/rounds"] == 1 and m["cost/rollouts"] == 16
    assert m["filter/surplus"] == 2
    assert 0 < m["cost/trained_tokens"] < m["cost/generated_tokens"]


def test_a_refill_round_draws_at_most_one_steps_prompts():
    # target 10 with 4 prompts per step: 0 passing -> 10 missing, but a round draws 4 (x 2 rollouts)
    ds, _ = _wrapped("control.dynamic_sampling.target_groups=10")
    first = ds.select(None)
    ds.plan(first, None)
    assert ds.next_round([_group(p, [0, 0]) for p in first], None).total == 4 * 2
