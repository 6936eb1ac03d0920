"""``gigpo``: Group-in-Group Policy Optimization's two-level advantage for multi-turn episodes (issue #30).

Paper: Feng et al., "Group-in-Group Policy Optimization for LLM Agent Training", arXiv 2505.10978.
For the rows of one group (the episodes of one prompt):

1. **Episode level** ``A^E_i = (R_i - mean_g R) / F_norm``, ``R_i = sum_k r_k`` the episode's total
   reward (the trajectory reward when the environment gives no per-turn rewards; per-turn rewards as
   in ``objectives/turn_return.py``: ``Turn.reward``, the trajectory reward on the last turn when none
   is given, option ``outcome``).
2. **Step level.** The turns of the group's episodes that acted in the same environment state (equal
   ``Turn.anchor``, the paper's "anchor state"; each environment keys its state, never the action,
   in ``StepResult.anchor``, e.g. ``envs/guess.py``) form a step group. Each turn's discounted return
   ``G_k = sum_{j >= k} gamma^(j - k) r_j`` is normalised within its step group:
   ``A^S = (G_k - mean_step) / F_norm``.
3. ``A_k = A^E_i + omega * A^S_k`` on turn k's policy tokens (``Advantages.token_values``);
   observation tokens carry 0. ``Advantages.values`` is ``A_0`` (the first turn's), the per-row summary.

``F_norm`` is the std (+ ``eps``; ``scale = "std"``, default) or 1 (``scale = "none"``), both in the
paper; the statistics are :func:`rollwise.objectives.advantages.grpo`'s (groups of equal values or of
one member get 0). Paper defaults: ``gamma = 0.95``, ``omega = 1``.

**Reconstructions** (the paper does not say, or its setting has no counterpart here):

- A turn with ``anchor`` None is a step group of its own (``A^S = 0``): rollwise only groups what
  the environment keys. So a **single-turn rollout** (``episode`` None) gets ``A^S = 0`` and
  ``A = A^E``, exactly ``grpo`` with the same ``eps``/``std`` (tested). In the paper every
  episode's initial state is shared by the group, so turn 0 always has a step group; an environment
  that wants that sets ``anchor`` on the first turn (e.g. a key of the prompt).
- Anchors are matched only within a group (one prompt's episodes), as the paper's step groups are
  built inside an episode group; a state visited twice by one episode gives two members.
- The per-turn reward rule (``outcome``) and the unbiased std (as ``grpo``) are rollwise's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from rollwise.objectives.turn_return import episode_table, normalised, turn_advantages, turn_rewards
from rollwise.types import Advantages, Episode


class GigpoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    gamma: float = Field(0.95, ge=0.0, le=1.0, description="Discount of the step-level returns (paper: 0.95).")
    omega: float = Field(1.0, ge=0.0, description="Weight of the step-level advantage (paper: 1).")
    outcome: Literal["if_absent", "add"] = Field(
        "if_absent",
        description="Where the trajectory reward goes: on the last turn when no turn has a reward ('if_absent'), "
        "or always added to the last turn's reward ('add') [rollwise].",
    )
    eps: float = Field(1e-6, ge=0.0, description="Added to the std before dividing (as grpo).")
    std: Literal["unbiased", "population"] = Field(
        "unbiased", description="Std estimator of both levels: 'unbiased' (n-1, as grpo) or 'population'."
    )
    scale: Literal["std", "none"] = Field(
        "std", description="F_norm of both levels: the std ('std') or 1 ('none'); both in the paper."
    )


def gigpo(
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    opts: GigpoOptions | None = None,
    *,
    episodes: Sequence[Episode | None] | None = None,
    completion_lengths: torch.Tensor | None = None,
) -> Advantages:
    """Episode-level plus omega times step-level advantage (module docstring).

    Example (tests/unit/objectives/test_obj_episode_credit.py): two episodes of one prompt whose
    first turns act on the shared anchor "s0"; the other turns have their own anchors, so their
    step-level advantage is 0 and only the "s0" turns get a step-level term.
    """
    opts = opts or GigpoOptions()
    if group_index.shape != rewards.shape:
        raise ValueError(f"group_index must be (B,) like rewards, got {tuple(group_index.shape)}")
    row_turns, returns, width = episode_table(rewards, episodes, completion_lengths, opts.outcome, opts.gamma)
    episode = episode_level(rewards, group_index, row_turns, opts)
    keys = step_keys(group_index, row_turns)
    return turn_advantages(row_turns, returns, keys, width, opts, base=episode, weight=opts.omega)


def episode_level(rewards: torch.Tensor, group_index: torch.Tensor, row_turns, opts) -> torch.Tensor:
    """(B,) ``A^E``: each episode's total reward normalised within its group (module docstring, 1.;
    also HGPO's episode level, ``objectives/hgpo.py``)."""
    totals = torch.tensor(
        [sum(turn_rewards(t, float(rewards[i]), opts.outcome)) for i, t in enumerate(row_turns)],
        dtype=torch.float32,
    )
    return normalised(totals, group_index, opts.eps, opts.std, opts.scale)


def step_keys(group_index: torch.Tensor, row_turns) -> list[tuple]:
    """The step group of every turn, flat in row-then-turn order (module docstring, 2.): the group and
    the turn's anchor, or a key of its own for a turn without one."""
    return [
        (int(group_index[i]), "anchor", t.anchor) if t.anchor is not None else (int(group_index[i]), "turn", i, k)
        for i, turns in enumerate(row_turns)
        for k, t in enumerate(turns)
    ]


gigpo.Options = GigpoOptions  # type: ignore[attr-defined]
gigpo.inputs = ("episodes", "completion_lengths")  # type: ignore[attr-defined]
gigpo.per_token = True  # type: ignore[attr-defined]  # always token_values: no sequence-level objective (compat.check)
gigpo.needs_anchors = True  # type: ignore[attr-defined]  # groups by Turn.anchor (compat.check_episode_credit)
