"""Fork machinery shared by the tree samplers: LATR (``generate/latr.py``), ETMR (``generate/etmr.py``)
and EC-Tree (``generate/ec_tree.py``).

A tree sampler forks a completion at a position t: the branch shares the completion's tokens
``[0, t)``, takes its own token at t and is then continued by the backend's ordinary sampler. What
the three share, written once here:

- :class:`ForkSampler`: the base every tree sampler subclasses: the constructor (backend, options,
  ``max_batch``, the node-id counter, ``last_stats``), the backend check, and the ``generate`` entry
  the pool calls (``distributed.local``), which runs the subclass's :meth:`ForkSampler.grow` and
  records its statistics; a subclass holds its own policy only (``tree_size`` and ``grow``);
- :func:`check_backend`: the hf backend in this process (its cached decode steps and scoring pass);
- :func:`continue_prefixes`: continue ``prompt + prefix`` rows with the backend's sampler for the
  rest of ``sampling.max_new_tokens`` (rows batched by prefix length, whose budgets are equal);
- :func:`sampler_tables`: one scoring forward over ``prompt + completion`` giving, at every
  completion position, the log-probs of the distribution the sampler drew from (temperature-scaled,
  top-p renormalised; ``HFBackend.score(full=True)``), from which ETMR and EC-Tree read entropies,
  confidences and fork candidates (LATR reads them during its own decode loop);
- :func:`fork_paths` and :func:`merge_unary`: the ``TreePath`` of every leaf (``types.TreePath``;
  the ``tree`` advantage reads it), nodes being maximal shared segments;
- :func:`draw`: one token from a probability row with one uniform of the run's generator;
- :func:`sample_roots`, :func:`grow_branches` and :func:`top_up`: the three generation steps of the
  sample-then-fork samplers (ETMR, EC-Tree): i.i.d. roots with their sampler tables, branches
  ``root[:t] + token + continuation`` from a fork plan, and independent samples that refill a group.

The scoring forward is a prefill over tokens already generated (no token is decoded), so it is not
charged as generated tokens; an engine that returns log-probs with its samples (vLLM's ``logprobs``)
gives the same tables without it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import ClassVar

import torch

from rollwise.registry import UserError
from rollwise.types import Completion, Sampling, TreePath

Fork = tuple[int, int, int, float]  # (root index, fork position t, first token, its sampler log-prob)
Groups = list[list[tuple[Completion, TreePath | None]]]  # per prompt: rollouts with their tree paths


class ForkSampler:
    """What a tree sampler is to the pool (``pool.tree``, ``distributed.local``): built from the
    backend, its options (``opts``: the ``sampling.<name>`` section) and ``model.max_batch``; asked
    ``tree_size(n, step)`` (how many of a group of n come from it) and ``generate(prompts, ks, ...)``
    (those rollouts and the tokens decoded); ``last_stats`` holds the last call's statistics, which
    the pool logs under ``<metrics>/``. Subclasses set ``key`` (the config section, named by the
    backend refusal), ``metrics`` and ``needs`` (what the backend must have) and write ``tree_size``
    and ``grow``, their policy."""

    key: ClassVar[str]  # config section, e.g. "sampling.etmr"
    metrics: ClassVar[str]  # prefix of the pool's tree metrics
    needs: ClassVar[tuple[str, ...]] = ("generate", "score")

    def __init__(self, backend, opts, max_batch: int | None = None):
        self.check_backend(backend)
        self.backend, self.opts = backend, opts
        self.max_batch = max_batch  # rows per forward (None: the backend's); LATR's tree phase reads it
        self._ids = itertools.count()  # tree node ids, unique over the sampler's life
        self.last_stats: dict[str, float] = {}

    @classmethod
    def check_backend(cls, backend) -> None:
        """Refuse a backend without what this sampler drives (called again by the assembler before
        LATR's symbol table is built)."""
        check_backend(backend, f"{cls.key}.enabled", cls.needs)

    def tree_size(self, n: int, step: int) -> int:
        """Rollouts of a group of n (at policy version ``step``) that come from the tree."""
        raise NotImplementedError

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        ks: Sequence[int],
        sampling: Sampling,
        generator: torch.Generator | None = None,
        max_batch: int | None = None,
    ) -> tuple[Groups, int]:
        """For each prompt (ids) and tree size k (``tree_size``'s answer), k rollouts with their tree
        paths (None: a row sampled independently), and the number of tokens actually decoded (what
        the pool charges). ``max_batch``: the pool's rows per forward."""
        out, decoded, self.last_stats = self.grow(prompts, ks, sampling, generator, max_batch)
        return out, decoded

    def grow(
        self,
        prompts: Sequence[Sequence[int]],
        ks: Sequence[int],
        sampling: Sampling,
        generator: torch.Generator | None,
        max_batch: int | None,
    ) -> tuple[Groups, int, dict[str, float]]:
        """The sampler's policy: ``generate``'s groups and decoded tokens, and the call's statistics."""
        raise NotImplementedError


def check_backend(backend, key: str, needs: Sequence[str] = ("generate", "score")) -> None:
    """Refuse a backend without the pieces a tree sampler drives (``key``: its config key; ``needs``:
    ``generate`` and ``score`` for ETMR and EC-Tree, LATR's own decode loop also ``forward_step`` and
    ``left_pad``)."""
    for need in needs:
        if not hasattr(backend, need):
            raise UserError(f"{key} needs the hf backend (its {need}); got {type(backend).__name__}")


def continue_prefixes(
    backend, prompts: Sequence[Sequence[int]], prefixes: Sequence[Sequence[int]], sampling: Sampling, generator=None
) -> tuple[list[Completion], int]:
    """Continue each ``prompts[i] + prefixes[i]`` with the backend's sampler up to
    ``sampling.max_new_tokens`` tokens in all (the prefix counts); one backend call per prefix
    length. Returns the continuations (new tokens only; a prefix already at the limit gets an empty
    "length" completion) and the number of tokens decoded."""
    out: list[Completion | None] = [None] * len(prompts)
    by_len: dict[int, list[int]] = {}
    for i, p in enumerate(prefixes):
        if len(p) >= sampling.max_new_tokens:
            out[i] = Completion((), (), "length")
        else:
            by_len.setdefault(len(p), []).append(i)
    decoded = 0
    for used, rows in by_len.items():
        smp = Sampling(sampling.temperature, sampling.top_p, sampling.max_new_tokens - used)
        seqs = [list(prompts[i]) + list(prefixes[i]) for i in rows]
        for i, c in zip(rows, backend.generate(seqs, smp, generator)):
            out[i] = c
            decoded += len(c.token_ids)
    return out, decoded


def sampler_tables(
    backend, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], sampling: Sampling
) -> list[torch.Tensor]:
    """(len(completion), V) log-probs of the sampling distribution at each completion position: row
    t is the distribution completion token t was drawn from (one scoring forward per sequence)."""
    rows = [i for i, c in enumerate(completions) if len(c)]
    out = [torch.zeros(0, 0) for _ in completions]
    if rows:
        seqs = [list(prompts[i]) + list(completions[i]) for i in rows]
        for i, t in zip(rows, backend.score(seqs, [len(prompts[i]) for i in rows], sampling, full=True)):
            out[i] = t
    return out


def draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One index of the (V,) non-negative row ``probs`` (need not sum to 1), by inverse CDF with one
    uniform from ``generator`` (on whatever device it lives)."""
    cdf = probs.double().cumsum(0)
    u = float(torch.rand((), generator=generator, dtype=torch.float64, device=generator.device)) * float(cdf[-1])
    return min(int(torch.searchsorted(cdf, torch.tensor(u, dtype=torch.float64))), probs.numel() - 1)


def fork_paths(ids: itertools.count, forks: Sequence[int]) -> tuple[list[tuple[int, int]], list[list[tuple[int, int]]]]:
    """Raw paths (lists of (node id, start)) of a root completion and of branches forked from it at
    completion positions ``forks`` (one entry per branch; a branch shares the root's tokens
    ``[0, fork)``). The root is cut at every distinct fork position; a branch takes the root's
    nodes before its fork and a node of its own. Example: forks (2, 2, 5) -> root [(a, 0), (b, 2),
    (c, 5)], branches [(a, 0), (d, 2)], [(a, 0), (e, 2)], [(a, 0), (b, 2), (f, 5)]."""
    cuts = sorted(set(forks) - {0})
    root = [(next(ids), 0)] + [(next(ids), c) for c in cuts]
    branches = [[(n, s) for n, s in root if s < f] + [(next(ids), f)] for f in forks]
    return root, branches


def merge_unary(paths: list[list[tuple[int, int]]]) -> list[TreePath]:
    """Merge every node that is the only child of its parent into the parent (the parent keeps its
    start), so each node is a maximal segment shared by a fixed set of rollouts."""
    children: dict[int, set[int]] = {}
    for p in paths:
        for (a, _), (b, _) in zip(p, p[1:]):
            children.setdefault(a, set()).add(b)
    out = []
    for p in paths:
        nodes, starts = [p[0][0]], [p[0][1]]
        for d in range(1, len(p)):
            if len(children.get(p[d - 1][0], ())) > 1:
                nodes.append(p[d][0])
                starts.append(p[d][1])
        out.append(TreePath(tuple(nodes), tuple(starts)))
    return out


def sample_roots(
    backend, prompts: Sequence[Sequence[int]], sampling: Sampling, generator=None
) -> tuple[list[Completion], list[torch.Tensor], int]:
    """Sample one completion per prompt (the roots of the trees) and read their sampler tables
    (:func:`sampler_tables`). Returns the roots, their tables and the tokens decoded."""
    roots = backend.generate(prompts, sampling, generator)
    tables = sampler_tables(backend, prompts, [c.token_ids for c in roots], sampling)
    return roots, tables, sum(len(c.token_ids) for c in roots)


def grow_branches(
    backend,
    prompts: Sequence[Sequence[int]],
    roots: Sequence[Completion],
    forks: Sequence[Fork],
    sampling: Sampling,
    generator=None,
    eos: frozenset[int] | set[int] = frozenset(),
) -> tuple[list[Completion], int]:
    """The branch of each fork ``(i, t, token, log-prob)``: root i's tokens ``[0, t)`` (shared, not
    decoded again), the chosen token, then a continuation by the backend's sampler
    (:func:`continue_prefixes`; ``prompts[i]`` is root i's prompt). A first token in ``eos`` ends the
    branch ("stop"), as does reaching ``sampling.max_new_tokens`` ("length"). Returns the branches
    in fork order and the tokens decoded (one per fork plus the continuations)."""
    todo = [j for j, (_, t, tok, _) in enumerate(forks) if tok not in eos and t + 1 < sampling.max_new_tokens]
    conts, cont_tokens = continue_prefixes(
        backend,
        [prompts[forks[j][0]] for j in todo],
        [roots[forks[j][0]].token_ids[: forks[j][1]] + (forks[j][2],) for j in todo],
        sampling,
        generator,
    )
    cont_of = dict(zip(todo, conts))
    out = []
    for j, (i, t, tok, lp) in enumerate(forks):
        c = roots[i]
        head_ids, head_lps = c.token_ids[:t] + (tok,), c.logprobs[:t] + (lp,)
        rest = cont_of.get(j)
        if rest is None:
            out.append(Completion(head_ids, head_lps, "stop" if tok in eos else "length"))
        else:
            out.append(Completion(head_ids + rest.token_ids, head_lps + rest.logprobs, rest.finish))
    return out, len(forks) + cont_tokens


def top_up(
    backend, prompts: Sequence[Sequence[int]], ks: Sequence[int], out: Groups, sampling: Sampling, generator=None
) -> tuple[int, int]:
    """Fill each group ``out[r]`` up to ``ks[r]`` rollouts with independent samples of prompt r (rows
    without a tree path), in place. Returns the rows added and the tokens decoded."""
    rows = [r for r, k in enumerate(ks) for _ in range(k - len(out[r]))]
    if not rows:
        return 0, 0
    fresh = backend.generate([prompts[r] for r in rows], sampling, generator)
    for r, c in zip(rows, fresh):
        out[r].append((c, None))
    return len(rows), sum(len(c.token_ids) for c in fresh)
