"""ETMR tree rollouts (rollwise/generate/etmr.py): the paper's counts, the top-N entropy fork points,
shared prefixes generated once, the pool's routing and the refusals at load."""

from __future__ import annotations

import pytest

from rollwise.backends.sampling import entropy
from rollwise.config import EtmrConfig, load_config
from rollwise.distributed.local import LocalPool
from rollwise.generate.etmr import EtmrSampler, fork_positions, leaves, token_ratio
from rollwise.generate.forks import fork_paths, merge_unary, sampler_tables
from rollwise.registry import UserError
from rollwise.tokens import Codec
from rollwise.types import Plan, Prompt, Request, Sampling, TreePath, Verdict
from tree_fixtures import arith_prompts, hf_backend, tiny  # noqa: F401 (pytest fixtures)

# ---------------------------------------------------------------- the paper's numbers (spec §5.2.4)


def test_leaves_and_token_ratio_are_the_papers():
    assert leaves(12, 2, 2) == 60  # M = 12, N = 2, B = 2: 60 rollouts (vs TTRL's 64)
    assert token_ratio(2, 2) == pytest.approx(0.6)  # (1 + 2) / (1 + 4)
    assert token_ratio(2, 3) == pytest.approx(4 / 7)  # (1 + 3) / (1 + 6)


def test_fork_positions_are_the_top_entropy_positions_by_hand():
    h = [0.1, 2.0, 1.9, 0.3, 1.5]
    assert fork_positions(h, 2, ignore_first=0, min_gap=1) == [1, 2]
    assert fork_positions(h, 2, ignore_first=0, min_gap=2) == [1, 4]  # 2 is next to 1
    assert fork_positions(h, 2, ignore_first=2, min_gap=1) == [2, 4]  # 1 is ignored
    assert fork_positions([1.0, 1.0, 1.0], 2, ignore_first=0) == [0, 1]  # ties: the earlier position
    assert fork_positions([1.0, 2.0], 3, ignore_first=0) == [0, 1]  # a short root: the positions it has


def test_fork_paths_share_the_roots_nodes_before_each_fork():
    import itertools

    root, branches = fork_paths(itertools.count(), [2, 2, 5])
    assert root == [(0, 0), (1, 2), (2, 5)]
    assert branches == [[(0, 0), (3, 2)], [(0, 0), (4, 2)], [(0, 0), (1, 2), (5, 5)]]
    paths = merge_unary([root, *branches])
    assert paths[0] == TreePath((0, 1, 2), (0, 2, 5)) and paths[3] == TreePath((0, 1, 5), (0, 2, 5))


# ---------------------------------------------------------------- the sampler


def test_each_root_forks_at_its_top_entropy_positions_and_branches_share_its_prefix(hf_backend, arith_prompts):
    be = hf_backend()
    smp = Sampling(1.0, 1.0, 8)
    opts = EtmrConfig(enabled=True, forks=2, branches=2, ignore_first=1)
    s = EtmrSampler(be, opts)
    prompts = arith_prompts
    out, decoded = s.generate(prompts, [10, 5], smp)  # M = 2 and 1 roots of 1 + 2 * 2 = 5 leaves
    assert [len(g) for g in out] == [10, 5]
    roots = [g[i] for g in out for i in range(0, len(g), 5)]
    owners = [0, 0, 1]
    tables = sampler_tables(be, [prompts[r] for r in owners], [c.token_ids for c, _ in roots], smp)
    expected_decoded = 0
    for j, (g, i) in enumerate([(0, 0), (0, 5), (1, 0)]):
        root, root_path = out[g][i]
        tree = out[g][i : i + 5]
        h = entropy(tables[j]).tolist()
        want = fork_positions(h, 2, ignore_first=1)
        assert len(want) == 2
        forks = []
        for c, path in tree[1:]:
            t = path.starts[-1]  # a branch's own node starts at its fork
            forks.append(t)
            assert c.token_ids[:t] == root.token_ids[:t]  # the shared prefix
            assert c.logprobs[:t] == root.logprobs[:t]  # ... is the root's, not decoded again
            assert c.token_ids[t] != root.token_ids[t]  # the root's own token is excluded at the fork
            assert path.nodes[:-1] == root_path.nodes[: len(path.nodes) - 1]
            expected_decoded += len(c.token_ids) - t
        assert sorted(forks) == sorted(want * 2)  # B = 2 branches at each of the top-N positions
        assert root_path.starts == (0, *want)  # the root is cut at its fork points
        expected_decoded += len(root.token_ids)
    assert decoded == expected_decoded  # roots in full, branches from their fork on
    assert decoded < sum(len(c.token_ids) for g in out for c, _ in g)
    assert s.last_stats["branches_born"] == 12 and s.last_stats["topped_up"] == 0


def test_pool_routes_groups_to_etmr_and_charges_the_decoded_tokens(tiny, hf_backend):
    _, tok = tiny
    codec = Codec(tok, use_chat=False)
    smp = Sampling(1.0, 1.0, 6)
    verify = lambda p, text: Verdict(1.0 if text.startswith("4") else 0.0)  # noqa: E731
    prompts = [Prompt(f"p{i}", "arithmetic", t, None) for i, t in enumerate(["12+34=", "7+8="])]
    plan = Plan((Request(prompts[0], 5), Request(prompts[1], 7)))  # 7 = one tree of 5 + 2 i.i.d.
    tree = EtmrSampler(hf_backend(), EtmrConfig(enabled=True, ignore_first=0))
    pool = LocalPool(hf_backend(), codec, verify, smp, tree=tree)
    groups = sorted(pool.generate(plan, [], version=0), key=lambda g: g.prompt.id)
    assert [g.size for g in groups] == [5, 7]
    assert [sum(r.tree is not None for r in g.rollouts) for g in groups] == [5, 5]
    cost = pool.take_cost()
    assert cost.metrics["etmr/tree_rollouts"] == 10 and cost.metrics["etmr/branches_born"] == 8
    total = sum(len(r.completion_ids) for g in groups for r in g.rollouts)
    assert cost.generated_tokens < total  # shared prefixes are charged once
    assert all(r.tree is None for _, r in pool.rollouts(plan, 0, charge=False))  # evaluation: no trees


# ---------------------------------------------------------------- refusals at load


def test_a_group_size_that_is_not_whole_trees_is_refused_naming_the_keys():
    with pytest.raises(UserError, match=r"control.rollouts_per_prompt = 8 is not a multiple of 5") as e:
        load_config(overrides=["sampling.etmr.enabled=true", "control.rollouts_per_prompt=8"])
    assert "sampling.etmr.branches" in str(e.value) and "sampling.etmr.forks" in str(e.value)
    load_config(overrides=["sampling.etmr.enabled=true", "control.rollouts_per_prompt=10"])


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["model.backend=vllm"], "decode hooks"),
        (["distributed.workers=1"], "distributed.workers > 0"),
        (["sampling.latr.enabled=true"], "sampling.latr.enabled cannot be combined with sampling.etmr.enabled"),
        (["replay.name=april"], "sampling.etmr.enabled cannot be combined with replay 'april'"),
        (["sampling.ec_tree.enabled=true"], "sampling.etmr.enabled cannot be combined with sampling.ec_tree.enabled"),
    ],
)
def test_etmr_is_refused_where_it_cannot_apply(extra, needle):
    with pytest.raises(UserError) as e:
        load_config(overrides=["sampling.etmr.enabled=true", "control.rollouts_per_prompt=10", *extra])
    assert needle in str(e.value)


def test_sampler_entropies_are_refused_with_etmr():
    with pytest.raises(UserError, match="sampling.etmr.enabled does not record"):
        load_config(
            overrides=[
                "sampling.etmr.enabled=true",
                "control.rollouts_per_prompt=10",
                "advantage.name=ettrl",
                "advantage.options={entropy='sampler'}",
            ]
        )
