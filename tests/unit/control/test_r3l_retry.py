"""R3L retry-from-the-pivot rounds and pivot masking (guidance.md §7a.5)."""

from __future__ import annotations

import pytest

from rollwise.collate import collate, flatten
from rollwise.config import load_config
from rollwise.control.r3l import R3L, Options, pivot_offset, token_cut
from rollwise.objectives import ADVANTAGES
from rollwise.registry import UserError
from rollwise.types import Group, Prompt, Rollout, RunState, Services, Verdict


class _Codec:  # one character per token
    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def _ids(text):
    return tuple(ord(c) for c in text)


def _r(text, score, pid="a"):
    ids = _ids(text)
    return Rollout(pid, (1,), ids, tuple(-0.1 * (t + 1) for t in range(len(ids))), "stop", 2, text, Verdict(score))


def _controller(n=4, **opts):
    cfg = load_config(
        overrides=["control.name=r3l", f"control.rollouts_per_prompt={n}", "control.prompts_per_step=1"]
    ).control
    c = R3L([Prompt("a", "t", "47+85=", "132")], cfg, Options(**opts), seed=0)
    c.bind(Services(None, _Codec()))
    return c


def test_pivot_offset_and_token_cut():
    text = "7+5+0=12,4+8+1=14,=132"
    assert pivot_offset(text, 0) == 0 and pivot_offset(text, 1) == 9 and pivot_offset(text, 2) == 18
    assert pivot_offset(text, 3) is None  # beyond the last step
    assert token_cut(_ids(text), _Codec().decode, 9, text) == 9


def test_retries_continue_the_pre_pivot_prefix_of_failed_base_rollouts():
    c = _controller()
    st = RunState(step=0, policy_version=2)
    p = c.select(st)[0]
    assert [(r.n, r.prefix) for r in c.plan([p], st).requests] == [(2, None)]
    good, bad = _r("7+5+0=12,4+8+1=13,=132", 1.0), _r("7+5+0=12,4+8+1=14,=142", 0.0)
    plan = c.next_round([Group(p, (good, bad))], st)
    (req,) = plan.requests  # only the failure is retried, from step 1 (its first false equation)
    assert req.n == 1 and req.prefix == _ids("7+5+0=12,") and req.prefix_logprobs == bad.logprobs[:9]
    assert req.prefix_versions == (2,) * 9
    assert c.metrics["control/r3l_retries"] == 1.0 and c.metrics["control/r3l_pivot_mean"] == 1.0
    assert not c.next_round([Group(p, (good, bad))], st)


def test_pivot_masking_masks_the_shared_prefix_in_base_and_retry_only():
    c = _controller()
    st = RunState()
    p = c.select(st)[0]
    c.plan([p], st)
    good, bad = _r("7+5+0=12,4+8+1=13,=132", 1.0), _r("7+5+0=12,4+8+1=14,=142", 0.0)
    c.next_round([Group(p, (good, bad))], st)
    retry = _r("7+5+0=12,4+8+1=13,=132", 1.0)
    g = Group(p, (good, bad, retry))
    (out,) = c.finish_batch([g], [g], {})
    assert out.rollouts[0].loss_mask is None  # untouched
    assert out.rollouts[1].loss_mask[:9] == (0,) * 9 and set(out.rollouts[1].loss_mask[9:]) == {1}
    assert out.rollouts[2].loss_mask[:9] == (0,) * 9 and set(out.rollouts[2].loss_mask[9:]) == {1}
    assert c.metrics["control/r3l_retry_success_frac"] == 1.0
    # the masks reach the batch: base and retry train only their suffixes
    rows, rewards, gidx = flatten([out])
    advs = ADVANTAGES.get("r3l")(rewards, gidx)
    b = collate(rows, rewards, gidx, advs, pad_id=0)
    assert b.loss_mask[1].sum().item() == len(bad.completion_ids) - 9
    assert b.loss_mask[0].sum().item() == len(good.completion_ids)


def test_pivot_zero_retries_from_scratch_and_masks_nothing():
    c = _controller()
    st = RunState()
    p = c.select(st)[0]
    c.plan([p], st)
    bad = _r("7+5+0=11,=131", 0.0)
    (req,) = c.next_round([Group(p, (bad, bad))], st).requests[:1]
    assert req.prefix is None
    retry = _r("7+5+0=12,=132", 1.0)
    g = Group(p, (bad, bad, retry, retry))
    out = c.finish_batch([g], [g], {})[0]
    assert all(r.loss_mask is None for r in out.rollouts)


def test_no_retry_for_successes_perfect_or_invalid_reflections_and_budget():
    c = _controller(n=4, n_base=2)
    st = RunState()
    p = c.select(st)[0]
    c.plan([p], st)
    rows = (_r("7+5+0=12,=132", 1.0), _r("132", 0.0))  # success; a failure with nothing to check (reflector None)
    assert not c.next_round([Group(p, rows)], st)
    c = _controller(n=3, n_base=2)  # at most N - n_base = 1 retry per prompt
    c.plan([p], st)
    bads = (_r("7+5+0=11,=131", 0.0), _r("7+5+0=13,=133", 0.0))
    assert c.next_round([Group(p, bads)], st).total == 1
    with pytest.raises(UserError, match="no retries"):
        _controller(n=2, n_base=2)
    with pytest.raises(UserError, match="known: rule"):
        Options(reflector="judge")


def test_retries_fit_the_step_budget_and_only_kept_ones_are_masked():
    cfg = load_config(
        overrides=[
            "control.name=r3l",
            "control.rollouts_per_prompt=4",
            "control.prompts_per_step=1",
            "control.budget_rollouts=3",
        ]
    ).control
    c = R3L([Prompt("a", "t", "47+85=", "132")], cfg, Options(), seed=0)
    c.bind(Services(None, _Codec()))
    st = RunState()
    p = c.select(st)[0]
    c.plan([p], st)
    b1, b2 = _r("7+5+0=11,=131", 0.0), _r("7+5+0=12,4+8+1=14,=142", 0.0)
    plan = c.next_round([Group(p, (b1, b2))], st)  # two failures, room for one retry (2 + 1 = 3)
    assert plan.total == 1 and plan.requests[0].prefix is None  # the first failure (pivot 0) is kept
    retry = _r("7+5+0=12,=132", 1.0)
    g = Group(p, (b1, b2, retry))
    out = c.finish_batch([g], [g], {})[0]
    assert all(r.loss_mask is None for r in out.rollouts)  # pivot 0 masks nothing; b2 had no retry


def test_pivot_two_of_three_steps_masks_the_first_two_in_base_and_retry():
    # spec §7a.5: pivot k = 2 with three segments -> the first two masked in both copies, the third trained
    c = _controller()
    c.reflect = lambda prompt, text: 2
    st = RunState()
    p = c.select(st)[0]
    c.plan([p], st)
    bad = _r("7+5+0=12,4+8+1=13,=142", 0.0)
    (req,) = c.next_round([Group(p, (bad,))], st).requests
    assert req.prefix == _ids("7+5+0=12,4+8+1=13,")
    retry = _r("7+5+0=12,4+8+1=13,=132", 1.0)
    out = c.finish_batch([Group(p, (bad, retry))], [Group(p, (bad, retry))], {})[0]
    for r in out.rollouts:
        assert r.loss_mask == (0,) * 18 + (1,) * (len(r.completion_ids) - 18)


@pytest.mark.parametrize("k", [1.5, -1, 3, True, "1"])
def test_invalid_pivots_trigger_no_retry(k):
    # non-integer, negative, or beyond the last step (3 steps: valid pivots 0..2)
    c = _controller()
    c.reflect = lambda prompt, text: k
    st = RunState()
    p = c.select(st)[0]
    c.plan([p], st)
    assert not c.next_round([Group(p, (_r("7+5+0=12,4+8+1=13,=142", 0.0),))], st)
