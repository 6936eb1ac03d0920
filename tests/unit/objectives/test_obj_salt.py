"""SALT's step graph (issue #44, ``objectives/salt.py``): a step every trajectory shares gets 0, a
decisive step keeps its sign, hand-worked numbers, the one-turn case and the refusal at load."""

from __future__ import annotations

import math

import pytest
import torch

from rollwise.collate import flatten
from rollwise.config import load_config
from rollwise.objectives import ADVANTAGES
from rollwise.objectives.advantages import GrpoOptions, grpo
from rollwise.objectives.inputs import advantage_inputs
from rollwise.objectives.salt import SaltOptions, salt
from rollwise.registry import UserError
from rollwise.types import Episode, Group, Prompt, Rollout, Turn, Verdict

H = math.sqrt(3) / 2


def episode(score: float, turns: list[tuple], pid: str = "p") -> Rollout:
    """``turns`` = [(policy ids, observation ids)], laid out policy then observation."""
    ids, lps, mask, recs = [], [], [], []
    for pol, obs in turns:
        at = len(ids)
        ids += list(pol) + list(obs)
        lps += [-0.5] * len(pol) + [0.0] * len(obs)
        mask += [1] * len(pol) + [0] * len(obs)
        recs.append(Turn(at, at + len(pol), at + len(pol) + len(obs)))
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


def estimate(*rows_by_prompt, opts=None):
    groups = [Group(Prompt(rows[0].prompt_id, "t", "x", None), tuple(rows)) for rows in rows_by_prompt]
    rows, rewards, gidx = flatten(groups)
    return salt(rewards, gidx, opts or SaltOptions(eps=0.0), **advantage_inputs(salt, rows))


def test_a_shared_step_gets_zero_and_a_decisive_step_keeps_its_sign():
    """Balanced outcomes (1, 1, 0, 0): A = +-sqrt(3)/2 (mean 0.5, unbiased std 1/sqrt 3). Every row
    opens with action 1 (observation 7): that node holds all four rows -> 0. Rows 0, 1 then take
    action 2 (decisive, both won), rows 2, 3 action 3 (both lost): those nodes keep +- sqrt(3)/2."""
    adv = estimate(
        [
            episode(1.0, [((1,), (7,)), ((2,), ())]),
            episode(1.0, [((1,), (7,)), ((2,), ())]),
            episode(0.0, [((1,), (7,)), ((3,), ())]),
            episode(0.0, [((1,), (7,)), ((3,), ())]),
        ]
    )
    tv = adv.token_values
    assert tv[:, 0].tolist() == pytest.approx([0.0] * 4, abs=1e-6)  # the shared step
    assert tv[:, 1].tolist() == [0.0] * 4  # observation tokens
    assert tv[:, 2].tolist() == pytest.approx([H, H, -H, -H], abs=1e-5)  # the decisive steps
    assert adv.values.tolist() == pytest.approx([0.0] * 4, abs=1e-6)


def test_hand_worked_graph():
    """Rewards (1, 0, 0, 0): A = (1.5, -0.5, -0.5, -0.5) (mean 0.25, unbiased std 0.5).
    Node 'action 1' (all rows) -> 0; 'action 1, obs 7, action 2' (rows 0, 1) -> (1.5 - 0.5) / 2 = 0.5;
    row 0's third step 5 -> 1.5, row 1's 6 -> -0.5; rows 2 and 3 part at their second step -> -0.5 each.
    Row 3 takes action 2 too, but after another observation (9): a different node (-0.5, not 0.5)."""
    adv = estimate(
        [
            episode(1.0, [((1,), (7,)), ((2,), (8,)), ((5,), ())]),
            episode(0.0, [((1,), (7,)), ((2,), (8,)), ((6,), ())]),
            episode(0.0, [((1,), (7,)), ((3,), ())]),
            episode(0.0, [((1,), (9,)), ((2,), ())]),
        ]
    )
    tv = adv.token_values
    assert tv[0, [0, 2, 4]].tolist() == pytest.approx([0.0, 0.5, 1.5], abs=1e-6)
    assert tv[1, [0, 2, 4]].tolist() == pytest.approx([0.0, 0.5, -0.5], abs=1e-6)
    assert tv[2, [0, 2]].tolist() == pytest.approx([0.0, -0.5], abs=1e-6)
    assert tv[3, [0, 2]].tolist() == pytest.approx([0.0, -0.5], abs=1e-6)
    # scale 'none': centred outcomes (0.75, -0.25, -0.25, -0.25); the shared pair (0, 1) -> 0.25
    centred = estimate(
        [
            episode(1.0, [((1,), (7,)), ((2,), (8,)), ((5,), ())]),
            episode(0.0, [((1,), (7,)), ((2,), (8,)), ((6,), ())]),
            episode(0.0, [((1,), (7,)), ((3,), ())]),
            episode(0.0, [((1,), (9,)), ((2,), ())]),
        ],
        opts=SaltOptions(scale="none"),
    )
    assert centred.token_values[0, [0, 2, 4]].tolist() == pytest.approx([0.0, 0.25, 0.75], abs=1e-6)


def test_nodes_do_not_cross_prompts():
    """The same steps under two prompts are two graphs: each prompt's shared first step is 0 within
    its own group, whose outcomes differ."""
    adv = estimate(
        [episode(1.0, [((1,), (7,)), ((2,), ())]), episode(0.0, [((1,), (7,)), ((3,), ())])],
        [episode(1.0, [((1,), (7,)), ((2,), ())], "q"), episode(1.0, [((1,), (7,)), ((3,), ())], "q")],
    )
    s2 = 1 / math.sqrt(2)
    assert adv.token_values[:, 2].tolist() == pytest.approx([s2, -s2, 0.0, 0.0], abs=1e-5)


def test_single_turn_rollouts_get_grpo():
    rows = [
        Rollout("p", (1,), (5, i), (-0.5, -0.5), "stop", 0, verdict=Verdict(s)) for i, s in enumerate((1.0, 0.0, 0.0))
    ]
    groups = [Group(Prompt("p", "t", "x", None), tuple(rows))]
    _, rewards, gidx = flatten(groups)
    adv = salt(rewards, gidx, SaltOptions(eps=0.0), **advantage_inputs(salt, rows))
    assert torch.allclose(adv.values, grpo(rewards, gidx, GrpoOptions(eps=0.0)).values, atol=1e-6)


def test_registered_and_refused_on_single_turn_tasks():
    fn = ADVANTAGES.get("salt")
    assert set(fn.inputs) == {"episodes", "completion_lengths", "completion_ids"}
    assert all(info.description for info in fn.Options.model_fields.values())
    assert load_config(None, ["task.name=python_math", "advantage.name=salt"]).advantage.name == "salt"
    with pytest.raises(UserError, match=r"advantage\.name = 'salt'.*task\.name = 'arithmetic'.*single-turn"):
        load_config(None, ["advantage.name=salt"])
