"""``portool``: PORTool's step rewards on episode trees and its fork-relative advantage (issue #44).

Paper: Wu, Zhu, Zhang, Chatterjee, Zhu, Mo, Luo, Gao, "PORTool: Tool-Use LLM Training with Rewarded
Tree", arXiv 2510.26020; the working specification is the PORTool entry of the project's agentic
specifications (issue #44). Its credit half; the tree rollouts are ``sampling.branching.mode =
"portool"`` (``rollwise.generate.portool``, on the fork primitive of ``rollwise.generate.branching``).
A group's episodes share the ids before each fork, so its tree is read from the completions:

1. **Nodes.** Turn j of row i is the node keyed by its group and the ids of its completion up to the
   end of its action, ``completion_ids[:turns[j].end]``; the rows through a node are the node's
   descendants (the trajectories that took that step after that history). Its **parent** is the
   history before the action, ``completion_ids[:turns[j].start]``: nodes with one parent are the
   alternatives at one fork.
2. **Step reward** ``R(node) = 1[some descendant answered correctly] + tool_weight * 1[the turn's tool
   calls all succeeded]`` (correct: a trajectory reward at or above ``rollwise.types.CORRECT``; a turn
   without a call gets no tool term). Correctness dominates; a shared step gets one reward, however
   many trajectories pass through it.
3. **Fork-relative advantage** ``A^F(node)``: its step reward normalised among the distinct nodes of
   its parent (``grpo``'s statistics: 0 for an only child or equal rewards).
4. **Blend**: turn j of row i gets ``A = (1 - weight) * A^T_i + weight * A^F(node)`` on its policy
   tokens, ``A^T`` the trajectory-relative advantage (the group's rewards normalised as ``grpo``);
   ``weight = 0`` is trajectory GRPO (tested), observation tokens carry 0.

**Reconstructions** [RECON] (the specification recovered no constants): the blend is convex with one
weight (default 0.5); the tool term is 1 per successful turn times ``tool_weight`` (default 0.1, so
correctness dominates); the fork-relative statistics are over distinct children (a child repeated by
identical branches counts once). Without tree rollouts (no shared actions) every node is an only
child, ``A^F = 0`` and ``portool`` is ``(1 - weight)`` times trajectory GRPO: refused at load
without ``sampling.branching.mode`` (``rollwise.compat.check_branching``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from rollwise.objectives.turn_return import episode_table, labels, normalised, spread_turns
from rollwise.types import CORRECT, Advantages, Episode


class PortoolOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    weight: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="Blend A = (1 - weight) * trajectory + weight * fork-relative advantage (0 = trajectory GRPO) "
        "[reconstructed].",
    )
    tool_weight: float = Field(
        0.1, ge=0.0, description="Step reward's tool term: tool_weight for a turn whose tool calls all succeeded."
    )
    eps: float = Field(1e-6, ge=0.0, description="Added to the std of both advantages (as grpo).")
    std: Literal["unbiased", "population"] = Field(
        "unbiased", description="Std estimator of both advantages: 'unbiased' (n-1, as grpo) or 'population'."
    )
    scale: Literal["std", "none"] = Field(
        "std", description="Both advantages divided by their group's std ('std') or only centred ('none')."
    )


def step_rewards(
    rewards: torch.Tensor, group_index: torch.Tensor, row_turns, completion_ids, tool_weight: float
) -> tuple[list[tuple], list[tuple], list[float]]:
    """(node keys, parent keys, step rewards), flat in row-then-turn order (module docstring, 1.-2.)."""
    nodes = [
        (int(group_index[i]), tuple(completion_ids[i][: t.end])) for i, turns in enumerate(row_turns) for t in turns
    ]
    parents = [
        (int(group_index[i]), tuple(completion_ids[i][: t.start])) for i, turns in enumerate(row_turns) for t in turns
    ]
    rows = [i for i, turns in enumerate(row_turns) for _ in turns]
    solved: dict[tuple, bool] = {}
    for key, i in zip(nodes, rows):
        solved[key] = solved.get(key, False) or float(rewards[i]) >= CORRECT
    tools = [bool(t.tool_calls) and all(c.outcome == "ok" for c in t.tool_calls) for turns in row_turns for t in turns]
    return nodes, parents, [float(solved[k]) + tool_weight * float(ok) for k, ok in zip(nodes, tools)]


def portool(
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    opts: PortoolOptions | None = None,
    *,
    episodes: Sequence[Episode | None] | None = None,
    completion_lengths: torch.Tensor | None = None,
    completion_ids: Sequence[Sequence[int]] | None = None,
) -> Advantages:
    """Trajectory and fork-relative advantages, blended (module docstring).

    Example (tests/unit/objectives/test_obj_portool.py): a tree of three episodes whose first tool
    call is shared by a correct and a wrong one; that step's reward is 1 + tool_weight, a sibling
    step with a failed call and no correct descendant gets 0.
    """
    opts = opts or PortoolOptions()
    if group_index.shape != rewards.shape:
        raise ValueError(f"group_index must be (B,) like rewards, got {tuple(group_index.shape)}")
    row_turns, returns, width = episode_table(rewards, episodes, completion_lengths, "if_absent", 1.0)
    if completion_ids is None or len(completion_ids) != len(row_turns):
        raise ValueError("portool needs each row's completion_ids (objectives.inputs.advantage_inputs)")
    trajectory = normalised(rewards.float(), group_index, opts.eps, opts.std, opts.scale)
    nodes, parents, reward = step_rewards(rewards, group_index, row_turns, completion_ids, opts.tool_weight)
    # one entry per distinct node, normalised among the nodes of its parent (its siblings at the fork)
    node_label = labels(nodes)
    first = {}
    for at, n in enumerate(node_label.tolist()):
        first.setdefault(n, at)
    distinct = sorted(first, key=first.get)
    fork = torch.zeros(len(distinct))
    if distinct:
        per_node = torch.tensor([reward[first[n]] for n in distinct], dtype=torch.float32)
        fork = normalised(per_node, labels([parents[first[n]] for n in distinct]), opts.eps, opts.std, opts.scale)
    step = fork[node_label] if nodes else torch.zeros(0)
    return spread_turns(row_turns, returns, step, width, base=(1.0 - opts.weight) * trajectory, weight=opts.weight)


portool.Options = PortoolOptions  # type: ignore[attr-defined]
portool.inputs = ("episodes", "completion_lengths", "completion_ids")  # type: ignore[attr-defined]
portool.per_token = True  # type: ignore[attr-defined]  # always token_values: no sequence-level objective (compat.check)
portool.needs_episodes = True  # type: ignore[attr-defined]  # refused on single-turn tasks (compat.check_episode_credit)
portool.needs_branching = True  # type: ignore[attr-defined]  # refused without tree rollouts (compat.check_branching)
