"""``turn_return``: turn-discounted returns of multi-turn episodes, normalised within the group (issue #30).

An episode is one ``Rollout`` whose ``Rollout.episode.turns[k]`` names turn k's policy tokens
``[start, end)`` and its observation tokens ``[end, obs_end)`` (``rollwise.types.Turn``). For each
turn k of a row:

1. **Per-turn rewards** ``r_k`` (:func:`turn_rewards`): ``Turn.reward`` (None counts 0). The row's
   trajectory reward (the ``rewards`` the estimator is given: ``Verdict.score`` after shaping) is put
   on the last turn when *no* turn carries a reward (``outcome = "if_absent"``, default: sparse
   environments, the usual case), or always added to it (``"add"``: an environment that gives
   intermediate rewards *and* a final verdict). Both are rollwise's choices.
2. **Return** ``G_k = sum_{j >= k} gamma^(j - k) r_j`` (:func:`discounted_returns`).
3. **Normalisation** ``A_k = (G_k - mean) / (std + eps)`` through :func:`rollwise.objectives.advantages.grpo`
   (the group statistics live in ``objectives/groups.py``; a set of equal returns or a set of one
   gets 0). ``normalise = "turn_index"`` (default) compares turn k of a row with turn k of the
   other rows of its group (the rows that reach turn k), as MT-GRPO normalises turn-level rewards
   per turn across the group (Zeng et al., "Reinforcing Multi-Turn Reasoning in LLM Agents via
   Turn-Level Credit Assignment", arXiv 2505.11821): returns at different depths sum different
   numbers of terms, so the same depth is the like-for-like baseline. ``normalise = "group"`` pools
   every turn of the group (one baseline for the prompt's state-action pairs, closer to a
   batch-normalised return).
4. **Tokens** (``Advantages.token_values``): turn k's policy tokens carry ``A_k``; observation
   tokens carry 0 (they have loss mask 0, ``rollwise/collate.py``). ``Advantages.values`` is ``A_0``
   (the first turn's, i.e. the whole trajectory's return), the per-row summary.

A single-turn rollout (``episode`` None) is one turn over its whole completion with ``G_0 = r``:
a batch of them gets exactly ``grpo`` with the same ``eps`` and ``std`` (tested), for either
``normalise``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from rollwise.objectives.advantages import GrpoOptions, grpo
from rollwise.types import Advantages, Episode, Turn


class TurnReturnOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    gamma: float = Field(1.0, ge=0.0, le=1.0, description="Discount of later turns' rewards in each turn's return.")
    normalise: Literal["turn_index", "group"] = Field(
        "turn_index",
        description="Baseline set of a turn's return: the group's turns at the same index ('turn_index', as "
        "MT-GRPO, arXiv 2505.11821) or every turn of the group ('group').",
    )
    outcome: Literal["if_absent", "add"] = Field(
        "if_absent",
        description="Where the trajectory reward goes: on the last turn when no turn has a reward ('if_absent'), "
        "or always added to the last turn's reward ('add').",
    )
    eps: float = Field(1e-6, ge=0.0, description="Added to the std before dividing (as grpo).")
    std: Literal["unbiased", "population"] = Field(
        "unbiased", description="Std estimator of the normalisation: 'unbiased' (n-1, as grpo) or 'population'."
    )
    scale: Literal["std", "none"] = Field(
        "std", description="Divide the centred returns by the std ('std') or only centre them ('none', Dr. GRPO-like)."
    )


# ---------------------------------------------------------------- shared by turn_return and gigpo


def turns_of(episode: Episode | None, length: int, row: int = 0) -> tuple[Turn, ...]:
    """The row's turns, checked against its ``length`` completion tokens; a single-turn rollout
    (``episode`` None, or an episode without turns) is one turn over the whole completion."""
    if episode is None or not episode.turns:
        return (Turn(0, length, length),)
    last = 0
    for k, t in enumerate(episode.turns):
        if not (last <= t.start <= t.end <= t.obs_end <= length):
            raise ValueError(
                f"row {row}: turn {k} [{t.start}, {t.end}, {t.obs_end}) is out of order or past its {length} "
                "completion tokens"
            )
        last = t.obs_end
    return episode.turns


def turn_rewards(turns: Sequence[Turn], outcome: float, mode: str) -> list[float]:
    """``r_k`` of each turn (module docstring, 1.). Example: rewards (None, 0.5, None), outcome 1:
    'if_absent' -> [0, 0.5, 0]; 'add' -> [0, 0.5, 1]; rewards all None -> [0, 0, 1] either way."""
    r = [0.0 if t.reward is None else float(t.reward) for t in turns]
    if mode == "add" or all(t.reward is None for t in turns):
        r[-1] += float(outcome)
    return r


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """``G_k = r_k + gamma * G_{k+1}``. Example: r = [0, 1, 2], gamma 0.5 -> [1.0, 2.0, 2.0]."""
    out, g = [0.0] * len(rewards), 0.0
    for k in range(len(rewards) - 1, -1, -1):
        g = rewards[k] + gamma * g
        out[k] = g
    return out


def labels(keys: Sequence) -> torch.Tensor:
    """(N,) long: one integer per distinct key, for ``Groups`` (first-seen order)."""
    index: dict = {}
    return torch.tensor([index.setdefault(k, len(index)) for k in keys], dtype=torch.long)


def normalised(x: torch.Tensor, label: torch.Tensor, eps: float, std: str, scale: str) -> torch.Tensor:
    """``(x - mean) / (std + eps)`` within each label (``scale = "none"``: ``x - mean``), 0 for a
    label whose values are equal or that has one member: the ``grpo`` estimator on ``x``."""
    if x.numel() == 0:
        return x
    opts = GrpoOptions(eps=eps, std=std, scale="group" if scale == "std" else "none")
    return grpo(x, label, opts).values


def place_turns(
    row_turns: Sequence[Sequence[Turn]], turn_values: Sequence[Sequence[float]], width: int
) -> torch.Tensor:
    """(B, width): turn k's policy tokens of row i get ``turn_values[i][k]``, every other position 0."""
    out = torch.zeros((len(row_turns), width))
    for i, (turns, vals) in enumerate(zip(row_turns, turn_values)):
        for t, v in zip(turns, vals):
            out[i, t.start : t.end] = float(v)
    return out


def turn_advantages(row_turns, returns, keys, width: int, opts, base=None, weight: float = 1.0) -> Advantages:
    """Every turn's return ``returns[i][k]`` normalised among the turns that share its key (``keys``,
    flat in row-then-turn order); turn k of row i gets ``base[i] + weight *`` that (``base`` None: 0)
    on its policy tokens, and the row's summary ``values`` is its first turn's."""
    flat = torch.tensor([x for g in returns for x in g], dtype=torch.float32)
    adv = normalised(flat, labels(keys), opts.eps, opts.std, opts.scale)
    return spread_turns(row_turns, returns, adv, width, base, weight)


def spread_turns(row_turns, returns, adv: torch.Tensor, width: int, base=None, weight: float = 1.0) -> Advantages:
    """Turn k of row i gets ``base[i] + weight * adv[...]`` (``adv`` flat in row-then-turn order, one
    value per entry of ``returns``) on its policy tokens; the row's summary ``values`` is its first turn's."""
    per_turn, at = [], 0
    for i, g in enumerate(returns):
        shift = 0.0 if base is None else float(base[i])
        per_turn.append([shift + weight * float(a) for a in adv[at : at + len(g)]])
        at += len(g)
    values = torch.tensor([v[0] for v in per_turn], dtype=torch.float32)
    return Advantages(
        values, torch.ones_like(values, dtype=torch.bool), token_values=place_turns(row_turns, per_turn, width)
    )


def episode_table(rewards: torch.Tensor, episodes, completion_lengths, outcome: str, gamma: float):
    """``(row_turns, returns, width)``: each row's turns (:func:`turns_of`), each turn's return
    ``G_k`` (:func:`turn_rewards`, :func:`discounted_returns`) and the longest completion."""
    b = rewards.numel()
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be (B,), got {tuple(rewards.shape)}")
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards contain NaN or inf (an unverified rollout must be dropped, not scored)")
    eps_list = list(episodes) if episodes is not None else [None] * b
    if completion_lengths is None:
        raise ValueError("multi-turn advantages need completion_lengths (objectives.inputs.advantage_inputs)")
    lengths = [int(x) for x in completion_lengths.tolist()]
    if len(eps_list) != b or len(lengths) != b:
        raise ValueError(f"episodes ({len(eps_list)}) and completion_lengths ({len(lengths)}) must have {b} rows")
    row_turns = [turns_of(e, n, i) for i, (e, n) in enumerate(zip(eps_list, lengths))]
    returns = [discounted_returns(turn_rewards(t, float(rewards[i]), outcome), gamma) for i, t in enumerate(row_turns)]
    return row_turns, returns, max(lengths, default=0)


# ---------------------------------------------------------------- the estimator


def turn_return(
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    opts: TurnReturnOptions | None = None,
    *,
    episodes: Sequence[Episode | None] | None = None,
    completion_lengths: torch.Tensor | None = None,
) -> Advantages:
    """Group-normalised turn-discounted returns (module docstring).

    Example (one group, gamma 0.5, no per-turn rewards, unbiased std, eps 0): row a has 2 turns and
    outcome 1, row b 2 turns and outcome 0 -> r_a = [0, 1], r_b = [0, 0]; G_a = [0.5, 1],
    G_b = [0, 0]; at turn 0 mean 0.25, std 0.35355 -> A = +-0.7071, at turn 1 mean 0.5, std 0.7071
    -> A = +-0.7071 (tests/unit/objectives/test_obj_episode_credit.py works a 3-row case).
    """
    opts = opts or TurnReturnOptions()
    if group_index.shape != rewards.shape:
        raise ValueError(f"group_index must be (B,) like rewards, got {tuple(group_index.shape)}")
    row_turns, returns, width = episode_table(rewards, episodes, completion_lengths, opts.outcome, opts.gamma)
    keys = [
        (int(group_index[i]), k) if opts.normalise == "turn_index" else int(group_index[i])
        for i, g in enumerate(returns)
        for k in range(len(g))
    ]
    return turn_advantages(row_turns, returns, keys, width, opts)


turn_return.Options = TurnReturnOptions  # type: ignore[attr-defined]
turn_return.inputs = ("episodes", "completion_lengths")  # type: ignore[attr-defined]
turn_return.per_token = True  # type: ignore[attr-defined]  # always token_values: no sequence-level objective (compat.check)
