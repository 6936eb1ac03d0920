"""LATR tree rollouts (generate/latr.py, systems.md §6 unit-testable properties)."""

from __future__ import annotations

import pytest
import torch

from rollwise.backends.hf import HFBackend
from rollwise.config import TreeSamplingConfig, load_config
from rollwise.distributed.local import LocalPool
from rollwise.generate import latr
from rollwise.generate.latr import LatrSampler, _Branch, mix_ratio, tree_size
from rollwise.tokens import Codec
from rollwise.types import Plan, Prompt, Request, Sampling, Verdict
from tree_fixtures import arith_prompts, hf_backend, tiny  # noqa: F401 (pytest fixtures)


def _opts(**kw):
    base = dict(enabled=True, lookahead=[2, 4], keep_math_symbols=False)
    return TreeSamplingConfig(**(base | kw))


def _segments_agree(group):
    """Rows that share a node have identical tokens on its segment."""
    seen = {}
    for c, p in group:
        for d, (node, lo) in enumerate(zip(p.nodes, p.starts)):
            hi = p.starts[d + 1] if d + 1 < len(p.starts) else len(c.token_ids)
            if node in seen and d + 1 < len(p.nodes):
                assert seen[node] == c.token_ids[lo:hi]
            seen.setdefault(node, c.token_ids[lo:hi])


# ---------------------------------------------------------------- property 4: the schedule


def test_mix_ratio_schedule_takes_largest_key_at_or_below_step():
    s = {0: 1.0, 10: 0.75, 20: 0.5, 80: 0.25, 200: 0.0}
    assert [mix_ratio(s, t) for t in (0, 9, 10, 19, 20, 79, 80, 199, 200, 10_000)] == [
        1,
        1,
        0.75,
        0.75,
        0.5,
        0.5,
        0.25,
        0.25,
        0,
        0,
    ]
    assert mix_ratio({5: 0.5}, 4) == 0.0  # before the first key: no tree
    assert [tree_size(8, e) for e in (1.0, 0.75, 0.5, 0.25, 0.1, 0.0)] == [8, 6, 4, 2, 0, 0]  # round(8 * 0.1) = 1 -> 0


def test_options_are_validated_with_the_key_named():
    from rollwise.registry import UserError

    with pytest.raises(UserError, match="sampling.latr.tau_abz"):
        load_config(overrides=["sampling.latr.tau_abz=1"])
    with pytest.raises(UserError, match="schedule"):
        load_config(overrides=["sampling.latr.schedule={0=1.5}"])
    with pytest.raises(UserError, match="lookahead"):
        load_config(overrides=["sampling.latr.lookahead=[]"])
    assert load_config().sampling.latr.enabled is False  # default: off


# ---------------------------------------------------------------- property 1: tau_abs >= 1 never branches


def test_tau_abs_one_never_branches_and_tree_phase_is_greedy(hf_backend, arith_prompts):
    be = hf_backend()
    s = LatrSampler(be, _opts(tau_abs=1.0, force_return_step=4))
    prompts = arith_prompts
    out, decoded = s.generate(prompts, [4, 3], Sampling(1.0, 1.0, 8))
    assert s.last_stats["branches_born"] == 0
    for prompt, group, k in zip(prompts, out, (4, 3)):
        assert len(group) == k
        greedy = be.generate([prompt], Sampling(0.0, 1.0, 4))[0].token_ids
        heads = {c.token_ids[: len(greedy)] for c, _ in group}
        assert heads == {greedy}  # identical greedy tree phase before the continuation
        if len(greedy) == 4:  # copies split at the exit position: root node, then k children
            assert all(p.starts == (0, 4) and p.nodes[0] == group[0][1].nodes[0] for _, p in group)
            assert len({p.nodes[1] for _, p in group}) == k


def test_no_tree_phase_equals_plain_sampling_with_the_same_generator(tiny, hf_backend, arith_prompts):
    # force_return_step = 0: the tree phase is empty, the fill copies the prompt k times and the
    # continuation is exactly the backend's plain sampling of k rows with the same generator
    _, tok = tiny
    prompts = arith_prompts
    s = LatrSampler(hf_backend(5), _opts(force_return_step=0))
    out, decoded = s.generate(prompts[:1], [4], Sampling(1.0, 1.0, 8))
    plain = hf_backend(5).generate([prompts[0]] * 4, Sampling(1.0, 1.0, 8))
    assert [c for c, _ in out[0]] == plain
    assert decoded == sum(len(c.token_ids) for c in plain)


def test_logprobs_are_the_behaviour_logprobs_of_every_token(tiny, hf_backend, arith_prompts):
    model, tok = tiny
    s = LatrSampler(hf_backend(), _opts(tau_abs=0.0, tau_rel=1.0, ed_threshold=None, force_return_step=3))
    temp = 0.7
    out, _ = s.generate(arith_prompts, [3, 2], Sampling(temp, 1.0, 7))
    for prompt, group in zip(arith_prompts, out):
        for c, _ in group:
            full = torch.tensor([prompt + list(c.token_ids)])
            with torch.no_grad():
                lp = torch.log_softmax(model(full).logits[0].float() / temp, -1)
            expect = lp[len(prompt) - 1 : -1].gather(1, torch.tensor(c.token_ids)[:, None])[:, 0]
            assert torch.allclose(expect, torch.tensor(c.logprobs), atol=1e-4)


# ---------------------------------------------------------------- property 2: caps and group sizes


class _CapCheck(LatrSampler):
    max_seen: dict

    def _should_exit(self, branches, ks, live, t, max_r):
        counts = self._branch_counts(branches, len(ks))
        for r, (c, k) in enumerate(zip(counts, ks)):
            assert c <= k, f"root {r} holds {c} > k = {k} branches"
            self.max_seen[r] = max(self.max_seen.get(r, 0), c)
        return super()._should_exit(branches, ks, live, t, max_r)


@pytest.mark.parametrize("m", [2, 3])
def test_live_branches_never_exceed_k_and_fill_gives_exactly_k(tiny, m, hf_backend, arith_prompts):
    _, tok = tiny
    s = _CapCheck(hf_backend(), _opts(tau_abs=0.0, tau_rel=1.0, max_branch_per_token=m, ed_threshold=None))
    s.max_seen = {}
    ks = [5, 2]
    out, decoded = s.generate(arith_prompts, ks, Sampling(1.0, 1.0, 8))
    assert [len(g) for g in out] == ks
    assert s.max_seen == {0: 5, 1: 2}  # always-branch thresholds fill every root up to its cap
    for g in out:
        _segments_agree(g)
        # every branch point is a real split: each internal node has >= 2 children
        kids = {}
        for _, p in g:
            for a, b in zip(p.nodes, p.nodes[1:]):
                kids.setdefault(a, set()).add(b)
        assert all(len(v) >= 2 for v in kids.values())
    # shared prefixes are decoded once: fewer tokens than the completions hold
    assert decoded < sum(len(c.token_ids) for g in out for c, _ in g)


class _Recording(LatrSampler):
    """Records the decoded-token count each ``generate`` call returns."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.returned: list[int] = []

    def generate(self, *a, **kw):
        out, decoded = super().generate(*a, **kw)
        self.returned.append(decoded)
        return out, decoded


def test_pool_returns_n_per_prompt_with_tree_paths_and_charges_decoded_tokens(tiny, hf_backend):
    _, tok = tiny
    codec = Codec(tok, use_chat=False)
    smp = Sampling(1.0, 1.0, 6)
    verify = lambda p, text: Verdict(1.0 if text.startswith("4") else 0.0)  # noqa: E731
    prompts = [Prompt(f"p{i}", "arithmetic", t, None) for i, t in enumerate(["12+34=", "7+8=", "5+5="])]
    plan = Plan(tuple(Request(p, 4) for p in prompts))
    opts = _opts(tau_abs=0.0, tau_rel=1.0, ed_threshold=None, schedule={0: 0.5, 3: 0.0})
    tree = _Recording(hf_backend(), opts)
    pool = LocalPool(hf_backend(), codec, verify, smp, tree=tree)
    groups = pool.generate(plan, [], version=0)
    assert [g.size for g in groups] == [4, 4, 4]
    for g in groups:  # k = round(4 * 0.5) = 2 tree rollouts, 2 i.i.d.
        assert sum(r.tree is not None for r in g.rollouts) == 2
    cost = pool.take_cost()
    iid = sum(len(r.completion_ids) for g in groups for r in g.rollouts if r.tree is None)
    assert len(tree.returned) == 1 and tree.returned[0] > 0  # one tree call, which decoded tokens
    assert cost.rollouts == 12 and cost.generated_tokens == iid + tree.returned[0]  # tree tokens are charged
    assert cost.metrics["latr/tree_rollouts"] == 6
    # eta = 0 at step 3: the pool output equals a pool without a tree (same generator seed)
    a = LocalPool(hf_backend(9), codec, verify, smp, tree=LatrSampler(hf_backend(9), opts))
    b = LocalPool(hf_backend(9), codec, verify, smp)
    assert a.generate(plan, [], version=3) == b.generate(plan, [], version=3)
    # evaluation (charge=False) never uses the tree
    ev = pool.rollouts(plan, 0, charge=False)
    assert all(r.tree is None for _, r in ev)


# ---------------------------------------------------------------- property 3: pruning


def test_similarity_measures_by_hand():
    assert latr.edit_distance((1, 2, 3), (1, 3)) == 1
    assert latr.normalised_edit_distance((1, 2, 3, 4), (1, 2, 3, 4)) == 0.0
    assert latr.normalised_edit_distance((1, 2, 3, 4), (1, 9, 3, 8)) == 0.5
    assert latr.suffix_match((1, 2, 3, 4), (9, 3, 4, 9)) == 0.5  # suffix (3, 4) of a occurs in b
    assert latr.rouge_l((1, 2, 3, 4), (1, 3, 4, 9)) == 2 * 3 / 8  # LCS (1, 3, 4)


def _family(parent_tokens, child_tokens, birth):
    root = _Branch(0, list(parent_tokens), [0.0] * len(parent_tokens), [(0, 0)])
    child = _Branch(0, list(child_tokens), [0.0] * len(child_tokens), [(1, 0)], birth=birth, parent=root)
    grandchild = _Branch(0, list(child_tokens), [0.0] * len(child_tokens), [(2, 0)], birth=birth + 1, parent=child)
    root.children.append(child)
    child.children.append(grandchild)
    return root, child, grandchild


def test_prune_only_at_lookahead_ages_only_children_and_only_past_threshold(hf_backend):
    s = LatrSampler(hf_backend(), _opts(lookahead=[2, 4], ed_threshold=0.4))
    same = [7, 1, 2, 3, 4]
    # identical segments (distance 0) are pruned at an age in r, with the subtree
    root, child, grand = _family(same, same, birth=1)
    s._prune([root, child, grand], t=5, eos={0})  # child age 4 in r, grandchild age 3 not in r
    assert child.pruned and grand.pruned and not root.pruned
    # same segments at an age not in r: kept
    root, child, grand = _family(same, same, birth=1)
    s._prune([root, child], t=4, eos={0})
    assert not child.pruned
    # different enough (distance 3/4 >= 0.4): kept
    root, child, _ = _family([7, 1, 2, 3, 4], [7, 5, 6, 3, 8], birth=1)
    s._prune([root, child], t=5, eos={0})
    assert not child.pruned
    # EOS in a segment skips the test
    root, child, _ = _family([7, 1, 2, 0, 4], [7, 1, 2, 0, 4], birth=1)
    s._prune([root, child], t=5, eos={0})
    assert not child.pruned
    # all tests off: never pruned; math symbol at the divergence point: skipped
    off = LatrSampler(hf_backend(), _opts(lookahead=[4], ed_threshold=None))
    root, child, _ = _family(same, same, birth=1)
    off._prune([root, child], t=5, eos={0})
    assert not child.pruned
    sym = LatrSampler(hf_backend(), _opts(lookahead=[4], keep_math_symbols=True), symbol_ids=frozenset({1}))
    root, child, _ = _family(same, same, birth=1)
    sym._prune([root, child], t=5, eos={0})
    assert not child.pruned


def test_pruning_in_the_sampler_keeps_group_sizes(tiny, hf_backend, arith_prompts):
    # always branch, and prune every child at age 2: a normalised edit distance is <= 1 < 1.01, so the
    # test fires for every child whose 2-token segments hold no EOS
    _, tok = tiny
    s = LatrSampler(hf_backend(), _opts(tau_abs=0.0, tau_rel=1.0, ed_threshold=1.01, lookahead=[2]))
    out, _ = s.generate(arith_prompts, [4, 4], Sampling(1.0, 1.0, 8))
    assert s.last_stats["branches_pruned"] > 0
    assert s.last_stats["branches_born"] >= s.last_stats["branches_pruned"]
    assert [len(g) for g in out] == [4, 4]
    for g in out:
        _segments_agree(g)


# ---------------------------------------------------------------- chunking by model.max_batch


def test_chunks_of_roots():
    assert latr.chunks([4, 4, 2], 6) == [(0, 1), (1, 3)]
    assert latr.chunks([4, 4, 2], None) == [(0, 3)]
    assert latr.chunks([4, 4, 2], 64) == [(0, 3)]
    assert latr.chunks([9, 2], 4) == [(0, 1), (1, 2)]  # k > max_batch: capped at 4, alone in its chunk
    assert latr.chunks([], 4) == []


def _canonical(group):
    """Tokens, finish and tree paths with node ids renumbered by first appearance (ids come from a
    counter, so their values depend on the order the chunks ran in)."""
    names: dict[int, int] = {}
    out = []
    for c, p in group:
        nodes = tuple(names.setdefault(n, len(names)) for n in p.nodes)
        out.append((c.token_ids, c.finish, nodes, p.starts))
    return out


class _RowCount(HFBackend):
    """Records the rows of every tree-phase forward."""

    rows: list

    def forward_step(self, inp, *a, **kw):
        self.rows.append(inp.shape[0])
        return super().forward_step(inp, *a, **kw)


def _row_backend(tiny, seed):
    model, tok = tiny
    be = _RowCount(model, [tok.eos_token_id], tok.pad_token_id, max_batch=64, seed=seed)
    be.rows = []
    return be


def test_small_max_batch_gives_the_same_trees_as_one_batch(tiny, arith_prompts):
    # always branch with equal k and no pruning: every root is full after the same step in either
    # chunking, so the per-chunk exit test leaves at the same step; the tree phase is greedy (no RNG)
    # and the continuation is one call over all chunks, so the same seed gives the same rollouts
    _, tok = tiny
    prompts = arith_prompts + [[tok.bos_token_id] + tok.encode("123+456=")]
    ks = [4, 4, 4]
    opts = _opts(tau_abs=0.0, tau_rel=1.0, ed_threshold=None, lookahead=[2])
    smp = Sampling(1.0, 1.0, 8)
    big_be, small_be = _row_backend(tiny, 3), _row_backend(tiny, 3)
    big, big_n = LatrSampler(big_be, opts).generate(prompts, ks, smp, max_batch=64)
    small, small_n = LatrSampler(small_be, opts).generate(prompts, ks, smp, max_batch=4)
    assert max(big_be.rows) == 12 and max(small_be.rows) <= 4  # tree phase: 3 roots x 4 branches vs 4
    assert big_n == small_n
    assert [_canonical(g) for g in big] == [_canonical(g) for g in small]
    for gb, gs in zip(big, small):
        for (cb, _), (cs, _) in zip(gb, gs):
            assert torch.allclose(torch.tensor(cb.logprobs), torch.tensor(cs.logprobs), atol=1e-4)


def test_k_above_max_batch_caps_live_rows_and_fill_keeps_group_sizes(tiny, arith_prompts):
    _, tok = tiny
    be = _row_backend(tiny, 0)
    s = _CapCheck(be, _opts(tau_abs=0.0, tau_rel=1.0, ed_threshold=None), max_batch=3)
    s.max_seen = {}
    out, _ = s.generate(arith_prompts, [5, 2], Sampling(1.0, 1.0, 8))
    assert max(be.rows) <= 3  # the tree phase never decodes more than max_batch rows at once
    assert [len(g) for g in out] == [5, 2]  # the fill step tops the capped root up to k = 5
    for g in out:
        _segments_agree(g)


def test_tree_with_a_replay_that_generates_is_refused_at_load():
    from rollwise.registry import UserError

    with pytest.raises(UserError, match="sampling.latr.enabled cannot be combined with replay"):
        load_config(overrides=["sampling.latr.enabled=true", "replay.name=april"])
    assert load_config(overrides=["sampling.latr.enabled=true"]).sampling.latr.enabled


def test_math_symbol_ids(tiny):
    _, tok = tiny
    ids = latr.math_symbol_ids(lambda x: tok.decode(x, skip_special_tokens=True), len(tok))
    assert set(tok.encode("+=")) <= ids and not (set(tok.encode("0123456789")) & ids)
