"""``ui_s1`` (issue #44 item 4; rollwise.objectives.ui_s1): returns reset at a patch, step advantages
normalised within (prompt, turn index), plus omega times the episode advantage, hand-worked."""

import pytest
import torch

from rollwise.config import load_config
from rollwise.objectives import ADVANTAGES
from rollwise.objectives.ui_s1 import UiS1Options, patch_returns, ui_s1
from rollwise.registry import UserError
from rollwise.types import Episode, Turn


def episode(rewards, patched=()):
    """Three turns of 2 policy tokens and 1 observation token (the last without one)."""
    spans = [(0, 2, 3), (3, 5, 6), (6, 8, 8)]
    return Episode(tuple(Turn(*s, reward=r, patched=k in patched) for k, (s, r) in enumerate(zip(spans, rewards))))


def test_returns_reset_at_a_patch():
    turns = episode((1.0, 0.0, 1.0), patched=(1,)).turns
    assert patch_returns(turns, [1.0, 0.0, 1.0], 0.5) == [1.0, 0.0, 1.0]
    assert patch_returns(episode((1.0, 0.0, 1.0)).turns, [1.0, 0.0, 1.0], 0.5) == [1.25, 0.5, 1.0]


def test_step_advantage_by_prompt_and_turn_index_plus_weighted_episode_advantage():
    """gamma 0.5, omega 0.5, scale 'none' (centred only). Group 0: returns a (1.75, 1.5, 1), b (1, 0, 1)
    (turn 1 patched), c (0, 1.5, 1) (turn 0 patched). Turn 0: mean 11/12 -> 5/6, 1/12, -11/12; turn 1:
    mean 1 -> 0.5, -1, 0.5; turn 2: 0. Episode totals 3, 2, 2: mean 7/3 -> 2/3, -1/3, -1/3, times 0.5.
    Row d alone in group 1 gets 0 everywhere."""
    eps = [
        episode((1.0, 1.0, 1.0)),
        episode((1.0, 0.0, 1.0), patched=(1,)),
        episode((0.0, 1.0, 1.0), patched=(0,)),
        episode((1.0, 1.0, 1.0)),
    ]
    opts = UiS1Options(gamma=0.5, omega=0.5, outcome="if_absent", scale="none")
    adv = ui_s1(torch.ones(4), torch.tensor([0, 0, 0, 1]), opts, episodes=eps, completion_lengths=torch.full((4,), 8))
    want = [
        [5 / 6 + 1 / 3, 0.5 + 1 / 3, 1 / 3],
        [1 / 12 - 1 / 6, -1.0 - 1 / 6, -1 / 6],
        [-11 / 12 - 1 / 6, 0.5 - 1 / 6, -1 / 6],
        [0.0, 0.0, 0.0],
    ]
    tv = adv.token_values
    for i, row in enumerate(want):
        got = [tv[i, 0].item(), tv[i, 3].item(), tv[i, 6].item()]
        assert got == pytest.approx(row, abs=1e-6)
        assert tv[i, 1].item() == pytest.approx(row[0]) and tv[i, 2].item() == 0.0  # observation token
    assert adv.values.tolist() == pytest.approx([w[0] for w in want], abs=1e-6)


def test_ui_s1_is_registered_and_refused_on_single_turn_tasks():
    assert ADVANTAGES.get("ui_s1") is ui_s1
    with pytest.raises(UserError, match=r"advantage\.name = 'ui_s1' .* single-turn"):
        load_config(None, ["advantage.name=ui_s1"])
    load_config(None, ["task.name=calculator", "advantage.name=ui_s1", "task.semi_online.enabled=true"])
