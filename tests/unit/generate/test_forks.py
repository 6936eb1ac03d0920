"""The fork machinery the tree samplers share (rollwise/generate/forks.py), on a scripted backend and
hand-worked token ids: a branch is its root's prefix (not decoded again), the chosen token and a
continuation; a first EOS or the length limit ends it with nothing decoded; top-ups refill a group;
and every tree sampler is a ``ForkSampler``, holding its own policy only."""

from __future__ import annotations

import pytest

from rollwise.backends.scripted import ScriptedBackend
from rollwise.config import EcTreeConfig, EtmrConfig, TreeSamplingConfig
from rollwise.generate.ec_tree import EcTreeSampler
from rollwise.generate.etmr import EtmrSampler
from rollwise.generate.forks import ForkSampler, grow_branches, top_up
from rollwise.generate.latr import LatrSampler
from rollwise.registry import UserError
from rollwise.types import Completion, Sampling, TreePath

EOS = 0


def scripted(reply):
    """Answers every row with ``reply`` (+ EOS) at log-prob -0.25; ``.seen`` holds the rows asked."""
    seen = []
    be = ScriptedBackend(lambda seq, i: seen.append(tuple(seq)) or list(reply), EOS, logprob=-0.25)
    be.seen = seen
    return be


def test_branches_share_the_roots_prefix_and_only_new_tokens_are_decoded():
    root = Completion((5, 6, 7, 8), (-0.1, -0.2, -0.3, -0.4), "length")
    forks = [(0, 1, 9, -1.5), (0, 2, EOS, -2.0), (0, 3, 9, -0.7)]  # (root, t, token, its log-prob)
    be = scripted([3])
    out, decoded = grow_branches(be, [(1, 2)], [root], forks, Sampling(max_new_tokens=4), eos={EOS})
    # t = 1: (5) + 9, continued from prompt + (5, 9) with 4 - 2 = 2 tokens left: 3, EOS
    assert out[0] == Completion((5, 9, 3, EOS), (-0.1, -1.5, -0.25, -0.25), "stop")
    assert be.seen == [(1, 2, 5, 9)]  # the only row continued
    # t = 2: the chosen token is EOS: the branch ends there
    assert out[1] == Completion((5, 6, EOS), (-0.1, -0.2, -2.0), "stop")
    # t = 3: the chosen token is the 4th of 4: the length limit, nothing to continue
    assert out[2] == Completion((5, 6, 7, 9), (-0.1, -0.2, -0.3, -0.7), "length")
    assert decoded == 3 + 2  # one chosen token per fork + the continuation's 2; the shared prefixes: 0


def test_top_up_fills_each_group_to_its_size_with_rows_without_a_tree_path():
    tree_row = (Completion((4,), (-1.0,), "stop"), TreePath((0,), (0,)))
    out = [[tree_row], []]
    be = scripted([7, 7])
    added, decoded = top_up(be, [(1,), (2,)], [3, 1], out, Sampling(max_new_tokens=8))
    assert (added, decoded) == (3, 3 * 3)  # 2 rows for prompt 0, 1 for prompt 1, 3 tokens each
    assert be.seen == [(1,), (1,), (2,)]
    assert out[0][0] == tree_row and [p for _, p in out[0][1:]] == [None, None] and len(out[1]) == 1
    assert top_up(be, [(1,), (2,)], [3, 1], out, Sampling(max_new_tokens=8)) == (0, 0) and be.calls == 3


SAMPLERS = [
    (LatrSampler, TreeSamplingConfig(enabled=True), "sampling.latr", "latr"),
    (EtmrSampler, EtmrConfig(enabled=True), "sampling.etmr", "etmr"),
    (EcTreeSampler, EcTreeConfig(enabled=True), "sampling.ec_tree", "ec_tree"),
]


@pytest.mark.parametrize("cls, opts, key, prefix", SAMPLERS)
def test_every_tree_sampler_is_a_fork_sampler_holding_only_its_policy(cls, opts, key, prefix):
    assert issubclass(cls, ForkSampler) and (cls.key, cls.metrics) == (key, prefix)
    own = set(vars(cls))
    assert {"tree_size", "grow"} <= own and "generate" not in own  # one generate entry, in forks.py
    # the backend refusal names the sampler's key and the piece missing (a scripted backend cannot
    # score; LATR's decode loop also needs forward_step)
    missing = "forward_step" if cls is LatrSampler else "score"
    bare = type("Bare", (), {"generate": None})()
    with pytest.raises(UserError, match=rf"{key}\.enabled needs the hf backend \(its {missing}\)"):
        cls(bare, opts)


def test_generate_returns_the_policys_rollouts_and_records_its_statistics():
    class Fixed(ForkSampler):
        key, metrics = "sampling.fixed", "fixed"

        def tree_size(self, n, step):
            return n

        def grow(self, prompts, ks, sampling, generator, max_batch):
            rows = [[(Completion((1,) * k, (0.0,) * k, "stop"), None)] for k in ks]
            return rows, sum(ks), {"branches_born": float(len(ks))}

    s = Fixed(scripted([]), None)
    out, decoded = s.generate([(1,), (2,)], [2, 3], Sampling())
    assert [len(g[0][0].token_ids) for g in out] == [2, 3] and decoded == 5
    assert s.last_stats == {"branches_born": 2.0}
