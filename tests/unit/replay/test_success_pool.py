"""DART's experience pool (rollwise.replay.success_pool): past successes mixed into groups with none."""

import pytest

from rollwise.config import load_config
from rollwise.registry import UserError
from rollwise.replay import REGISTRY
from rollwise.replay.success_pool import SuccessPool, SuccessPoolOptions
from rollwise.types import Group, Prompt, Rollout, RunState, Verdict

P, Q = Prompt("p", "t", "x", "1"), Prompt("q", "t", "y", "2")


def roll(prompt, score, version=0, tag=0):
    return Rollout(prompt.id, (1,), (2, tag), (-0.5, -0.5), "stop", version, f"r{tag}", Verdict(score))


def group(prompt, scores, version=0):
    return Group(prompt, tuple(roll(prompt, s, version, i) for i, s in enumerate(scores)))


def test_a_group_without_success_gets_exactly_one_pooled_success_when_the_pool_has_one():
    pool = SuccessPool(None, SuccessPoolOptions(per_prompt=2), 0)
    old = group(P, [0.0, 1.0, 1.0, 0.0], version=3)
    pool.add([old, group(Q, [0.0, 0.0])])  # p: two successes pooled (versions 3); q: none
    assert [len(v) for v in pool.pool.values()] == [2]
    hard_p, hard_q, easy_p = group(P, [0.0, 0.0, 0.0], 7), group(Q, [0.0, 0.0], 7), group(P, [1.0, 0.0], 7)
    out = pool.mix([hard_p, hard_q, easy_p], RunState())
    got = out[0].rollouts
    assert out[0].size == 3 and [r.reward for r in got] == [1.0, 0.0, 0.0]  # one failure replaced, size kept
    assert got[0] is old.rollouts[2]  # the newest pooled success, with its own version and log-probs
    assert got[0].policy_version == 3 and got[1].policy_version == 7
    assert out[1] == hard_q and out[2] == easy_p  # no success pooled for q; p's group already has one
    assert pool.metrics == {"replay/injected": 1, "replay/pooled": 2}


def test_an_unverified_rollout_is_replaced_only_when_no_verified_failure_is_left():
    pool = SuccessPool(None, None, 0)
    pool.add([group(P, [1.0])])
    g = Group(P, (roll(P, None, tag=0), roll(P, 0.0, tag=1)))
    assert [r.reward for r in pool.mix([g], RunState())[0].rollouts] == [None, 1.0]
    g = Group(P, (roll(P, None, tag=0), roll(P, None, tag=1)))
    assert [r.reward for r in pool.mix([g], RunState())[0].rollouts] == [1.0, None]


def test_the_pool_keeps_the_newest_per_prompt_and_does_not_re_add_what_it_mixed_in():
    pool = SuccessPool(None, SuccessPoolOptions(per_prompt=2), 0)
    for v in range(3):
        pool.add([group(P, [1.0], version=v)])
    assert [r.policy_version for r in pool.pool["p"]] == [1, 2]
    mixed = pool.mix([group(P, [0.0, 0.0], 5)], RunState())
    pool.add(mixed)  # even handed back, the pooled success is held once
    assert [r.policy_version for r in pool.pool["p"]] == [1, 2]
    back = SuccessPool(None, None, 0)
    back.load_state_dict(pool.state_dict())
    assert back.pool == pool.pool


def test_registered_and_refused_with_the_zero_variance_filter():
    assert REGISTRY.get("success_pool") is SuccessPool
    sets = ["task.name=calculator", "replay.name=success_pool"]
    assert load_config(None, sets).replay.name == "success_pool"
    with pytest.raises(UserError, match=r"replay\.name = 'success_pool'.*filter\.names"):
        load_config(None, [*sets, "filter.names=['zero_variance']"])
