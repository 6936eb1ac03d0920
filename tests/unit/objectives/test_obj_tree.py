"""BranchGRPO tree advantage (objectives/tree.py, systems.md §7 unit-testable properties)."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from rollwise.collate import collate
from rollwise.objectives import ADVANTAGES
from rollwise.objectives.advantages import GrpoOptions, grpo
from rollwise.objectives.grpo import loss as grpo_loss
from rollwise.objectives.inputs import advantage_inputs
from rollwise.objectives.tree import TreeOptions, tree
from rollwise.types import Rollout, TreePath, Verdict

# The 4-leaf binary tree of one group: A -> {B, C}, B -> {L1, L2}, C -> {L3, L4}.
# Completions have 6 tokens: A = tokens 0-1, B/C = 2-3, leaves = 4-5.
FOUR = [
    TreePath((0, 1, 3), (0, 2, 4)),
    TreePath((0, 1, 4), (0, 2, 4)),
    TreePath((0, 2, 5), (0, 2, 4)),
    TreePath((0, 2, 6), (0, 2, 4)),
]
LPS = [(-0.1,) * 6] * 4


def run(rewards, paths, groups=None, lps=None, **opts):
    b = len(rewards)
    return tree(
        torch.tensor(rewards, dtype=torch.float32),
        torch.tensor(groups or [0] * b),
        TreeOptions(**opts),
        tree_paths=paths,
        completion_logprobs=lps if lps is not None else [(-0.1,) * 6] * b,
    )


def test_hand_worked_four_leaf_tree():
    # rewards L1..L4 = 1, 0, 1, 1 (mean fusion): R(B) = 0.5, R(C) = 1, R(A) = 0.75
    # depth 1: only A -> 0
    # depth 2: mean 0.75, unbiased std sqrt(2 * 0.25^2 / 1) = 0.353553 -> A(B) = -0.7071, A(C) = +0.7071
    # depth 3: mean 0.75, unbiased std sqrt((3 * 0.0625 + 0.5625) / 3) = 0.5 -> 0.5, -1.5, 0.5, 0.5
    a = run([1, 0, 1, 1], FOUR, eps=0.0)
    assert torch.allclose(a.values, torch.tensor([0.5, -1.5, 0.5, 0.5]), atol=1e-5)
    s = 1 / math.sqrt(2)
    expect_row1 = torch.tensor([0, 0, -s, -s, -1.5, -1.5])
    expect_row3 = torch.tensor([0, 0, s, s, 0.5, 0.5])
    assert torch.allclose(a.token_values[1], expect_row1, atol=1e-5)
    assert torch.allclose(a.token_values[3], expect_row3, atol=1e-5)
    assert a.include.all() and a.token_include is None


def test_leaves_and_mean_fusion_properties():
    # Property 1: 2 splits -> 2^2 = 4 leaves; every internal node's reward is the mean of its leaves,
    # visible through the depth means: depth-2 node rewards average to the leaf mean.
    assert len({p.nodes[-1] for p in FOUR}) == 2**2
    # Property 2: per depth with > 1 node and std > 0 -> mean 0, std 1 (unbiased); single-node depth -> 0.
    a = run([0.3, 0.9, 0.1, 0.5], FOUR)
    leaf = a.values
    assert abs(float(leaf.mean())) < 1e-5 and abs(float(leaf.std()) - 1) < 1e-4
    depth2 = a.token_values[[0, 2], 2]
    assert abs(float(depth2.mean())) < 1e-5 and abs(float(depth2.std()) - 1) < 1e-4
    assert float(a.token_values[:, :2].abs().max()) == 0.0
    # population std: std over nodes at a depth is 1 with n in the denominator
    p = run([0.3, 0.9, 0.1, 0.5], FOUR, std="population")
    assert abs(float(p.values.std(unbiased=False)) - 1) < 1e-4


def test_prob_weighted_with_equal_edge_logprobs_equals_mean():
    # Property 3: every child segment has the same summed log-prob -> softmax weights are uniform
    m = run([1, 0, 0.2, 1], FOUR)
    w = run([1, 0, 0.2, 1], FOUR, fusion="prob_weighted", alpha=1.0)
    assert torch.allclose(m.values, w.values, atol=1e-6) and torch.allclose(m.token_values, w.token_values, atol=1e-6)
    # unequal: L1's segment is more likely -> R(B) leans towards L1's reward 1 (B's advantage rises)
    lps = [(-0.1,) * 4 + (0.0, 0.0), (-0.1,) * 4 + (-3.0, -3.0), (-0.1,) * 6, (-0.1,) * 6]
    u = run([1, 0, 0.2, 1], FOUR, lps=lps, fusion="prob_weighted")
    assert float(u.token_values[0, 2]) > float(m.token_values[0, 2])


def test_depth_pruning_changes_training_tokens_not_rewards_or_advantages():
    # Property 4: pruning removes transitions from the backward pass only
    a = run([1, 0, 1, 1], FOUR)
    p = run([1, 0, 1, 1], FOUR, prune_depths=[2])
    assert torch.equal(a.values, p.values) and torch.equal(a.token_values, p.token_values)
    assert p.token_include[:, 2:4].logical_not().all() and p.token_include[:, [0, 1, 4, 5]].all()
    rows = [Rollout("p", (1, 2), (5,) * 6, LPS[i], "length", 0, verdict=Verdict(r)) for i, r in enumerate([1, 0, 1, 1])]
    rw = torch.tensor([1.0, 0, 1, 1])
    full = collate(rows, rw, torch.zeros(4, dtype=torch.long), a, pad_id=0)
    pruned = collate(rows, rw, torch.zeros(4, dtype=torch.long), p, pad_id=0)
    assert full.num_loss_tokens == 24 and pruned.num_loss_tokens == 16
    assert torch.equal(full.rewards, pruned.rewards)


def test_flat_group_reduces_to_grpo():
    # no tree paths: every row is a depth-1 leaf -> exactly grpo with the same eps / std
    r = [0.2, 1.0, 0.0, 0.7, 1, 0, 0, 1, 1]
    g = [0, 0, 0, 0, 1, 1, 1, 7, 7]
    a = run(r, [None] * 9, groups=g)
    expect = grpo(torch.tensor(r), torch.tensor(g), GrpoOptions(eps=1e-8)).values
    assert torch.allclose(a.values, expect, atol=1e-6)
    assert torch.allclose(a.token_values, a.values[:, None].expand(9, 6), atol=1e-6)
    # a single-node tree per row (paths of length one) is the same flat group
    one = run(r, [TreePath((100 + i,), (0,)) for i in range(9)], groups=g)
    assert torch.allclose(one.values, expect, atol=1e-6)
    # equal rewards -> exactly 0
    assert float(run([1, 1, 1], [None] * 3).values.abs().max()) == 0.0


def test_groups_are_separate_and_iid_rows_sit_beside_the_trunk():
    # group 0: the 4-leaf tree; group 1: the same node ids -> keyed by group, so no clash
    r = [1, 0, 1, 1, 1, 0, 1, 1]
    a = run(r, FOUR + FOUR, groups=[0] * 4 + [1] * 4)
    assert torch.allclose(a.values[:4], a.values[4:])
    # a tree of 2 leaves plus 2 i.i.d. rows: depth 1 holds the trunk (R = mean of its leaves) and the two rows
    paths = [TreePath((0, 1), (0, 3)), TreePath((0, 2), (0, 3)), None, None]
    m = run([1, 0, 1, 0], paths)
    # depth 1: R = [0.5 (trunk), 1, 0]: mean 0.5, unbiased std 0.5 -> trunk 0, rows 1 and -1
    assert torch.allclose(m.values[2:], torch.tensor([1.0, -1.0]), atol=1e-5)
    assert float(m.token_values[0, :3].abs().max()) < 1e-6


def test_per_sequence_mode_and_validation():
    a = run([1, 0, 1, 1], FOUR, per_token=False)
    assert a.token_values is None and torch.allclose(a.values, torch.tensor([0.5, -1.5, 0.5, 0.5]), atol=1e-5)
    with pytest.raises(ValueError, match="appears at two places"):
        run([1, 0], [TreePath((0, 1), (0, 2)), TreePath((1, 0), (0, 2))])
    with pytest.raises(ValueError, match="bad tree path"):
        run([1, 0], [TreePath((0,), (1,)), None])
    with pytest.raises(ValidationError):
        TreeOptions(fusion="max")
    assert ADVANTAGES.get("tree") is tree


def test_inputs_collate_and_loss_use_per_token_advantages():
    rows = [
        Rollout("p", (1, 2), (5,) * 6, LPS[i], "length", 0, verdict=Verdict(r), tree=FOUR[i])
        for i, r in enumerate([1, 0, 1, 1])
    ]
    kw = advantage_inputs(tree, rows)
    assert kw["tree_paths"] == FOUR and kw["completion_logprobs"] == LPS
    rw = torch.tensor([1.0, 0, 1, 1])
    a = tree(rw, torch.zeros(4, dtype=torch.long), TreeOptions(), **kw)
    batch = collate(rows, rw, torch.zeros(4, dtype=torch.long), a, pad_id=0)
    assert batch.token_advantages.shape == batch.loss_mask.shape
    assert torch.allclose(batch.token_advantages[:, 2:], a.token_values)  # prompt of 2 tokens, then completion
    assert float(batch.token_advantages[:, :2].abs().max()) == 0.0
    # the grpo loss at ratio 1 is -sum(A_t) / num_loss_tokens over loss tokens
    new = batch.old_logprobs.clone().requires_grad_(True)
    out = grpo_loss(batch, new)
    assert abs(float(out.loss.detach()) + float(a.token_values.sum()) / batch.num_loss_tokens) < 1e-5
    # and micro-batches sum to the full loss (token advantages are sliced with the rows)
    parts = sum(
        float(
            grpo_loss(
                batch.rows(slice(i, i + 1)), new[i : i + 1, : batch.rows(slice(i, i + 1)).input_ids.shape[1]]
            ).loss.detach()
        )
        for i in range(4)
    )
    assert abs(parts - float(out.loss.detach())) < 1e-5


def test_config_refuses_per_token_advantages_with_sequence_level_gspo():
    from rollwise.config import load_config
    from rollwise.registry import UserError

    with pytest.raises(UserError, match="per_token"):
        load_config(overrides=["advantage.name=tree", "objective.name=gspo"])
    load_config(overrides=["advantage.name=tree", "objective.name=gspo", "advantage.options.per_token=false"])
    with pytest.raises(UserError, match="fusion"):
        load_config(overrides=["advantage.name=tree", "advantage.options.fusion=max"])
