"""ADHint (guidance.md §7b): hint-ratio schedule, hinted requests, the AE-RDP advantage and
selective hint masking, with the spec's numbers."""

from __future__ import annotations

import pytest
import torch

from rollwise.collate import collate
from rollwise.config import load_config
from rollwise.control.adhint import ADHint, Options, hint_length, hint_ratio
from rollwise.objectives import ADVANTAGES
from rollwise.objectives.adhint import AdhintOptions, adhint
from rollwise.objectives.inputs import advantage_inputs
from rollwise.registry import UserError
from rollwise.types import Group, Prompt, Rollout, RunState, Services, Verdict

T = torch.tensor


def test_hint_ratio_spec_numbers():
    assert hint_ratio(0.0, 0.0, 0.8) == 0.0  # all naive rollouts correct: no hint
    assert hint_ratio(1.0, 0.0, 0.8) == pytest.approx(0.8)
    assert hint_ratio(0.5, 0.0, 0.8) == pytest.approx(0.4)
    assert hint_ratio(1.0, 0.0, 0.8, noise=0.05) == pytest.approx(0.8)  # clipped to w_max
    assert hint_ratio(0.0, 0.0, 0.8, noise=-0.05) == 0.0  # clipped to 0
    assert hint_length(0.4, 10) == 4 and hint_length(0.8, 3) == 2 and hint_length(1.0, 3) == 3


class _Codec:
    def encode_text(self, text):
        return [ord(c) for c in text]


class _Task:
    name = "t"

    def target(self, prompt):
        return prompt.answer


def _controller(n=4, **opts):
    cfg = load_config(
        overrides=[
            "control.name=adhint",
            "advantage.name=adhint",
            f"control.rollouts_per_prompt={n}",
            "control.prompts_per_step=2",
        ]
    ).control
    prompts = [Prompt("a", "t", "1+1=", "1234567890"), Prompt("b", "t", "2+2=", "4")]
    c = ADHint(prompts, cfg, Options(noise=0.0, **opts), seed=0)
    c.bind(Services(_Task(), _Codec()))
    return c, prompts


def _r(pid, score, completion=(1,), versions=None):
    return Rollout(
        pid, (9,), tuple(completion), (-0.1,) * len(completion), "stop", 0, "", Verdict(score), token_versions=versions
    )


def test_naive_round_then_hinted_prefixes_from_the_difficulty_prior():
    c, (pa, pb) = _controller()
    st = RunState(step=0, policy_version=3)
    plan = c.plan([pa, pb], st)
    assert [(r.prompt.id, r.n, r.prefix) for r in plan.requests] == [("a", 2, None), ("b", 2, None)]
    # prompt a: naive 1/2 correct -> Diff_N 0.5 -> w 0.4 -> 4 of the 10 reference tokens; b: all correct -> no hint
    groups = [Group(pa, (_r("a", 1.0), _r("a", 0.0))), Group(pb, (_r("b", 1.0), _r("b", 1.0)))]
    plan2 = c.next_round(groups, st)
    ra, rb = plan2.requests
    assert ra.n == 2 and ra.prefix == tuple(ord(ch) for ch in "1234") and ra.prefix_logprobs == (0.0,) * 4
    assert ra.prefix_versions == (3,) * 4
    assert rb.n == 2 and rb.prefix is None
    assert c.metrics["control/adhint_hint_ratio_mean"] == pytest.approx(0.2)
    assert not c.next_round(groups, st)  # two rounds per step


def test_finish_batch_marks_hinted_rows_and_the_input_reads_them():
    c, (pa, pb) = _controller()
    st = RunState()
    c.plan([pa, pb], st)
    c.next_round([Group(pa, (_r("a", 0.0), _r("a", 0.0)))], st)  # Diff 1 -> w 0.8 -> 8 tokens
    hint = tuple(ord(ch) for ch in "12345678")
    hinted = _r("a", 1.0, hint + (5, 6), versions=(0,) * 10)
    g = Group(pa, (_r("a", 0.0), _r("a", 0.0), hinted))
    out = c.finish_batch([g], [g], {})
    rows = list(out[0].rollouts)
    assert advantage_inputs(ADVANTAGES.get("adhint"), rows)["hint_tokens"].tolist() == [0, 0, 8]


def test_config_checks():
    with pytest.raises(UserError, match="advantage.name = 'adhint'"):
        load_config(overrides=["control.name=adhint"])
    with pytest.raises(UserError, match="n_hinted"):
        _controller(n=4, n_hinted=4)


def test_ae_rdp_worked_example():
    # one prompt: naive r = [1, 0, 0, 0] (Diff_N 0.75), hinted r = [1, 1, 0, 0] with 2 hint tokens (Diff_H 0.5)
    # naive GRPO: mean 0.25, std 0.5 -> [1.5, -0.5 x3]; positive x (1 + 0.75) -> 2.625
    # hinted GRPO: mean 0.5, std 0.57735 -> [0.866, 0.866, -0.866, -0.866]; negatives x (1 + 0.5) -> -1.299
    # unit std over all 8 (unbiased std 1.3367): [1.9638, -0.3741 x3, 0.6479 x2, -0.9718 x2]
    r = T([1.0, 0, 0, 0, 1, 1, 0, 0])
    h = T([0, 0, 0, 0, 2, 2, 2, 2])
    lengths = T([3.0, 3, 3, 3, 5, 5, 5, 5])
    out = adhint(r, torch.zeros(8, dtype=torch.long), AdhintOptions(), hint_tokens=h, completion_lengths=lengths)
    assert out.values.tolist() == pytest.approx(
        [1.9638, -0.3741, -0.3741, -0.3741, 0.6479, 0.6479, -0.9718, -0.9718], abs=1e-3
    )
    # selective masking: the hint tokens (first 2) of the two negative hinted rows are out
    inc = out.token_include
    assert inc[6, :2].tolist() == [False, False] and inc[6, 2:].all() and inc[4].all() and inc[:4].all()
    no_train = adhint(
        r,
        torch.zeros(8, dtype=torch.long),
        AdhintOptions(train_hint_tokens=False),
        hint_tokens=h,
        completion_lengths=lengths,
    ).token_include
    assert not no_train[4, :2].any()  # positive hinted row's hint masked too


def test_all_correct_hinted_subgroup_leaves_naive_advantages_alone():
    naive_only = adhint(
        T([1.0, 0, 0, 0]), T([0, 0, 0, 0]), hint_tokens=T([0, 0, 0, 0]), completion_lengths=T([1.0] * 4)
    )
    both = adhint(
        T([1.0, 0, 0, 0, 1, 1]),
        T([0] * 6),
        hint_tokens=T([0, 0, 0, 0, 3, 3]),
        completion_lengths=T([1.0] * 4 + [4.0] * 2),
    )
    assert both.values[4:].tolist() == [0.0, 0.0]
    assert torch.allclose(both.values[:4], naive_only.values)


def test_negative_hinted_rows_hint_tokens_leave_the_loss():
    rows = [
        Rollout("a", (9, 9), (1, 2, 3), (0.0, 0.0, -0.5), "stop", 0, "", Verdict(0.0), token_versions=(0, 0, 0)),
        Rollout("a", (9, 9), (1, 2, 4), (0.0, 0.0, -0.5), "stop", 0, "", Verdict(1.0), token_versions=(0, 0, 0)),
    ]
    advs = adhint(T([0.0, 1.0]), T([0, 0]), hint_tokens=T([2, 2]), completion_lengths=T([3.0, 3.0]))
    b = collate(rows, T([0.0, 1.0]), T([0, 0]), advs, pad_id=0)
    assert b.loss_mask[0].tolist() == [0, 0, 0, 0, 1]  # prompt 2, hint 2 masked, continuation trained
    assert b.loss_mask[1].tolist() == [0, 0, 1, 1, 1]
