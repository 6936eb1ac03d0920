"""ETMR tree rollouts: fork each sampled response at its highest-entropy tokens.

Paper: "ETTRL: Balancing Exploration and Exploitation in LLM Test-Time Reinforcement Learning Via
Entropy Mechanism", arXiv 2508.11356 (Entropy-fork Tree Majority Rollout); spec: guidance.md §5.2.1
(read from the paper; no code was released). Options: ``sampling.etmr`` (``config.EtmrConfig``).

For a group of ``n`` rollouts of one prompt, with N = ``forks`` and B = ``branches``:

1. **Roots.** ``M = n // (1 + B N)`` responses are sampled i.i.d. by the backend (the root paths).
2. **Fork points.** Along each root, the entropy ``H_t`` of the distribution token t was drawn from
   (the sampler's: temperature-scaled, top-p renormalised, over the full vocabulary) is read from
   one scoring forward (``forks.sampler_tables``). The fork points are its N highest-entropy
   positions t >= ``ignore_first`` at least ``min_gap`` apart (greedily by entropy, ties to the
   earlier position): :func:`fork_positions`.
3. **Branches.** At each fork point t, B branches: the root's tokens ``[0, t)`` (shared, generated
   once), a first token drawn from the distribution at t with the root's own token excluded
   (renormalised), then an ordinary continuation by the backend up to ``sampling.max_new_tokens``.
4. **Leaves.** Roots and branches are the group's rollouts, ``R = M (1 + B N)`` (:func:`leaves`;
   the paper's 12 roots, N = B = 2: 60). All of them vote (TTRL's majority, ``reward.ttrl``) and all
   train (``reward.ttrl.train_samples`` unset). Each leaf carries a ``TreePath`` (the ``tree``
   advantage reads it; plain GRPO ignores it).

Cost: a branch decodes only its tokens from the fork on, so with forks spread uniformly half of
each branch is shared and the tokens relative to R independent samples are
``(1 + 0.5 B N) / (1 + B N)`` (:func:`token_ratio`: 0.6 for N = B = 2, 4/7 for N = 3, B = 2).
``generate`` returns the tokens actually decoded (roots, then each branch's first token and
continuation), which the pool charges; the measured ratio is in
``benchmarks/results/tree_tokens.json`` (the embedded default's 3-token answers: 0.80, the forks
sit at the answers' last digits) and ``tree_tokens_cot.json`` (regime 1's ~37-token traces: 0.58)
(``benchmarks/tree_tokens.py``).

Log-probs: a branch's first token was drawn with the root's token excluded, so it is not a sample
of the sampler's distribution; like LATR's chosen tokens it reports the sampler's log-prob of that
token (what objectives read for sampled tokens), a bias confined to one token per branch.

[RECON] (the spec's reconstructions, not the paper's text): fork points at least ``min_gap`` = 1
apart, the first ``ignore_first`` = 4 positions never forks, the entropy of the full distribution,
the first branch token drawn without the root's token. Ours: a root shorter than needed for N fork
points (an early EOS) forks where it can, and the group is topped up with independent samples
(rows without a tree path) so it keeps n rollouts; ``n`` not a multiple of ``1 + B N`` (an adaptive
controller's request) gets ``n mod (1 + B N)`` i.i.d. rows from the pool. A root token that held
all of the probability mass at a fork cannot be excluded; the branch then repeats it.

Needs (``COMPAT``, refused at load by ``rollwise.compat``): the hf backend in the trainer's
process, no other part making the training rollouts; its rows carry no sampler entropies.
"""

from __future__ import annotations

from collections.abc import Sequence

from rollwise.backends.sampling import entropy
from rollwise.generate.forks import (
    Fork,
    ForkSampler,
    Groups,
    draw,
    fork_paths,
    grow_branches,
    merge_unary,
    sample_roots,
    top_up,
)
from rollwise.registry import Compat, UserError

COMPAT = Compat(needs_decode_hooks=True, owns_generation=True, sampler_entropy=False)  # module docstring
KEY = "sampling.etmr"


def leaves(m: int, branches: int, forks: int) -> int:
    """``R = M (1 + B N)``: rollouts of M trees. Example: leaves(12, 2, 2) = 60."""
    return m * (1 + branches * forks)


def token_ratio(branches: int, forks: int) -> float:
    """The paper's token cost relative to ``R`` independent samples when forks are uniformly placed
    (half of each branch shared): ``(1 + 0.5 B N) / (1 + B N)``. Example: (2, 2) -> 0.6."""
    return (1 + 0.5 * branches * forks) / (1 + branches * forks)


def fork_positions(entropies: Sequence[float], n: int, ignore_first: int = 4, min_gap: int = 1) -> list[int]:
    """The ``n`` highest-entropy positions ``t >= ignore_first``, pairwise at least ``min_gap`` apart,
    taken greedily by entropy (ties: the earlier position); sorted. Example: entropies (0.1, 2.0,
    1.9, 0.3, 1.5), n 2, ignore_first 0, min_gap 2 -> 1, then 2 is too close, then 4 -> [1, 4]."""
    order = sorted(range(ignore_first, len(entropies)), key=lambda t: (-entropies[t], t))
    out: list[int] = []
    for t in order:
        if len(out) == n:
            break
        if all(abs(t - s) >= min_gap for s in out):
            out.append(t)
    return sorted(out)


def check_config(cfg) -> None:
    """Local check of ``sampling.etmr`` (``rollwise.compat.check``): the group size is a whole number
    of trees, ``control.rollouts_per_prompt = M (1 + B N)`` with M >= 1."""
    e = cfg.sampling.etmr
    if not e.enabled:
        return
    per, n = 1 + e.branches * e.forks, cfg.control.rollouts_per_prompt
    if n % per:
        raise UserError(
            f"sampling.etmr.enabled makes groups of M (1 + branches * forks) = M x {per} rollouts "
            f"(sampling.etmr.branches = {e.branches}, sampling.etmr.forks = {e.forks}); "
            f"control.rollouts_per_prompt = {n} is not a multiple of {per}"
        )


class EtmrSampler(ForkSampler):
    """Generates ETMR trees for training requests; ``pool.tree`` (``distributed.local``) routes to it."""

    key = KEY
    metrics = "etmr"  # prefix of the pool's tree metrics

    def tree_size(self, n: int, step: int) -> int:
        """Rollouts of a group of n made as trees: the largest multiple of ``1 + B N`` <= n."""
        per = 1 + self.opts.branches * self.opts.forks
        return n // per * per

    def grow(self, prompts, ks, sampling, generator, max_batch):
        """For each prompt and tree size k (a multiple of ``1 + B N``), k rollouts: its ``k / (1 + B N)``
        roots, each followed by its branches (module docstring), then the top-ups."""
        o, be = self.opts, self.backend
        gen = generator or be.generator
        eos = set(getattr(be, "_eos_set", ()))
        per = 1 + o.branches * o.forks
        owners = [r for r, k in enumerate(ks) for _ in range(k // per)]  # the prompt of each root
        root_prompts = [prompts[r] for r in owners]
        roots, tables, decoded = sample_roots(be, root_prompts, sampling, generator)
        firsts: list[Fork] = []
        for i, (c, table) in enumerate(zip(roots, tables)):
            if not len(c.token_ids):
                continue
            for t in fork_positions(entropy(table).tolist(), o.forks, o.ignore_first, o.min_gap):
                probs = table[t].exp()
                own = c.token_ids[t]
                if float(probs.sum() - probs[own]) > 0:
                    probs[own] = 0.0
                firsts.extend(
                    (i, t, tok, float(table[t, tok])) for tok in [draw(probs, gen) for _ in range(o.branches)]
                )
        branches, branch_tokens = grow_branches(be, root_prompts, roots, firsts, sampling, generator, eos)
        decoded += branch_tokens
        out: Groups = [[] for _ in prompts]
        for i, c in enumerate(roots):
            mine = [j for j, f in enumerate(firsts) if f[0] == i]
            root_path, branch_paths = fork_paths(self._ids, [firsts[j][1] for j in mine])
            paths = merge_unary([root_path, *branch_paths])
            out[owners[i]].append((c, paths[0]))
            out[owners[i]].extend((branches[j], path) for j, path in zip(mine, paths[1:]))
        # top-ups: a root too short for N fork points leaves its group short (module docstring)
        topped, top_tokens = top_up(be, prompts, ks, out, sampling, generator)
        stats = {"tree_rollouts": sum(ks), "branches_born": len(firsts), "branches_pruned": 0, "topped_up": topped}
        return out, decoded + top_tokens, stats
