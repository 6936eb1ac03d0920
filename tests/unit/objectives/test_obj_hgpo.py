"""HGPO's nested step groups (issue #44, ``objectives/hgpo.py``): depth 0 is GiGPO's step groups,
a hand-worked depth-1 case, the one-turn case, and the refusals at load."""

from __future__ import annotations

import math

import pytest
import torch

from rollwise.collate import flatten
from rollwise.config import load_config
from rollwise.objectives import ADVANTAGES
from rollwise.objectives.gigpo import GigpoOptions, gigpo
from rollwise.objectives.hgpo import HgpoOptions, hgpo
from rollwise.objectives.inputs import advantage_inputs
from rollwise.registry import UserError
from rollwise.types import Episode, Group, Prompt, Rollout, Turn, Verdict

R3 = math.sqrt(3)


def episode(pid: str, score: float, turns: list[tuple]) -> Rollout:
    """``turns`` = [(policy ids, observation ids, reward, anchor)], laid out policy then observation."""
    ids, lps, mask, recs = [], [], [], []
    for pol, obs, reward, anchor in turns:
        at = len(ids)
        ids += list(pol) + list(obs)
        lps += [-0.5] * len(pol) + [0.0] * len(obs)
        mask += [1] * len(pol) + [0] * len(obs)
        recs.append(Turn(at, at + len(pol), at + len(pol) + len(obs), reward=reward, anchor=anchor))
    return Rollout(
        pid,
        (1, 1),
        tuple(ids),
        tuple(lps),
        "stop",
        0,
        verdict=Verdict(score),
        loss_mask=tuple(mask),
        episode=Episode(tuple(recs)),
    )


def groups_of(*rows_by_prompt: list[Rollout]) -> list[Group]:
    return [Group(Prompt(rows[0].prompt_id, "t", "x", None), tuple(rows)) for rows in rows_by_prompt]


def estimate(fn, groups, opts):
    rows, rewards, gidx = flatten(groups)
    return rows, fn(rewards, gidx, opts, **advantage_inputs(fn, rows))


# Scripted episodes of two prompts with shared anchors, per-turn rewards, anchor-less turns and an
# anchor shared across prompts (which must not join their groups).
SCRIPTED = groups_of(
    [
        episode("p", 1.0, [((1, 2), (7,), None, "s0"), ((2,), (8, 8), None, "x1"), ((3,), (), None, "a2")]),
        episode("p", 0.0, [((1,), (7,), 0.5, "s0"), ((4, 4), (), None, "b1")]),
        episode("p", 1.0, [((5, 5), (9, 9), None, "s0"), ((2,), (), None, "x1")]),
        episode("p", 0.0, [((1, 2), (7,), None, "s0"), ((2,), (8, 8), None, "x1"), ((6,), (), None, None)]),
    ],
    [
        episode("q", 1.0, [((1,), (7,), None, "s0"), ((2,), (), None, None)]),
        episode("q", 0.0, [((1,), (7,), None, "s0"), ((3,), (), None, "x1")]),
    ],
)


@pytest.mark.parametrize(
    "opts",
    [
        dict(gamma=0.5, omega=1.0, eps=0.0),
        dict(),
        dict(gamma=0.3, omega=2.0, std="population", eps=1e-4, outcome="add"),
        dict(scale="none", gamma=1.0),
    ],
)
def test_depth_zero_is_gigpo(opts):
    """The defining property: with K = 0 the only level is the anchor's step group, so every token's
    advantage is GiGPO's with the same options (whatever alpha)."""
    _, want = estimate(gigpo, SCRIPTED, GigpoOptions(**opts))
    for alpha in (0.0, 1.0, 3.0):
        _, got = estimate(hgpo, SCRIPTED, HgpoOptions(depth=0, alpha=alpha, **opts))
        assert torch.allclose(got.token_values, want.token_values, atol=1e-6)
        assert torch.allclose(got.values, want.values, atol=1e-6)


# Depth 1, alpha 1 (w_0 = 1, w_1 = 2), gamma 1, omega 1, eps 0, unbiased std. Every turn 0 acts on "s0"
# and every turn 1 on "s1"; rows a, b, c reached "s1" by the same turn 0 (ids 1 | 7), row d by another (4 | 8).
#   outcomes (1, 1, 0, 0): A^E = (R - 0.5) / (1 / sqrt 3) = (+-sqrt(3)/2)
#   turn 0: both levels are the whole group (no history yet) -> A^S = A^E -> A = 2 A^E = +-sqrt 3
#   turn 1, level 0 ("s1"): G = (1, 1, 0, 0) -> +-sqrt(3)/2
#           level 1: {a, b, c}: G = (1, 1, 0), mean 2/3, std 1/sqrt 3 -> (1/sqrt 3, 1/sqrt 3, -2/sqrt 3);
#                    {d}: one member, not counted
#   A^S: a, b = (sqrt(3)/2 + 2 / sqrt 3) / 3; c = (-sqrt(3)/2 - 4 / sqrt 3) / 3; d = -sqrt(3)/2 (level 0 only)
DEPTH1 = [
    ("a", 1.0, [((1,), (7,), None, "s0"), ((2,), (), None, "s1")]),
    ("b", 1.0, [((1,), (7,), None, "s0"), ((2,), (), None, "s1")]),
    ("c", 0.0, [((1,), (7,), None, "s0"), ((3,), (), None, "s1")]),
    ("d", 0.0, [((4,), (8,), None, "s0"), ((2,), (), None, "s1")]),
]


def test_depth_one_hand_worked():
    groups = groups_of([episode("p", s, t) for _, s, t in DEPTH1])
    _, adv = estimate(hgpo, groups, HgpoOptions(depth=1, alpha=1.0, gamma=1.0, omega=1.0, eps=0.0))
    h = R3 / 2
    turn1 = [h + (h + 2 / R3) / 3, h + (h + 2 / R3) / 3, -h - (h + 4 / R3) / 3, -h - h]
    assert turn1 == pytest.approx([1.5396007, 1.5396007, -1.9245009, -1.7320508], abs=1e-6)
    tv = adv.token_values  # turn 0's action is token 0, turn 1's token 2 (token 1 is the observation)
    assert tv[:, 0].tolist() == pytest.approx([R3, R3, -R3, -R3], abs=1e-5)
    assert tv[:, 2].tolist() == pytest.approx(turn1, abs=1e-5)
    assert tv[:, 1].tolist() == [0.0] * 4
    # GiGPO (depth 0) gives d's turn 1 the same credit as c's: it cannot tell their histories apart
    _, flat = estimate(hgpo, groups, HgpoOptions(depth=0, gamma=1.0, eps=0.0))
    assert flat.token_values[:, 2].tolist() == pytest.approx([R3, R3, -R3, -R3], abs=1e-5)
    # alpha = 0: the two counted levels weigh the same for a, b, c
    _, even = estimate(hgpo, groups, HgpoOptions(depth=1, alpha=0.0, gamma=1.0, eps=0.0))
    assert even.token_values[2, 2].item() == pytest.approx(-h - (h + 2 / R3) / 2, abs=1e-5)


def test_single_turn_rollouts_get_grpo():
    from rollwise.objectives.advantages import GrpoOptions, grpo

    rows = [Rollout("p", (1,), (5, 6), (-0.5, -0.5), "stop", 0, verdict=Verdict(s)) for s in (1.0, 0.0, 0.0)]
    _, adv = estimate(hgpo, groups_of(rows), HgpoOptions(eps=0.0))
    _, rewards, gidx = flatten(groups_of(rows))
    assert torch.allclose(adv.values, grpo(rewards, gidx, GrpoOptions(eps=0.0)).values, atol=1e-6)


def test_registered_and_refused_where_it_cannot_apply():
    fn = ADVANTAGES.get("hgpo")
    assert set(fn.inputs) == {"episodes", "completion_lengths", "completion_ids"}
    assert all(info.description for info in fn.Options.model_fields.values())
    assert load_config(None, ["task.name=guess_number", "advantage.name=hgpo"]).advantage.name == "hgpo"
    with pytest.raises(UserError, match=r"advantage\.name = 'hgpo'.*task\.name = 'arithmetic'.*single-turn"):
        load_config(None, ["advantage.name=hgpo"])
    with pytest.raises(UserError, match=r"advantage\.name = 'hgpo'.*task\.name = 'python_math'.*no state"):
        load_config(None, ["task.name=python_math", "advantage.name=hgpo"])
    with pytest.raises(UserError, match="per-token"):
        load_config(None, ["task.name=guess_number", "advantage.name=hgpo", "objective.name=gspo"])
    with pytest.raises(UserError, match="depth"):
        load_config(None, ["task.name=guess_number", "advantage.name=hgpo", "advantage.options={depth = -1}"])
