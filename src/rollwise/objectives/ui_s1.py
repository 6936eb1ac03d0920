"""``ui_s1``: UI-S1's step and episode advantages for semi-online episodes (issue #44 item 4).

Paper: UI-S1, semi-online RL for GUI agents, arXiv 2509.11543 (code: X-PLUG/MobileAgent, ``UI-S1``);
the working specification is the UI-S1 entry of the project's agentic
specifications. Its episodes come from the semi-online replay (``rollwise.envs.semi_online``,
``task.semi_online``): each turn's reward says whether the policy's action matched the expert's, and
a turn whose action a patch replaced is marked ``Turn.patched``. For turn k of a row:

1. **Rewards** ``r_k``: ``Turn.reward``, the row's trajectory reward added on the last turn
   (``outcome = "add"``; ``"if_absent"`` only when no turn has a reward), as ``turn_return``.
2. **Returns reset at a patch**: ``G_k = r_k`` on a patched turn, else ``r_k + gamma * G_{k+1}``. The
   turns after a patch follow a history the expert wrote, so their rewards are not credited to the
   policy's turns before it (the patched turn itself keeps its own reward: its action was the
   policy's).
3. **Step advantage** ``A^S_k``: ``G_k`` normalised within (prompt, turn index k): every episode of a
   prompt at turn k stands in the expert's state after k turns.
4. **Episode advantage** ``A^E``: the row's total reward normalised within its group
   (:func:`rollwise.objectives.gigpo.episode_level`).
5. Turn k's policy tokens get ``A^S_k + omega * A^E``.

Worked example (tests/unit/objectives/test_obj_ui_s1.py): gamma 0.5, rewards (1, 0, 1) with turn 1
patched give returns (1, 0, 1); without the patch they would be (1.25, 0.5, 1).

**Reconstructions** [RECON]: the binary match reward (the paper's reward also scores action type and
format), ``gamma = 0.5`` and ``omega = 1`` as defaults, the unbiased std (as ``grpo``), and the reset
*after* a patched turn's own reward.

Refused at load on single-turn tasks (``needs_episodes``, ``rollwise.compat.check_episode_credit``);
without patches (``task.semi_online`` off) it is MT-GRPO-style turn-index returns plus the episode level.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from rollwise.objectives.gigpo import episode_level
from rollwise.objectives.turn_return import episode_table, labels, normalised, spread_turns, turn_rewards
from rollwise.types import Advantages, Episode, Turn


class UiS1Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    gamma: float = Field(0.5, ge=0.0, le=1.0, description="Discount of the step returns, reset at a patch.")
    omega: float = Field(1.0, ge=0.0, description="Weight of the episode-level advantage added to the step one.")
    outcome: Literal["if_absent", "add"] = Field(
        "add",
        description="Where the trajectory reward goes: always added to the last turn's reward ('add'), or there only "
        "when no turn has a reward ('if_absent').",
    )
    eps: float = Field(1e-6, ge=0.0, description="Added to the std before dividing (as grpo).")
    std: Literal["unbiased", "population"] = Field(
        "unbiased", description="Std estimator of both levels: 'unbiased' (n-1, as grpo) or 'population'."
    )
    scale: Literal["std", "none"] = Field("std", description="Divide by the std ('std') or only centre ('none').")


def patch_returns(turns: Sequence[Turn], rewards: Sequence[float], gamma: float) -> list[float]:
    """``G_k`` reset at patched turns (module docstring, 2.). Example: rewards (1, 0, 1), turn 1
    patched, gamma 0.5 -> [1.0, 0.0, 1.0]."""
    out, g = [0.0] * len(rewards), 0.0
    for k in range(len(rewards) - 1, -1, -1):
        g = rewards[k] + (0.0 if turns[k].patched else gamma * g)
        out[k] = g
    return out


def ui_s1(
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    opts: UiS1Options | None = None,
    *,
    episodes: Sequence[Episode | None] | None = None,
    completion_lengths: torch.Tensor | None = None,
) -> Advantages:
    """Step advantage within (prompt, turn index) plus omega times the episode advantage (module docstring)."""
    opts = opts or UiS1Options()
    if group_index.shape != rewards.shape:
        raise ValueError(f"group_index must be (B,) like rewards, got {tuple(group_index.shape)}")
    row_turns, _, width = episode_table(rewards, episodes, completion_lengths, opts.outcome, opts.gamma)
    returns = [
        patch_returns(t, turn_rewards(t, float(rewards[i]), opts.outcome), opts.gamma) for i, t in enumerate(row_turns)
    ]
    keys = [(int(group_index[i]), k) for i, g in enumerate(returns) for k in range(len(g))]
    flat = torch.tensor([x for g in returns for x in g], dtype=torch.float32)
    step = normalised(flat, labels(keys), opts.eps, opts.std, opts.scale)
    episode = opts.omega * episode_level(rewards, group_index, row_turns, opts)
    return spread_turns(row_turns, returns, step, width, base=episode)


ui_s1.Options = UiS1Options  # type: ignore[attr-defined]
ui_s1.inputs = ("episodes", "completion_lengths")  # type: ignore[attr-defined]
ui_s1.per_token = True  # type: ignore[attr-defined]  # always token_values: no sequence-level objective (compat.check)
ui_s1.needs_episodes = True  # type: ignore[attr-defined]  # refused on single-turn tasks (compat.check_episode_credit)
