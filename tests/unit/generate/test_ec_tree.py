"""EC-Tree rollouts (rollwise/generate/ec_tree.py): the signals, branch plan, width and prune tests on
hand-worked numbers (guidance.md §5.3.8), and the sampler's groups: branches share the base's prefix,
pruned completions are replaced so every group keeps n rollouts."""

from __future__ import annotations

import pytest

from rollwise.config import EcTreeConfig, load_config
from rollwise.generate.ec_tree import EcTreeSampler, Signals, branch_point, prune_at, signals, signals_from, width
from rollwise.generate.forks import sampler_tables
from rollwise.registry import UserError
from rollwise.types import Sampling
from tree_fixtures import arith_prompts, hf_backend, tiny  # noqa: F401 (pytest fixtures)


def _sig(h, cg, dh, tail=None):
    return Signals(list(h), list(cg), list(cg), list(tail if tail is not None else [1.0] * len(h)), list(dh))


# ---------------------------------------------------------------- pure rules, by hand


def test_width_is_the_specs_formula():
    code = EcTreeConfig(branch_threshold=1.2)  # the released constants: H 1.0 / 3.5, alpha 2, beta 1, [1, 4]
    assert width(3.5, 0.6, code) == 4  # 1 + 2 (2.5 / 2.5) - (0.6 - 1.2) / 1.2 = 3.5 -> 4 (half to even)
    assert width(2.0, 1.2, code) == 2  # 1 + 2 (1 / 2.5) - 0 = 1.8 -> 2
    assert width(1.0, 2.4, code) == 1  # 1 + 0 - 1 = 0 -> clipped to min_branches
    assert width(2.25, 1.2, EcTreeConfig(branch_threshold=1.2, alpha=1.0)) == 2  # 1 + 0.5 = 1.5 -> 2 (half to even)


def test_signals_by_hand():
    o = EcTreeConfig(group_window=2, tail_window=3, entropy_window=2)
    s = signals_from([1.0, 3.0, 2.0], [0.2, 0.1, 0.3], o)
    assert s.cg == pytest.approx([0.2, 0.15, 0.2])
    assert s.tail == pytest.approx([0.2, 0.15, 0.2])
    assert s.dh == pytest.approx([0.0, 2.0, 0.0])  # 3 - mean(1); 2 - mean(1, 3)


def test_signals_read_the_sampling_distribution():
    import math

    import torch

    # two positions over a vocabulary of 4: uniform, then (0.7, 0.1, 0.1, 0.1); top-2 confidence
    table = torch.tensor([[0.25] * 4, [0.7, 0.1, 0.1, 0.1]]).log()
    s = signals(table, EcTreeConfig(confidence_top_k=2, group_window=1))
    assert s.h == pytest.approx([math.log(4), -(0.7 * math.log(0.7) + 0.3 * math.log(0.1))], abs=1e-5)
    assert s.c == pytest.approx([0.25, 0.4])


def test_branch_point_is_the_first_position_passing_all_three_gates():
    o = EcTreeConfig(min_depth=1, entropy_high=3.5, branch_threshold=0.1, entropy_jump=0.2)
    #       t:  0    1    2     3     4
    h = [4.0, 3.0, 3.6, 3.6, 3.6]
    cg = [0.0, 0.0, 0.2, 0.1, 0.05]
    dh = [1.0, 1.0, 0.5, 0.1, 0.3]
    # t 0: before min_depth; 1: H < 3.5; 2: C^G above the gate; 3: jump < 0.2; 4: all three
    assert branch_point(_sig(h, cg, dh), o) == 4
    assert branch_point(_sig(h, cg, [0.0] * 5), o) is None


def test_prune_tests_by_hand():
    o = EcTreeConfig(min_depth=1, prune_threshold=0.05, tail_threshold=0.075, spike=0.5)
    flat = [0.0] * 6
    # (i) low confidence: the running minimum of C^G drops below 0.05 at t = 3
    assert prune_at(_sig(flat, [0.2, 0.1, 0.06, 0.04, 0.3, 0.3], flat), o) == 3
    # a dip before min_depth is in the running minimum: pruned at the first tested step
    assert prune_at(_sig(flat, [0.01, 0.3, 0.3], flat[:3]), o) == 1
    # (ii) tail decline: C_tail fell at t = 1, 2, 3 (3 steps running) and 0.07 <= 0.075 at t = 3
    assert prune_at(_sig(flat, [0.2] * 6, flat, tail=[0.1, 0.09, 0.08, 0.07, 0.07, 0.07]), o) == 3
    assert prune_at(_sig(flat, [0.2] * 6, flat, tail=[0.1, 0.09, 0.085, 0.08, 0.08, 0.08]), o) is None  # above
    assert prune_at(_sig(flat, [0.2] * 6, flat, tail=[0.1, 0.09, 0.09, 0.08, 0.07, 0.06]), o) == 5  # 3, 4, 5
    # (iii) entropy spike: dH > 0 at t = 2, 3, 4 and > 0.5 at t = 4
    assert prune_at(_sig(flat, [0.2] * 6, [0.0, 0.0, 0.1, 0.2, 0.6, 0.0]), o) == 4
    assert prune_at(_sig(flat, [0.2] * 6, [0.0, 0.0, -0.1, 0.2, 0.6, 0.0]), o) is None  # not 3 running


# ---------------------------------------------------------------- the sampler

# The tiny model with random weights is near-uniform: H ~ 4.55 nats, C (top-5 mean) ~ 0.019 at every
# position. The gates below are set around those values so that each base branches at min_depth.
GATES = dict(enabled=True, min_depth=1, entropy_high=4.0, entropy_jump=-1.0, branch_threshold=0.03)


def test_a_base_branches_at_the_first_gated_position_and_branches_share_its_prefix(hf_backend, arith_prompts):
    be = hf_backend()
    smp = Sampling(1.0, 1.0, 8)
    o = EcTreeConfig(**GATES, prune_threshold=0.0, tail_threshold=0.0, spike=100.0)  # no pruning
    s = EcTreeSampler(be, o)
    prompts = arith_prompts
    out, decoded = s.generate(prompts, [6, 6], smp)
    assert [len(g) for g in out] == [6, 6]  # base + 3 branches + 2 top-ups each
    tables = sampler_tables(be, prompts, [g[0][0].token_ids for g in out], smp)
    expected = 0
    for g, table in zip(out, tables):
        base, base_path = g[0]
        sig = signals(table, o)
        t = branch_point(sig, o)
        assert t == 1
        w = width(sig.h[t], sig.cg[t], o)
        assert w == 4  # 1 + 2 (4.55 - 1) / 3 - (0.019 - 0.03) / 0.03 = 3.7 -> 4
        top = set(table[t].topk(w).indices.tolist())
        branches = g[1:w]
        firsts = {c.token_ids[t] for c, _ in branches}
        assert len(firsts) == w - 1 and firsts <= top and base.token_ids[t] not in firsts  # the top w, less its own
        for c, path in branches:
            assert c.token_ids[:t] == base.token_ids[:t] and c.token_ids[t] != base.token_ids[t]
            assert path.starts == (0, t) and path.nodes[0] == base_path.nodes[0]
            expected += len(c.token_ids) - t
        assert all(p is None for _, p in g[w:])  # top-ups
        expected += len(base.token_ids) + sum(len(c.token_ids) for c, _ in g[w:])
    assert decoded == expected  # shared prefixes decoded once
    assert s.last_stats == {"branches_born": 6, "branches_pruned": 0, "topped_up": 4, "pruned_tail_tokens": 0}


def test_completions_below_the_confidence_gate_are_pruned_and_topped_up_to_n(hf_backend, arith_prompts):
    smp = Sampling(1.0, 1.0, 8)
    o = EcTreeConfig(**GATES, prune_threshold=1.0)  # every C^G (~0.019) is below: all pruned at min_depth
    s = EcTreeSampler(hf_backend(), o)
    out, decoded = s.generate(arith_prompts, [3, 5], smp)
    assert [len(g) for g in out] == [3, 5]  # the leaf count is kept
    assert all(p is None for g in out for _, p in g)  # ... by fresh independent samples
    st = s.last_stats
    assert st["branches_born"] == 6 and st["branches_pruned"] == 8 and st["topped_up"] == 8  # 2 x (base + 3)
    assert st["pruned_tail_tokens"] > 0  # tokens after the prune point (decoded, charged)
    fresh = sum(len(c.token_ids) for g in out for c, _ in g)
    assert decoded > fresh  # the pruned tree's tokens are charged too
    # the same gates without pruning keep the tree
    kept, _ = EcTreeSampler(
        hf_backend(), EcTreeConfig(**GATES, prune_threshold=0.0, tail_threshold=0.0, spike=100.0)
    ).generate(arith_prompts, [3, 5], smp)
    assert [sum(p is not None for _, p in g) for g in kept] == [3, 4]  # at most n; base + 3 branches


# ---------------------------------------------------------------- refusals at load


def test_options_and_combinations_are_refused_at_load_naming_the_key():
    with pytest.raises(UserError, match="sampling.ec_tree.min_branches"):
        load_config(overrides=["sampling.ec_tree.enabled=true", "sampling.ec_tree.min_branches=5"])
    for extra, needle in [
        (["model.backend=vllm"], "decode hooks"),
        (["sampling.latr.enabled=true"], "sampling.latr.enabled cannot be combined with sampling.ec_tree.enabled"),
        (["replay.name=spec_rl"], "sampling.ec_tree.enabled cannot be combined with replay 'spec_rl'"),
        (["advantage.name=poise", "value.enabled=true"], "sampling.ec_tree.enabled (rows chosen together"),
    ]:
        with pytest.raises(UserError) as e:
            load_config(overrides=["sampling.ec_tree.enabled=true", *extra])
        assert needle in str(e.value)
