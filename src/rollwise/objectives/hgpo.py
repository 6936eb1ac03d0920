"""``hgpo``: Hierarchy-of-Groups Policy Optimization's nested step groups for multi-turn episodes (issue #44).

Paper: He, Feng, Wei, Cheng, Feng, An, "Hierarchy-of-Groups Policy Optimization for Long-Horizon
Agentic Tasks", arXiv 2602.22817 (ICLR 2026); the working specification is the HGPO entry of the
project's agentic specifications (issue #44). GiGPO (``objectives/gigpo.py``) groups the turns of one
prompt's episodes that acted in the same state; turns in such a group may have reached that state
through different histories ("context inconsistency"), which biases the step-level baseline. HGPO
assigns every turn to nested groups ``G_0 ⊇ G_1 ⊇ ... ⊇ G_K``:

- level 0: the turns of the group that acted on the same anchor (exactly GiGPO's step group);
- level k: those of them whose last k turns were also the same: the same anchors and the same
  tokens (the policy's actions and the observations after them) from the start of turn ``j - k`` to
  the start of turn j (a turn with fewer than k turns before it compares its whole history, and
  only with turns whose history is as long, so its groups at levels j..K are one group, counted at
  each of those levels).

For a turn with discounted return ``G`` (as GiGPO: ``objectives/turn_return.py``), each level gives
the relative advantage ``A^k = (G - mean_{G_k}) / F_norm`` (the ``grpo`` statistics: 0 in a group
of one or of equal returns), and the levels whose group has at least 2 members are averaged with
weights ``w_k ∝ (k + 1)^alpha``, so deeper (more consistent, smaller) groups count more:
``A^S = sum_k w_k A^k / sum_k w_k`` (0 when no level has 2 members). As in GiGPO, turn j of row i
gets ``A = A^E_i + omega * A^S`` on its policy tokens, ``A^E`` the episode level
(:func:`rollwise.objectives.gigpo.episode_level`). No extra rollouts: only the keys of the groups
change. With ``depth = 0`` only level 0 exists and ``hgpo`` is ``gigpo`` with the same options
(tested on scripted episodes).

**Reconstructions** [RECON] (the public abstract and the specification give no formula):

- the weights ``w_k ∝ (k + 1)^alpha`` over levels with groups of size >= 2 (the paper's weights are
  "adaptive"; ``alpha = 0`` is the plain mean of those levels);
- keeping GiGPO's episode level ``A^E`` and ``omega`` (so that depth 0 is GiGPO);
- "the same last k steps" as equal anchors and equal token ids of those turns (the actions and
  the observations appended after them: what the policy saw), never decoded text;
- as in GiGPO, a turn without an anchor is a group of its own at every level (``A^S = 0``), so a
  single-turn rollout gets ``A = A^E`` (grpo).

Refused at load (``rollwise.compat.check_episode_credit``) on a task that makes single-turn
rollouts and on an environment task that keys no state (``Compat(state_anchors=False)`` on its factory).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from pydantic import Field

from rollwise.objectives.gigpo import GigpoOptions, episode_level, step_keys
from rollwise.objectives.turn_return import episode_table, labels, normalised, spread_turns
from rollwise.types import Advantages, Episode


class HgpoOptions(GigpoOptions):
    depth: int = Field(
        2,
        ge=0,
        le=16,
        description="K, the deepest level: groups share the anchor and the last k turns for k = 0..K "
        "(0 = GiGPO's step groups).",
    )
    alpha: float = Field(
        1.0,
        ge=0.0,
        description="Level weights w_k proportional to (k + 1)^alpha over levels whose group has >= 2 members; "
        "larger favours deeper groups, 0 averages the levels [reconstructed].",
    )


def history_key(ids: Sequence[int], turns, j: int, k: int) -> tuple:
    """What level ``k`` adds to turn ``j``'s key: how many turns it looks back, their anchors and the
    token ids from the start of turn ``j - k`` (or 0) to the start of turn ``j``."""
    first = max(0, j - k)
    return (j - first, tuple(t.anchor for t in turns[first:j]), tuple(ids[turns[first].start : turns[j].start]))


def hgpo(
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    opts: HgpoOptions | None = None,
    *,
    episodes: Sequence[Episode | None] | None = None,
    completion_lengths: torch.Tensor | None = None,
    completion_ids: Sequence[Sequence[int]] | None = None,
) -> Advantages:
    """Episode level plus omega times the weighted nested step levels (module docstring).

    Example (tests/unit/objectives/test_obj_hgpo.py, depth 1, alpha 1): two turns on anchor "s1"
    whose previous turns differ form a level-0 group only; their level-1 groups have one member,
    so ``A^S`` is the level-0 advantage, as in GiGPO.
    """
    opts = opts or HgpoOptions()
    if group_index.shape != rewards.shape:
        raise ValueError(f"group_index must be (B,) like rewards, got {tuple(group_index.shape)}")
    row_turns, returns, width = episode_table(rewards, episodes, completion_lengths, opts.outcome, opts.gamma)
    if opts.depth > 0 and (completion_ids is None or len(completion_ids) != len(row_turns)):
        raise ValueError("hgpo with depth > 0 needs each row's completion_ids (objectives.inputs.advantage_inputs)")
    base_keys = step_keys(group_index, row_turns)
    flat = torch.tensor([x for g in returns for x in g], dtype=torch.float32)
    num, den = torch.zeros_like(flat), torch.zeros_like(flat)
    for k in range(opts.depth + 1):
        keys = (
            base_keys
            if k == 0
            else [
                key + history_key(completion_ids[i], turns, j, k)
                for key, (i, turns, j) in zip(
                    base_keys, ((i, turns, j) for i, turns in enumerate(row_turns) for j in range(len(turns)))
                )
            ]
        )
        label = labels(keys)
        adv = normalised(flat, label, opts.eps, opts.std, opts.scale)
        counted = torch.bincount(label)[label] >= 2
        w = float(k + 1) ** opts.alpha
        num += torch.where(counted, w * adv, torch.zeros_like(adv))
        den += counted.float() * w
    step = torch.where(den > 0, num / den.clamp_min(1e-12), torch.zeros_like(num))
    episode = episode_level(rewards, group_index, row_turns, opts)
    return spread_turns(row_turns, returns, step, width, base=episode, weight=opts.omega)


hgpo.Options = HgpoOptions  # type: ignore[attr-defined]
hgpo.inputs = ("episodes", "completion_lengths", "completion_ids")  # type: ignore[attr-defined]
hgpo.per_token = True  # type: ignore[attr-defined]  # always token_values: no sequence-level objective (compat.check)
hgpo.needs_anchors = True  # type: ignore[attr-defined]  # groups by Turn.anchor (compat.check_episode_credit)
hgpo.needs_episodes = True  # type: ignore[attr-defined]  # refused on single-turn tasks (compat.check_episode_credit)
