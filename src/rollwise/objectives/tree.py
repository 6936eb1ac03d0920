"""``tree``: BranchGRPO's depth-wise tree advantage, for tree-structured groups (LATR rollouts).

Paper: "BranchGRPO: Stable and Efficient GRPO with Structured Branching in Diffusion Models",
arXiv 2509.06040; spec: systems.md §7 (read from the released diffusion code) and its
"Transfer to LLMs" paragraph, which is **[inferred]**: a node is a token segment between branch
points (``Rollout.tree``, written by ``rollwise.generate.latr``), and each segment's tokens get
its node's advantage. Close in spirit to TreeRL / TreeAdv.

For the rows of one group (the prompt is depth 0, ``TreePath.nodes[d]`` is at depth d + 1):

1. **Reward fusion.** A leaf (a row) has its verified reward. An internal node's reward is the
   mean of its leaves' rewards (``fusion="mean"``, default), or ``sum_c softmax_c(alpha * lp_c) R(c)``
   over its children (``"prob_weighted"``) with ``lp_c`` the summed sampler log-prob of child c's
   segment [inferred for tokens: the diffusion code uses the transition's log-prob].
2. **Depth-wise normalisation.** Nodes of the group at the same depth:
   ``A = (R - mean_d) / (std_d + eps)``; ``A = 0`` when the depth has one node or
   ``std_d < min_std`` (BranchGRPO: eps 1e-8, min_std 1e-6).
3. **Per token** (``per_token=True``, default): completion tokens ``starts[d]:starts[d+1]`` of a
   row get ``A(nodes[d])`` (``Advantages.token_values``; the ``grpo``/``dapo``/``decoupled_ppo``/
   ``cispo`` objectives read it). ``Advantages.values`` is the leaf's advantage, the per-sequence
   form used when ``per_token=False``.
4. **Gradient pruning** (optional): tokens of nodes whose depth is in ``prune_depths`` leave the
   loss (``Advantages.token_include``); rewards, leaves and advantages are unchanged. Only
   BranchGRPO's fixed depth pruning; its sliding window and width pruning are not implemented.

A row without a tree path (sampled i.i.d., ``Rollout.tree is None``) is a one-node path: a
depth-1 leaf beside the tree's trunk. So a **flat group** (no tree) is exactly ``grpo`` with the
same ``eps`` and ``std`` (up to ``min_std``: rewards whose std is below it give 0).

Deviations: ``std`` defaults to the unbiased estimator (torch's default, as ``grpo``; the spec does
not say which); shared tokens appear in several rows and so enter the loss once per row (as in
TreeRL); a group mixing i.i.d. rows and a tree puts the i.i.d. leaves at depth 1 with the trunk
[inferred].
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from rollwise.objectives.groups import Groups
from rollwise.types import Advantages, TreePath


class TreeOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    eps: float = Field(1e-8, ge=0.0, description="Added to the depth std before dividing (BranchGRPO: 1e-8).")
    min_std: float = Field(
        1e-6, ge=0.0, description="Depths whose reward std is below this get advantage 0 (BranchGRPO: 1e-6)."
    )
    std: Literal["unbiased", "population"] = Field(
        "unbiased", description="Depth std estimator: 'unbiased' (n-1, as grpo) or 'population' (n)."
    )
    fusion: Literal["mean", "prob_weighted"] = Field(
        "mean",
        description="Internal node reward: mean of its leaves, or softmax(alpha * child segment log-prob)-weighted "
        "children.",
    )
    alpha: float = Field(1.0, description="alpha of the probability-weighted fusion (BranchGRPO: 1.0).")
    per_token: bool = Field(
        True,
        description="Give each segment's tokens its node's advantage (false: every token of a row gets its leaf's "
        "advantage).",
    )
    prune_depths: list[int] = Field(
        default_factory=list,
        description="Node depths (1 = first segment) whose tokens leave the loss (BranchGRPO depth pruning; [] = "
        "none).",
    )


def tree(
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    opts: TreeOptions | None = None,
    *,
    tree_paths: Sequence[TreePath | None] | None = None,
    completion_logprobs: Sequence[Sequence[float]] | None = None,
) -> Advantages:
    """Depth-wise normalised node advantages of each group's tree (module docstring).

    Example (one group, the 4-leaf binary tree A -> {B, C}, B -> {L1, L2}, C -> {L3, L4}; rewards
    1, 0, 1, 1; unbiased std, eps 0): depth 1 has one node (A) -> 0; depth 2: R(B) = 0.5,
    R(C) = 1, mean 0.75, std 0.35355 -> A(B) = -0.7071, A(C) = 0.7071; depth 3: mean 0.75, std 0.5
    -> A = 0.5, -1.5, 0.5, 0.5.
    """
    opts = opts or TreeOptions()
    if rewards.dim() != 1 or group_index.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_index must both be (B,), got {tuple(rewards.shape)} and {tuple(group_index.shape)}"
        )
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards contain NaN or inf (an unverified rollout must be dropped, not scored)")
    b = rewards.numel()
    paths = list(tree_paths) if tree_paths is not None else [None] * b
    if len(paths) != b:
        raise ValueError(f"tree_paths has {len(paths)} entries for {b} rows")
    if completion_logprobs is not None and len(completion_logprobs) != b:
        raise ValueError(f"completion_logprobs has {len(completion_logprobs)} entries for {b} rows")
    if opts.fusion == "prob_weighted" and completion_logprobs is None:
        raise ValueError("tree advantage fusion='prob_weighted' needs completion_logprobs")
    if opts.per_token and completion_logprobs is None:
        raise ValueError("tree advantage per_token=true needs completion_logprobs (for the completion lengths)")
    rewards = rewards.float()
    lengths = [len(x) for x in completion_logprobs] if completion_logprobs is not None else None

    # ---- the nodes: key (group, node id) or ("row", i) for a row without a path
    key_index: dict = {}
    depth: list[int] = []
    parent: list[int] = []
    seg: list[tuple[int, int, int | None]] = []  # a representative (row, start, end) of each node's tokens
    row_nodes: list[list[int]] = []
    row_starts: list[tuple[int, ...]] = []
    for i, p in enumerate(paths):
        g = int(group_index[i])
        if p is None:
            nodes, starts = [("row", i)], (0,)
        else:
            if (
                not p.nodes
                or len(p.nodes) != len(p.starts)
                or p.starts[0] != 0
                or any(x > y for x, y in zip(p.starts, p.starts[1:]))
            ):
                raise ValueError(f"row {i}: bad tree path {p} (needs equal lengths, starts[0] == 0, non-decreasing)")
            if lengths is not None and p.starts[-1] > lengths[i]:
                raise ValueError(f"row {i}: tree path starts {p.starts} run past its {lengths[i]} completion tokens")
            nodes, starts = [(g, n) for n in p.nodes], tuple(p.starts)
        ids = []
        for d, key in enumerate(nodes):
            par = ids[-1] if ids else -1
            end = starts[d + 1] if d + 1 < len(starts) else None
            if key not in key_index:
                key_index[key] = len(depth)
                depth.append(d + 1)
                parent.append(par)
                seg.append((i, starts[d], end))
            n = key_index[key]
            if depth[n] != d + 1 or parent[n] != par:
                raise ValueError(f"row {i}: node {key[1]!r} of group {g} appears at two places of the tree")
            ids.append(n)
        row_nodes.append(ids)
        row_starts.append(starts)
    num = len(depth)
    leaf_of = torch.tensor([ids[-1] for ids in row_nodes], dtype=torch.long)

    # ---- 1. reward fusion
    if opts.fusion == "mean":
        pair_node = torch.tensor([n for ids in row_nodes for n in ids], dtype=torch.long)
        pair_reward = torch.cat([rewards[i].expand(len(ids)) for i, ids in enumerate(row_nodes)]) if b else rewards
        node_r = torch.zeros(num)
        node_r[pair_node] = Groups.of(pair_node).mean(pair_reward)  # every node is someone's ancestor-or-leaf
    else:
        node_r = _prob_weighted(rewards, row_nodes, leaf_of, parent, depth, seg, completion_logprobs, opts.alpha, num)

    # ---- 2. depth-wise normalisation among the nodes of a group at one depth
    node_group = torch.zeros(num, dtype=torch.long)
    for i, ids in enumerate(row_nodes):
        node_group[ids] = int(group_index[i])
    node_depth = torch.tensor(depth, dtype=torch.long)
    if num:
        label = Groups.of(node_group * (int(node_depth.max()) + 1) + node_depth)
        n = label.count(node_r)
        std = label.std(node_r, unbiased=opts.std == "unbiased")
        adv = (node_r - label.mean(node_r)) / (std + opts.eps)
        flat = (n < 2) | ~(std >= opts.min_std)  # NaN std (one node) counts as flat
        adv = torch.where(flat, torch.zeros_like(adv), adv)
    else:
        adv = node_r
    values = adv[leaf_of] if b else rewards.clone()
    include = torch.ones(b, dtype=torch.bool)

    # ---- 3./4. per-token values and gradient pruning
    token_values = token_include = None
    if opts.per_token or opts.prune_depths:
        width = max(lengths, default=0) if lengths is not None else 0
        token_values = torch.zeros((b, width)) if opts.per_token else None
        token_include = torch.ones((b, width), dtype=torch.bool) if opts.prune_depths else None
        pruned = set(opts.prune_depths)
        for i, ids in enumerate(row_nodes):
            starts = row_starts[i]
            for d, node in enumerate(ids):
                lo, hi = (
                    starts[d],
                    (starts[d + 1] if d + 1 < len(starts) else lengths[i] if lengths is not None else width),
                )
                if opts.per_token:
                    token_values[i, lo:hi] = adv[node]
                if token_include is not None and depth[node] in pruned:
                    token_include[i, lo:hi] = False
    return Advantages(values, include, token_values=token_values, token_include=token_include)


def _prob_weighted(rewards, row_nodes, leaf_of, parent, depth, seg, logprobs, alpha, num) -> torch.Tensor:
    """Bottom-up ``R(node) = sum_c softmax_c(alpha * lp_c) R(c)``; a leaf keeps its row's reward."""
    node_r = torch.zeros(num)
    is_leaf = torch.zeros(num, dtype=torch.bool)
    is_leaf[leaf_of] = True
    node_r[leaf_of] = rewards
    children: dict[int, list[int]] = {}
    for n, p in enumerate(parent):
        if p >= 0:
            children.setdefault(p, []).append(n)
    for n in sorted(children, key=lambda x: -depth[x]):  # deepest parents first
        if bool(is_leaf[n]):
            raise ValueError(
                "fusion='prob_weighted' needs every row to end at a leaf node (a row ends at an internal node)"
            )
        cs = children[n]
        lp = torch.tensor([float(sum(logprobs[seg[c][0]][seg[c][1] : seg[c][2]])) for c in cs])
        node_r[n] = (torch.softmax(alpha * lp, dim=0) * node_r[cs]).sum()
    return node_r


tree.Options = TreeOptions  # type: ignore[attr-defined]
tree.inputs = ("tree_paths", "completion_logprobs")  # type: ignore[attr-defined]
