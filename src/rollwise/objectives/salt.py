"""``salt``: step-level advantages from a graph of a prompt's trajectories (issue #44).

Paper: Li, Wang, Yan, Tian, Xu, Song, Xu, Cheong, "SALT: Step-level Advantage Assignment for
Long-horizon Agents via Trajectory Graph", arXiv 2510.20022 (EACL 2026 Findings); the working
specification is the SALT entry of the project's agentic specifications (issue #44). The
trajectories of one prompt often share steps (the same first tool call, the same reply to the same
feedback). Trajectory GRPO gives every step of a trajectory its
outcome advantage, so a step that successful and failed trajectories both take is pushed up in the
ones and down in the others. SALT merges identical steps into one node of a graph and gives each
step the aggregate of the outcome advantages of the trajectories that pass through its node:

1. **Outcome advantage** ``A_i``: the group's trajectory rewards normalised as ``grpo`` does
   (:func:`rollwise.objectives.turn_return.normalised`: ``(R_i - mean) / (std + eps)``, or centred
   only with ``scale = "none"``; 0 for a group of one or of equal rewards).
2. **Nodes**: turn j of row i is the node keyed by its group and the token ids of its completion up
   to the end of its action, ``completion_ids[:turns[j].end]``: the whole history (earlier actions
   and observations) plus the action. Two steps are one node exactly when they took the same action
   after the same history, so the graph of a prompt is the prefix tree of its trajectories.
3. **Step advantage**: the mean of ``A_i`` over the rows through the node, on the turn's policy
   tokens (observation tokens carry 0). A step every trajectory of the group shares gets the group's
   mean outcome advantage, which is 0 (neutral); a step taken only by successful trajectories keeps a
   positive sign, one taken only by failed ones a negative sign (decisive). ``values`` (the row
   summary) is the first turn's.

A single-turn rollout (``episode`` None) is one step over its whole completion: identical
completions form one node, so rows get ``grpo``'s advantages whenever identical completions got the
same reward (tested).

**Reconstructions** [RECON]: the aggregation over a node is the mean (the specification's choice;
the paper's exact rule was not retrieved); "identical steps" are equal token ids after an equal
history (a hash of the history and the action text, as the specification's minimal build keys them,
would also merge differently tokenised equal texts, which sampled rollouts rarely produce); the
outcome advantage is GRPO's (the paper also plugs into RLOO, not offered here).

Refused at load (``rollwise.compat.check_episode_credit``) on a task that makes single-turn rollouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from rollwise.objectives.turn_return import episode_table, labels, normalised, spread_turns
from rollwise.types import Advantages, Episode


class SaltOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    eps: float = Field(1e-6, ge=0.0, description="Added to the std of the outcome advantage (as grpo).")
    std: Literal["unbiased", "population"] = Field(
        "unbiased", description="Std estimator of the outcome advantage: 'unbiased' (n-1, as grpo) or 'population'."
    )
    scale: Literal["std", "none"] = Field(
        "std", description="Outcome advantage divided by the group's std ('std') or only centred ('none')."
    )


def salt(
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    opts: SaltOptions | None = None,
    *,
    episodes: Sequence[Episode | None] | None = None,
    completion_lengths: torch.Tensor | None = None,
    completion_ids: Sequence[Sequence[int]] | None = None,
) -> Advantages:
    """Each step's advantage is the mean outcome advantage of the trajectories through its node
    (module docstring).

    Example (tests/unit/objectives/test_obj_salt.py): four trajectories with rewards (1, 0, 0, 0)
    share their first action: A = (1.5, -0.5, -0.5, -0.5) (mean 0.25, unbiased std 0.5), the shared
    first step gets 0; a second step taken by rows 0 and 1 gets (1.5 - 0.5) / 2 = 0.5.
    """
    opts = opts or SaltOptions()
    if group_index.shape != rewards.shape:
        raise ValueError(f"group_index must be (B,) like rewards, got {tuple(group_index.shape)}")
    row_turns, returns, width = episode_table(rewards, episodes, completion_lengths, "if_absent", 1.0)
    if completion_ids is None or len(completion_ids) != len(row_turns):
        raise ValueError("salt needs each row's completion_ids (objectives.inputs.advantage_inputs)")
    outcome = normalised(rewards.float(), group_index, opts.eps, opts.std, opts.scale)
    rows = [i for i, turns in enumerate(row_turns) for _ in turns]
    node = labels(
        [(int(group_index[i]), tuple(completion_ids[i][: t.end])) for i, turns in enumerate(row_turns) for t in turns]
    )
    # a row passes through a node once: (node, row) pairs, deduplicated (an empty turn repeats a prefix)
    through = sorted({(int(n), i) for n, i in zip(node, rows)})
    n_nodes = int(node.max()) + 1 if node.numel() else 0
    total, count = torch.zeros(n_nodes), torch.zeros(n_nodes)
    for n, i in through:
        total[n] += outcome[i]
        count[n] += 1
    step = (total / count.clamp_min(1))[node] if n_nodes else torch.zeros(0)
    return spread_turns(row_turns, returns, step, width)


salt.Options = SaltOptions  # type: ignore[attr-defined]
salt.inputs = ("episodes", "completion_lengths", "completion_ids")  # type: ignore[attr-defined]
salt.per_token = True  # type: ignore[attr-defined]  # always token_values: no sequence-level objective (compat.check)
salt.needs_episodes = True  # type: ignore[attr-defined]  # refused on single-turn tasks (compat.check_episode_credit)
