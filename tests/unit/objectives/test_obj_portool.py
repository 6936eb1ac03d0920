"""PORTool's step rewards and fork-relative advantage (issue #44, ``objectives/portool.py``) on a scripted
tree, hand-worked; the blend with weight 0 is trajectory GRPO; the refusals of branching at load."""

from __future__ import annotations

import pytest
import torch

from rollwise.collate import flatten
from rollwise.config import load_config
from rollwise.objectives import ADVANTAGES
from rollwise.objectives.advantages import GrpoOptions, grpo
from rollwise.objectives.inputs import advantage_inputs
from rollwise.objectives.portool import PortoolOptions, portool, step_rewards
from rollwise.objectives.turn_return import episode_table
from rollwise.registry import UserError
from rollwise.types import Episode, Group, Prompt, Rollout, ToolCall, Turn, Verdict

OK, ERR = (ToolCall("calc", "x", 0.0, "ok"),), (ToolCall("calc", "x", 0.0, "error"),)


def episode(score: float, turns: list[tuple]) -> Rollout:
    """``turns`` = [(policy ids, observation ids, tool calls)], laid out policy then observation."""
    ids, lps, mask, recs = [], [], [], []
    for pol, obs, calls in turns:
        at = len(ids)
        ids += list(pol) + list(obs)
        lps += [-0.5] * len(pol) + [0.0] * len(obs)
        mask += [1] * len(pol) + [0] * len(obs)
        recs.append(Turn(at, at + len(pol), at + len(pol) + len(obs), None, calls))
    return Rollout(
        "p",
        (1, 1),
        tuple(ids),
        tuple(lps),
        "stop",
        0,
        verdict=Verdict(score),
        loss_mask=tuple(mask),
        episode=Episode(tuple(recs)),
    )


# A tree of four episodes: two fresh starts, each forked after its tool call. Start A calls the tool
# successfully (action 1, output 7) and its branches answer 2 (correct) and 3; start B's call fails
# (action 4, output 8) and its branches answer 5 and 6, both wrong.
TREE = [
    episode(1.0, [((1,), (7,), OK), ((2,), (), ())]),
    episode(0.0, [((1,), (7,), OK), ((3,), (), ())]),
    episode(0.0, [((4,), (8,), ERR), ((5,), (), ())]),
    episode(0.0, [((4,), (8,), ERR), ((6,), (), ())]),
]


def estimate(rows, opts):
    _, rewards, gidx = flatten([Group(Prompt("p", "t", "x", None), tuple(rows))])
    return portool(rewards, gidx, opts, **advantage_inputs(portool, rows)), rewards, gidx


def test_a_step_with_a_correct_descendant_gets_reward_one_plus_its_tool_success():
    """Flat (row, turn) order. Step A (rows 0, 1; one of them correct; call ok): 1 + 0.5. Step B (rows
    2, 3; none correct; call failed): 0. The answers: 1 for the correct one, 0 for the others."""
    _, rewards, gidx = flatten([Group(Prompt("p", "t", "x", None), tuple(TREE))])
    inputs = advantage_inputs(portool, TREE)
    row_turns, _, _ = episode_table(rewards, inputs["episodes"], inputs["completion_lengths"], "if_absent", 1.0)
    _, _, got = step_rewards(rewards, gidx, row_turns, inputs["completion_ids"], tool_weight=0.5)
    assert got == [1.5, 1.0, 1.5, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_hand_worked_fork_relative_advantage_blended_with_the_trajectory_one():
    """scale 'none'. Trajectory: rewards (1, 0, 0, 0) centred -> (0.75, -0.25, -0.25, -0.25).
    Fork at the root: A (1.5) and B (0) -> +-0.75; fork under A: answers 2 (1) and 3 (0) -> +-0.5;
    fork under B: 5 and 6 (both 0) -> 0. weight 0.5: row 0 = (0.375 + 0.375, 0.375 + 0.25),
    row 1 = (-0.125 + 0.375, -0.125 - 0.25), rows 2, 3 = (-0.125 - 0.375, -0.125 + 0)."""
    adv, _, _ = estimate(TREE, PortoolOptions(weight=0.5, tool_weight=0.5, scale="none", eps=0.0))
    tv = adv.token_values
    assert tv[:, 0].tolist() == pytest.approx([0.75, 0.25, -0.5, -0.5])
    assert tv[:, 2].tolist() == pytest.approx([0.625, -0.375, -0.125, -0.125])
    assert tv[:, 1].tolist() == [0.0] * 4  # tool output tokens
    assert adv.values.tolist() == pytest.approx([0.75, 0.25, -0.5, -0.5])


def test_weight_zero_is_trajectory_grpo():
    adv, rewards, gidx = estimate(TREE, PortoolOptions(weight=0.0))
    ref = grpo(rewards, gidx, GrpoOptions()).values
    assert torch.allclose(adv.values, ref, atol=1e-6)
    for i, row in enumerate(TREE):
        policy = [t for t, m in enumerate(row.loss_mask) if m]
        assert torch.allclose(adv.token_values[i, policy], ref[i].expand(len(policy)), atol=1e-6)


def test_registered_and_refusals_of_branching_at_load_name_the_key():
    fn = ADVANTAGES.get("portool")
    assert set(fn.inputs) == {"episodes", "completion_lengths", "completion_ids"}
    assert all(info.description for info in fn.Options.model_fields.values())
    ok = load_config(None, ["task.name=calculator", "sampling.branching.mode=portool", "advantage.name=portool"])
    assert ok.sampling.branching.mode == "portool"
    with pytest.raises(UserError, match=r"sampling\.branching\.mode = 'aepo'.*'python_math'.*cannot be forked"):
        load_config(None, ["task.name=python_math", "sampling.branching.mode=aepo"])
    with pytest.raises(UserError, match=r"advantage\.name = 'portool'.*sampling\.branching\.mode = 'off'"):
        load_config(None, ["task.name=calculator", "advantage.name=portool"])
    with pytest.raises(UserError, match=r"sampling\.branching\.mode = 'portool'.*'arithmetic'.*single-turn"):
        load_config(None, ["sampling.branching.mode=portool"])
    with pytest.raises(UserError, match=r"task\.episode_schedule = 'overlap'"):
        load_config(
            None, ["task.name=guess_number", "sampling.branching.mode=portool", "task.episode_schedule=overlap"]
        )
    with pytest.raises(UserError, match=r"sampling\.branching\.mode = 'portool'.*task\.semi_online\.enabled"):
        load_config(None, ["task.name=calculator", "sampling.branching.mode=portool", "task.semi_online.enabled=true"])
