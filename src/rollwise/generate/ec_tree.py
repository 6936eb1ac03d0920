"""EC-Tree rollouts: branch once where entropy is high and confidence low, prune, top up.

Paper: "ECHO: Entropy-Confidence Hybrid Optimization for Test-Time Reinforcement Learning", arXiv
2602.02150 (its entropy-confidence hybrid tree rollout); spec: guidance.md §5.3.3, read from the
released code (user683/ECHO: ``DeepConfBranchController``, ``_generate_sequences_deepconf``), in which
the tree is disabled and, as shipped, can never branch (§5.3.6). Options: ``sampling.ec_tree``
(``config.EcTreeConfig``).

Token signals at completion position t, from the distribution token t was drawn from (the sampler's,
over the full vocabulary; one scoring forward, ``forks.sampler_tables``): entropy ``H_t``;
confidence ``C_t`` = mean of its ``confidence_top_k`` largest probabilities (the paper's definition);
grouped confidence ``C^G_t`` = mean C over the last ``group_window`` steps; tail confidence
``C_tail`` = mean C over the last ``tail_window`` steps; entropy jump ``dH_t = H_t - mean(H over
the previous entropy_window steps)`` (:func:`signals`).

For a group of ``n`` rollouts of one prompt:

1. **Base.** ``roots`` (code: 1) completions sampled i.i.d. by the backend.
2. **Branch plan** (:func:`branch_point`): the first t >= ``min_depth`` with ``H_t >= entropy_high``,
   ``C^G_t <= branch_threshold`` and ``dH_t >= entropy_jump``; one branch point per base.
3. **Width** (:func:`width`): ``w = clip(round(min_branches + alpha (H_t - H_low)/(H_high - H_low) -
   beta (C^G_t - tau_b)/|tau_b|), min_branches, max_branches)`` (round half to even, as ``np.round``).
   The candidates are the w most probable tokens at t, always including the base's own; each other
   candidate is a branch ``base[:t] + token + a fresh continuation`` (``forks.continue_prefixes``).
4. **Pruning** (:func:`prune_at`): every completion (bases and branches) is checked step by step
   from ``min_depth`` and pruned at the first step where (i) the running minimum of ``C^G`` is below
   ``prune_threshold``, (ii) ``C_tail`` fell for 3 steps running and is <= ``tail_threshold``, or
   (iii) ``dH`` was > 0 for 3 steps running and is > ``spike``.
5. **Keep and top up**: a pruned completion leaves the group; the first n survivors are kept and the
   group is topped up with fresh independent samples (rows without a tree path) to exactly n.

Cost: ``generate`` returns every token decoded (bases, branch tokens and continuations, top-ups).
Pruning here reads the finished completion's signals, so a pruned completion's tokens after its
prune point were decoded and are charged (``last_stats["pruned_tail_tokens"]`` counts them: what a
decoder that stops at the trigger would save); the cost reported is never below what was done.

Reconstructions and deviations. [RECON] (spec §5.3.6, the released thresholds cannot fire): the
confidence is the paper's mean top-k probability (the code's controller uses DeepConf's
``-mean log p`` over the top-k), so ``branch_threshold`` 0.1 and ``prune_threshold`` 0.05 are the
spec's recalibration for k = 5, ``tail_threshold`` 0.075 is ours (between the two, as the code's
0.4 < 1.0 < 1.2), ``group_window`` 4 is ours (the code's key is misspelt and unset); the entropy is
the full distribution's (the code renormalises 10 returned log-probs, capping H at ln 10 < 3.5).
[RECON] pruned completions are dropped and replaced (spec §5.3.6 item 4: the code stores a penalty
and uses it nowhere). Ours: the prune tests start at ``min_depth``; top-ups are neither branched nor
pruned (else a group could be refilled forever); a branch's first token reports the sampler's
log-prob of that token (it was chosen, not drawn), as LATR's chosen tokens do.

Needs (``COMPAT``, refused at load by ``rollwise.compat``): the hf backend in the trainer's
process, no other part making the training rollouts; its rows carry no sampler entropies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rollwise.backends.sampling import entropy
from rollwise.generate.forks import (
    Fork,
    ForkSampler,
    Groups,
    fork_paths,
    grow_branches,
    merge_unary,
    sample_roots,
    sampler_tables,
    top_up,
)
from rollwise.registry import Compat
from rollwise.types import Completion

COMPAT = Compat(needs_decode_hooks=True, owns_generation=True, sampler_entropy=False)  # module docstring
KEY = "sampling.ec_tree"


@dataclass(frozen=True)
class Signals:
    """Per-position signals of one completion (module docstring), each a list of floats."""

    h: list[float]  # entropy H_t
    c: list[float]  # confidence C_t
    cg: list[float]  # grouped confidence C^G_t
    tail: list[float]  # tail confidence C_tail at t
    dh: list[float]  # entropy jump dH_t


def _mean_back(xs: Sequence[float], t: int, w: int) -> float:
    """Mean of ``xs[t - w + 1 : t + 1]`` (fewer at the start)."""
    lo = max(0, t - w + 1)
    return sum(xs[lo : t + 1]) / (t + 1 - lo)


def signals_from(h: Sequence[float], c: Sequence[float], opts) -> Signals:
    """Windowed signals from entropies and confidences. Example (group_window 2, tail_window 3,
    entropy_window 2): h (1, 3, 2), c (0.2, 0.1, 0.3) -> cg (0.2, 0.15, 0.2), tail (0.2, 0.15, 0.2),
    dh (0, 3 - 1, 2 - 2) = (0, 2, 0)."""
    h, c = list(h), list(c)
    cg = [_mean_back(c, t, opts.group_window) for t in range(len(c))]
    tail = [_mean_back(c, t, opts.tail_window) for t in range(len(c))]
    dh = [0.0 if t == 0 else h[t] - _mean_back(h, t - 1, opts.entropy_window) for t in range(len(h))]
    return Signals(h, c, cg, tail, dh)


def signals(table: torch.Tensor, opts) -> Signals:
    """Signals of one completion from its (L, V) sampler log-prob table."""
    if not table.numel():
        return signals_from([], [], opts)
    probs = table.exp()
    k = min(opts.confidence_top_k, probs.shape[-1])
    return signals_from(entropy(table).tolist(), probs.topk(k, dim=-1).values.mean(-1).tolist(), opts)


def branch_point(s: Signals, opts) -> int | None:
    """The first t >= min_depth with H_t >= entropy_high, C^G_t <= branch_threshold and
    dH_t >= entropy_jump, or None."""
    for t in range(opts.min_depth, len(s.h)):
        if s.h[t] >= opts.entropy_high and s.cg[t] <= opts.branch_threshold and s.dh[t] >= opts.entropy_jump:
            return t
    return None


def width(h: float, cg: float, opts) -> int:
    """Candidates at a branch point (module docstring, 3.). Example (the code's constants, tau_b 1.2):
    H 3.5, C^G 0.6 -> 1 + 2 (2.5 / 2.5) - (0.6 - 1.2) / 1.2 = 3.5 -> round half even 4 -> 4."""
    tau = opts.branch_threshold
    raw = (
        opts.min_branches
        + opts.alpha * (h - opts.entropy_low) / (opts.entropy_high - opts.entropy_low)
        - opts.beta * (cg - tau) / abs(tau)
    )
    return max(opts.min_branches, min(opts.max_branches, round(raw)))


def prune_at(s: Signals, opts) -> int | None:
    """The first t >= min_depth at which a prune test fires (module docstring, 4.), or None."""
    low = min(s.cg[: opts.min_depth], default=float("inf"))
    for t in range(opts.min_depth, len(s.h)):
        low = min(low, s.cg[t])
        if low < opts.prune_threshold:
            return t
        if t >= 3 and s.tail[t] < s.tail[t - 1] < s.tail[t - 2] < s.tail[t - 3] and s.tail[t] <= opts.tail_threshold:
            return t
        if t >= 2 and min(s.dh[t - 2 : t + 1]) > 0 and s.dh[t] > opts.spike:
            return t
    return None


class EcTreeSampler(ForkSampler):
    """Generates EC-Tree groups for training requests; ``pool.tree`` (``distributed.local``) routes to it."""

    key = KEY
    metrics = "ec_tree"  # prefix of the pool's tree metrics

    def tree_size(self, n: int, step: int) -> int:
        """The whole group comes from the sampler (bases, branches, top-ups)."""
        return n

    def grow(self, prompts, ks, sampling, generator, max_batch):
        """For each prompt and group size k, exactly k rollouts: the surviving bases and branches (each
        base followed by its branches), then the top-ups (module docstring)."""
        o, be = self.opts, self.backend
        eos = set(getattr(be, "_eos_set", ()))
        owners = [r for r, k in enumerate(ks) for _ in range(min(o.roots, k))]
        base_prompts = [prompts[r] for r in owners]
        bases, tables, decoded = sample_roots(be, base_prompts, sampling, generator)
        sigs = [signals(t, o) for t in tables]
        firsts: list[Fork] = []
        for i, (c, s) in enumerate(zip(bases, sigs)):
            t = branch_point(s, o)
            if t is None:
                continue
            lp = tables[i][t]
            w = width(s.h[t], s.cg[t], o)
            own = c.token_ids[t]
            order = [tok for tok in lp.topk(min(w, lp.numel())).indices.tolist() if tok != own]
            firsts += [(i, t, tok, float(lp[tok])) for tok in order[: w - 1] if torch.isfinite(lp[tok])]
        branches, branch_tokens = grow_branches(be, base_prompts, bases, firsts, sampling, generator, eos)
        decoded += branch_tokens
        b_tables = sampler_tables(be, [base_prompts[f[0]] for f in firsts], [c.token_ids for c in branches], sampling)
        # leaves per prompt, in order (base, its branches), with raw paths and their prune points
        leaves: list[list[tuple[Completion, list[tuple[int, int]], int | None]]] = [[] for _ in prompts]
        for i, c in enumerate(bases):
            mine = [j for j, f in enumerate(firsts) if f[0] == i]
            root_path, branch_paths = fork_paths(self._ids, [firsts[j][1] for j in mine])
            leaves[owners[i]].append((c, root_path, prune_at(sigs[i], o)))
            for j, path in zip(mine, branch_paths):
                leaves[owners[i]].append((branches[j], path, prune_at(signals(b_tables[j], o), o)))
        out: Groups = []
        pruned = tail_tokens = 0
        for r, k in enumerate(ks):
            kept = [(c, p) for c, p, at in leaves[r] if at is None][:k]
            dropped = [(c, at) for c, _, at in leaves[r] if at is not None]
            pruned += len(dropped)
            tail_tokens += sum(len(c.token_ids) - (at + 1) for c, at in dropped)
            out.append(list(zip([c for c, _ in kept], merge_unary([p for _, p in kept]))) if kept else [])
        # top-ups: fresh independent samples, neither branched nor pruned
        topped, top_tokens = top_up(be, prompts, ks, out, sampling, generator)
        stats = {
            "branches_born": len(firsts),
            "branches_pruned": pruned,
            "topped_up": topped,
            "pruned_tail_tokens": tail_tokens,
        }
        return out, decoded + top_tokens, stats
