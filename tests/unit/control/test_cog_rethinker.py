"""Cog-Rethinker (allocation.md §13): decomposition only for zero-accuracy prompts, refinement only
for those still at zero, correct outputs re-templated to the plain prompt, the SFT rows' advantage
lambda and the NLL gradient it gives, with small hand-worked numbers."""

from __future__ import annotations

import pytest
import torch

from rollwise.collate import collate
from rollwise.config import load_config
from rollwise.control.cog_rethinker import CogRethinker, Options
from rollwise.objectives import ADVANTAGES, OBJECTIVES
from rollwise.objectives.cog_rethinker import CogRethinkerOptions, cog_rethinker
from rollwise.objectives.inputs import advantage_inputs
from rollwise.registry import UserError
from rollwise.types import Group, Prompt, Rollout, RunState, Services, Verdict

T = torch.tensor


class _Codec:
    pad_id = 0


def _scored(batch):
    """The 'current policy' of these tests: log-prob -0.1 * token id at every position (a fixed rule,
    so the re-scored log-probs are known by hand)."""
    return -0.1 * batch.input_ids.float()


def _controller(**opts):
    cfg = load_config(
        overrides=[
            "control.name=cog_rethinker",
            "advantage.name=cog_rethinker",
            "control.rollouts_per_prompt=2",
            "control.prompts_per_step=3",
        ]
    ).control
    prompts = [Prompt("a", "t", "1+1=", "2"), Prompt("b", "t", "2+2=", "4"), Prompt("c", "t", "3+3=", "6")]
    c = CogRethinker(prompts, cfg, Options(**{"decompose_rollouts": 3, "refine_rollouts": 2, **opts}), seed=0)
    c.bind(Services(codec=_Codec(), policy_logprobs=_scored))
    return c, prompts


def _r(pid, score, text="x", completion=(5,), prompt_ids=(9,)):
    return Rollout(pid, prompt_ids, tuple(completion), (-0.5,) * len(completion), "stop", 0, text, Verdict(score))


ST = RunState(step=0, policy_version=1)


def test_only_zero_accuracy_prompts_get_a_decomposition_rollout():
    c, (pa, pb, pc) = _controller()
    plan = c.plan([pa, pb, pc], ST)
    assert [(r.prompt.id, r.n) for r in plan.requests] == [("a", 2), ("b", 2), ("c", 2)]
    groups = [
        Group(pa, (_r("a", 0.0, "3"), _r("a", 0.0, "5"))),  # zero accuracy
        Group(pb, (_r("b", 1.0, "4"), _r("b", 0.0, "5"))),  # half right: no extra stage
        Group(pc, (_r("c", 1.0, "6"), _r("c", 1.0, "6"))),
    ]
    (req,) = c.next_round(groups, ST).requests
    assert req.n == 3 and req.prompt.metadata["cog_of"] == "a" and req.prompt.metadata["cog_stage"] == "decompose"
    assert req.prompt.id.startswith("a#cog-decompose-")
    assert req.prompt.text == "Split into steps: 1+1="  # empty buffer: no demonstrations
    assert c.metrics["control/cog_zero_prompts"] == 1.0


def test_demonstrations_come_from_solved_prompts():
    c, (pa, pb, pc) = _controller(demonstrations=1)
    c.plan([pa, pb], ST)
    c.observe([Group(pb, (_r("b", 1.0, "4"), _r("b", 0.0, "5")))], ST)  # an earlier step solved b
    (req,) = c.next_round([Group(pa, (_r("a", 0.0), _r("a", 0.0)))], ST).requests
    assert req.prompt.text == "Split into steps: 2+2=4 1+1="


def test_only_prompts_still_at_zero_get_a_refinement_rollout():
    c, (pa, pb, pc) = _controller()
    c.plan([pa, pb], ST)
    direct = [Group(pa, (_r("a", 0.0, "3"), _r("a", 0.0, "5"))), Group(pb, (_r("b", 0.0, "7"), _r("b", 0.0, "8")))]
    da, db = (r.prompt for r in c.next_round(direct, ST).requests)
    dec = [
        Group(da, (_r(da.id, 0.0, "9"),) * 3),
        Group(db, (_r(db.id, 1.0, "4"), _r(db.id, 0.0, "1"), _r(db.id, 0.0, "1"))),
    ]
    (req,) = c.next_round(direct + dec, ST).requests  # b's decomposition solved it: only a is refined
    assert req.n == 2 and req.prompt.metadata == {"cog_of": "a", "cog_stage": "refine"}
    assert req.prompt.text == "Wrong: 3 | 5. 1+1="  # its first two wrong outputs, then the plain problem
    assert c.metrics["control/cog_decompose_solved"] == 1.0
    assert not c.next_round(direct + dec, ST).requests  # three rounds per step


def test_a_correct_refined_output_is_retemplated_to_the_plain_prompt():
    c, (pa, pb, pc) = _controller()
    c.plan([pa, pb], ST)
    direct = [Group(pa, (_r("a", 0.0, prompt_ids=(1, 2)),) * 2), Group(pb, (_r("b", 1.0), _r("b", 0.0)))]
    (da,) = (r.prompt for r in c.next_round(direct, ST).requests)
    dec = [Group(da, (_r(da.id, 0.0, prompt_ids=(7, 7, 7, 1, 2)),) * 3)]
    (rq,) = c.next_round(direct + dec, ST).requests
    good = _r(rq.prompt.id, 1.0, "2", completion=(3, 4), prompt_ids=(8, 8, 1, 2))
    ref = [Group(rq.prompt, (good, _r(rq.prompt.id, 0.0, prompt_ids=(8, 8, 1, 2))))]
    everything = direct + dec + ref
    kept = [direct[1]] + dec + ref  # a filter dropped a's all-wrong direct group
    out = c.finish_batch(everything, kept, None)
    assert [g.prompt.id for g in out] == ["b", "a"]  # stage groups leave; a comes back with its SFT row
    (row,) = out[1].rollouts
    assert row.prompt_id == "a" and row.prompt_ids == (1, 2)  # the plain prompt's ids, not the refinement's
    assert row.completion_ids == (3, 4) and row.text == "2"
    assert row.verdict.details["sft"] is True and row.verdict.details["cog_stage"] == "refine"
    assert row.logprobs == pytest.approx((-0.3, -0.4))  # re-scored by the current policy under the plain prompt
    assert c.metrics["control/cog_sft_rows"] == 1.0 and c.metrics["control/cog_refine_solved"] == 1.0


def test_sft_rows_get_lambda_and_leave_the_direct_rows_alone():
    # one group: direct rewards [1, 0] -> GRPO [0.7071, -0.7071]; the SFT row (reward 1) gets lambda
    a = cog_rethinker(
        T([1.0, 0.0, 1.0]), T([0, 0, 0]), CogRethinkerOptions(sft_weight=0.5), sft_rows=T([0, 0, 1]).bool()
    )
    assert a.values.tolist() == pytest.approx([0.70711, -0.70711, 0.5], abs=1e-4)
    # without the SFT row the direct advantages are the same: it is not in the group's mean or std
    b = cog_rethinker(T([1.0, 0.0]), T([0, 0]), CogRethinkerOptions(sft_weight=0.5), sft_rows=T([0, 0]).bool())
    assert b.values.tolist() == pytest.approx(a.values[:2].tolist())
    assert ADVANTAGES.get("cog_rethinker") is cog_rethinker
    rows = [_r("a", 1.0), Rollout("a", (9,), (5,), (-0.5,), "stop", 0, "", Verdict(1.0, details={"sft": True}))]
    assert advantage_inputs(cog_rethinker, rows)["sft_rows"].tolist() == [False, True]


@pytest.mark.parametrize("objective", ["grpo", "dapo"])
def test_the_sft_weight_scales_an_nll_gradient(objective):
    # one SFT row of two tokens whose behaviour log-probs are the current policy's (ratio 1): the token-mean
    # surrogate -A r over 2 tokens has gradient -A / 2 on each token's log-prob, lambda times the NLL's
    # gradient (-1 per token) over the same 2 tokens: lambda 0.5 -> -0.25, lambda 1.0 -> -0.5
    lp = (-1.2, -0.7)
    row = Rollout("a", (1, 2), (3, 4), lp, "stop", 0, "", Verdict(1.0, details={"sft": True}))
    grads = []
    for lam in (0.5, 1.0):
        adv = cog_rethinker(T([1.0]), T([0]), CogRethinkerOptions(sft_weight=lam), sft_rows=T([True]))
        batch = collate([row], T([1.0]), T([0]), adv, 0)
        new = batch.old_logprobs.clone().requires_grad_(True)
        fn = OBJECTIVES.get(objective)
        fn(batch, new, fn.Options()).loss.backward()
        grads.append(new.grad[0, 2:4].tolist())
    assert grads[0] == pytest.approx([-0.25, -0.25])
    assert grads[1] == pytest.approx([-0.5, -0.5])


def test_refusals_at_load_name_the_key():
    with pytest.raises(UserError, match="advantage"):
        load_config(overrides=["control.name=cog_rethinker"])  # its advantage marks the SFT rows
    with pytest.raises(UserError, match="dynamic_sampling"):
        load_config(
            overrides=[
                "control.name=cog_rethinker",
                "advantage.name=cog_rethinker",
                "control.dynamic_sampling.enabled=true",
                "filter.names=['zero_variance']",
            ]
        )
    with pytest.raises(UserError, match="max_staleness"):
        load_config(
            overrides=["control.name=cog_rethinker", "advantage.name=cog_rethinker", "train.async.max_staleness=1"]
        )
    with pytest.raises(UserError, match="refine_prefix"):
        load_config(
            overrides=[
                "control.name=cog_rethinker",
                "advantage.name=cog_rethinker",
                "control.options={refine_prefix = '{answer}'}",
            ]
        )
    cfg = load_config(
        overrides=["control.name=cog_rethinker", "advantage.name=cog_rethinker", "control.budget_rollouts=10"]
    ).control
    with pytest.raises(UserError, match="control.budget_rollouts"):
        CogRethinker([Prompt("a", "t", "1+1=", "2")], cfg, None, seed=0)


def test_rescoring_needs_the_bound_services():
    c, (pa, *_) = _controller()
    c.services = None
    row = _r("a", 1.0)
    with pytest.raises(RuntimeError, match="bind"):
        c._rescored([row])
