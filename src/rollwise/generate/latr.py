"""LATR tree rollouts: branch at uncertain tokens, look ahead, prune look-alikes, then sample.

Paper: "Lookahead Tree-Based Rollouts for Enhanced Trajectory-Level Exploration in Reinforcement
Learning with Verifiable Rewards" (LATR), arXiv 2510.24302; spec: systems.md §6, which was read
from the released code (starreeze/latr). Options: ``sampling.latr`` (``config.TreeSamplingConfig``).

For a group of ``n`` rollouts of one prompt at training step ``s``:

1. **Split.** ``k = round(n * eta(s))`` rollouts come from the tree, the other ``n - k`` are
   sampled i.i.d. by the pool as usual (``eta`` = ``schedule`` value of the largest key <= s).
   ``k < 2`` means no tree (a one-branch tree is plain sampling after an empty tree phase).
   The step ``s`` the pool looks ``eta`` up with is the *policy version* it generates with
   (``LocalPool.rollouts(plan, version)``, the loop's ``RunState.policy_version``), not a step
   counter of its own; the synchronous loop advances both once per step, so they are equal there.
2. **Tree phase** (roots batched in chunks; one KV-cache row per live branch, duplicated with
   ``Cache.reorder_cache`` when a branch is born). Chunking (``max_batch``: the pool's
   ``model.max_batch``, else the backend's): a root may hold at most ``k' = min(k, max_batch)``
   branches in the tree phase (the fill step tops it up to k), and the roots of a call are cut,
   in order, into chunks with ``sum k' <= max_batch``, decoded one after another, so no forward
   sees more than ``max_batch`` rows. Each chunk is one "batch" of the released code: its exit
   test (4.) counts the roots of that chunk only. The tree phase draws no random numbers and the
   continuation (6.) is one call over all chunks, so the chunking changes the output only through
   that exit test (and, with ``k > max_batch``, the cap) [ours]. Every step each live branch takes its top-1 raw
   (temperature-free) token, i.e. the tree phase is *greedy* except at branch points. Candidate
   j = 2..m of the raw top-m spawns a child (a copy of the branch, extended with token j) when
   ``p_j > tau_abs`` and ``p_1 - p_j < tau_rel``, while its root has fewer than k branches
   (candidates are admitted by rank, then by row).
3. **Lookahead pruning.** When a child's age (tokens since birth) is in ``lookahead``, its tokens
   since birth are compared with its parent's over the same positions; it is removed (with its
   descendants [inferred]) if normalised Levenshtein distance < ``ed_threshold``, the suffix-match
   score > ``suffix_threshold`` or token ROUGE-L F > ``rouge_threshold``. Skipped when either
   segment holds EOS, or (``keep_math_symbols``) the parent's token at the divergence point is an
   operator. Roots are never pruned.
4. **Exit** (per chunk) once the full roots (>= k' branches, or all finished) reach
   ``(exit_fraction - exit_decay * t / force_return_step) * sum k'`` and no live child is younger
   than ``max(lookahead)``; or after ``force_return_step`` tokens; or when every branch finished.
5. **Fill** a root with fewer than k branches by copying its first (root) branch.
6. **Continue** every unfinished branch with the backend's ordinary sampler (``HFBackend.generate``,
   the rollout temperature and top-p) up to ``max_new_tokens``.

Log-probs: every token's reported log-prob is the behaviour log-prob the ordinary sampler would
report for that token at this state (``hf.sampling_logprobs``: temperature-scaled, top-p
renormalised), so objectives see the same quantity as for sampled tokens. The tree-phase tokens
were *chosen*, not sampled, so (as the spec notes) tree rollouts are not samples of pi at T; the
decaying schedule limits the bias. A candidate with log-prob -inf under top-p is not branched on
(ours: its log-prob would be unusable).

Tree record: each rollout gets a ``TreePath`` (node ids and segment starts). A branch point ends
the parent's node; the parent's continuation and the child get new nodes. Copies made by the
fill step split at the exit position. Nodes with a single child are merged into it at the end, so
a node is a maximal shared segment (what the ``tree`` advantage needs).

Cost: ``generate`` returns the number of tokens actually decoded (shared prefixes once, pruned
branches included), which the pool charges as ``cost/generated_tokens``; ``last_stats`` holds the
call's ``tree_steps`` (longest chunk), ``branches_born`` and ``branches_pruned`` (pruned ones
included in both).

What the tree needs, declared in ``COMPAT`` and refused at config load by ``rollwise.compat``:
the hf backend in the trainer's process (its decode steps), being the only part that makes the
training rollouts (a replay with ``wrap_pool``, APRIL or SPEC-RL, would bypass the tree); its rows
carry no sampler entropies. That the backend it gets is hf is checked again when the sampler is
built (``session.Run``).

The continuation (6.), the tree paths, the backend check and the sampler's constructor and
``generate`` entry (``forks.ForkSampler``) are the fork machinery LATR shares with ETMR and EC-Tree
(``rollwise.generate.forks``).

Deviations / reconstructions: the continuation uses the same HF sampler (the code hands it to
vLLM); the exit threshold sums per-root ``min(branches, k)`` with k per root (the code has one
k); pruning a child also removes its descendants [inferred]; the operator set for
``keep_math_symbols`` is ours [inferred]; the stop-word, model-based and cumulative-probability
filters and ``sample_nk`` variants are not implemented.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from rollwise.backends.hf import HFBackend, sampling_logprobs
from rollwise.generate.forks import ForkSampler, continue_prefixes, merge_unary
from rollwise.registry import Compat
from rollwise.types import Completion, Sampling

MATH_SYMBOLS = frozenset("+-*/=^()<>%")


COMPAT = Compat(needs_decode_hooks=True, owns_generation=True, sampler_entropy=False)  # module docstring


def chunks(ks: Sequence[int], max_batch: int | None) -> list[tuple[int, int]]:
    """Cut roots ``0..len(ks)`` into consecutive ``(start, stop)`` chunks whose caps
    ``min(k, max_batch)`` sum to at most ``max_batch`` (None: one chunk). Example: ks (4, 4, 2),
    max_batch 6 -> [(0, 1), (1, 3)]."""
    if not ks:
        return []
    if not max_batch:
        return [(0, len(ks))]
    out, start, used = [], 0, 0
    for r, k in enumerate(ks):
        c = min(k, max_batch)
        if r > start and used + c > max_batch:
            out.append((start, r))
            start, used = r, 0
        used += c
    out.append((start, len(ks)))
    return out


def mix_ratio(schedule: dict[int, float], step: int) -> float:
    """LATR's ``mix_ratio_schedule`` lookup: the value of the largest key <= ``step`` (0 before the
    first key). Example: {0: 1, 10: .75, 20: .5} -> step 9: 1.0, step 10: 0.75, step 99: 0.5."""
    keys = [k for k in schedule if k <= step]
    return float(schedule[max(keys)]) if keys else 0.0


def tree_size(n: int, eta: float) -> int:
    """Tree rollouts of a group of n: ``round(n * eta)``, or 0 when that is below 2."""
    k = int(round(n * eta))
    return k if k >= 2 else 0


def math_symbol_ids(decode, vocab_size: int) -> frozenset[int]:
    """Token ids whose decoded text (stripped) is a non-empty run of operator characters."""
    out = set()
    for i in range(vocab_size):
        try:
            t = decode([i]).strip()
        except Exception:  # noqa: BLE001 - odd special tokens
            continue
        if t and all(ch in MATH_SYMBOLS for ch in t):
            out.add(i)
    return frozenset(out)


# ---------------------------------------------------------------- similarity tests (pure)


def edit_distance(a: Sequence[int], b: Sequence[int]) -> int:
    """Levenshtein distance between token sequences. Example: (1,2,3) vs (1,3) -> 1."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def normalised_edit_distance(a: Sequence[int], b: Sequence[int]) -> float:
    """``ed(a, b) / max(len a, len b)`` (segments compared here have equal length)."""
    n = max(len(a), len(b))
    return edit_distance(a, b) / n if n else 0.0


def suffix_match(a: Sequence[int], b: Sequence[int]) -> float:
    """Longest suffix of one segment that occurs contiguously anywhere in the other, divided by the
    (longer) length. Example: a=(1,2,3,4), b=(9,3,4,9) -> suffix (3,4) of a is in b -> 2/4."""
    n = max(len(a), len(b))
    if not n:
        return 0.0

    def longest(x, y):
        ys = tuple(y)
        for L in range(len(x), 0, -1):
            suf = tuple(x[len(x) - L :])
            if any(ys[i : i + L] == suf for i in range(len(ys) - L + 1)):
                return L
        return 0

    return max(longest(a, b), longest(b, a)) / n


def rouge_l(a: Sequence[int], b: Sequence[int]) -> float:
    """Token ROUGE-L F1: ``2 LCS / (len a + len b)`` (precision = recall weights equal)."""
    if not a or not b:
        return 0.0
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b, 1):
            cur.append(prev[j - 1] + 1 if x == y else max(prev[j], cur[j - 1]))
        prev = cur
    lcs = prev[-1]
    return 2.0 * lcs / (len(a) + len(b))


def too_similar(child: Sequence[int], parent: Sequence[int], opts) -> bool:
    """True when any enabled similarity test fires (identical segments: distance 0 < tau_ed)."""
    if opts.ed_threshold is not None and normalised_edit_distance(child, parent) < opts.ed_threshold:
        return True
    if opts.suffix_threshold is not None and suffix_match(child, parent) > opts.suffix_threshold:
        return True
    return opts.rouge_threshold is not None and rouge_l(child, parent) > opts.rouge_threshold


# ---------------------------------------------------------------- the tree sampler


@dataclass
class _Branch:
    root: int  # index of the root (request) in the call
    tokens: list[int]
    logprobs: list[float]
    path: list[tuple[int, int]]  # (node id, start) root -> current node
    birth: int = 0  # completion position of the first own token (0 for a root branch)
    parent: _Branch | None = None
    children: list[_Branch] = field(default_factory=list)
    finish: str | None = None  # "stop" / "length" once finished in the tree phase
    pruned: bool = False


class LatrSampler(ForkSampler):
    """Generates the tree part of groups; ``pool.tree`` (``distributed.local``) routes to it."""

    key = "sampling.latr"
    metrics = "latr"  # prefix of the pool's tree metrics
    needs = ("forward_step", "left_pad", "generate")  # its own decode loop (module docstring, 2.)

    def __init__(
        self, backend: HFBackend, opts, symbol_ids: frozenset[int] = frozenset(), max_batch: int | None = None
    ):
        super().__init__(backend, opts, max_batch)  # max_batch: rows per tree-phase forward
        self.symbol_ids = symbol_ids

    def tree_size(self, n: int, step: int) -> int:
        return tree_size(n, mix_ratio(self.opts.schedule, step))

    def grow(self, prompts, ks, sampling, generator, max_batch):
        """For each prompt and tree size k >= 1, k completions with their tree paths; the tokens
        decoded (tree phase + continuation). ``max_batch``: most rows per tree-phase forward
        (default: ``self.max_batch``, else the backend's; see the module doc)."""
        mb = max_batch or self.max_batch or getattr(self.backend, "max_batch", None)
        model = self.backend.model
        was_training = model.training
        model.eval()
        branches, decoded, steps = [], 0, 0
        try:
            for lo, hi in chunks(ks, mb):
                caps = [min(k, mb) if mb else k for k in ks[lo:hi]]
                bs, d, t = self._tree_phase(prompts[lo:hi], caps, sampling)
                for b in bs:
                    b.root += lo
                branches += bs
                decoded += d
                steps = max(steps, t)
        finally:
            model.train(was_training)
        kept = [b for b in branches if not b.pruned]
        out, cont_tokens = self._fill_and_continue(prompts, ks, kept, sampling, generator)
        stats = {
            "tree_steps": steps,
            "branches_born": sum(b.parent is not None for b in branches),
            "branches_pruned": sum(b.pruned for b in branches),
        }
        return out, decoded + cont_tokens, stats

    # ------------------------------------------------------------ phase 2-4
    def _tree_phase(self, prompts, ks, sampling: Sampling):
        o, be = self.opts, self.backend
        eos = be._eos_set
        limit = min(o.force_return_step, sampling.max_new_tokens)
        branches = [_Branch(r, [], [], [(next(self._ids), 0)]) for r in range(len(prompts))]
        live = list(branches)  # row i of the batch tensors is live[i]
        decoded = 0
        cache = None
        mask = pos = inp = None
        max_r = max(o.lookahead)
        t = 0
        while live and t < limit and not self._should_exit(branches, ks, live, t, max_r):
            if cache is None:
                inp, mask, pos = be.left_pad([list(prompts[b.root]) for b in live])
            logits, cache = be.forward_step(inp, mask, pos, cache)
            lp_table = sampling_logprobs(logits, sampling)
            probs = torch.softmax(logits, dim=-1)
            top_p, top_i = probs.topk(min(o.max_branch_per_token, probs.shape[-1]), dim=-1)
            chosen = top_i[:, 0].tolist()
            counts = self._branch_counts(branches, len(prompts))
            new_children: list[tuple[int, _Branch, int]] = []  # (parent row, child, token)
            split: set[int] = set()  # branches whose node was split at this step
            for j in range(1, top_i.shape[1]):
                for row, b in enumerate(live):
                    pj, tok = float(top_p[row, j]), int(top_i[row, j])
                    if not (pj > o.tau_abs and float(top_p[row, 0]) - pj < o.tau_rel):
                        continue
                    if counts[b.root] >= ks[b.root] or not torch.isfinite(lp_table[row, tok]):
                        continue
                    counts[b.root] += 1
                    if id(b) not in split:  # the parent's node ends here; its continuation is a new node
                        split.add(id(b))
                        b.path.append((next(self._ids), t))
                    child = _Branch(
                        b.root,
                        list(b.tokens),
                        list(b.logprobs),
                        b.path[:-1] + [(next(self._ids), t)],
                        birth=t,
                        parent=b,
                    )
                    b.children.append(child)
                    branches.append(child)
                    new_children.append((row, child, tok))
            rows = list(range(len(live))) + [r for r, _, _ in new_children]
            toks = chosen + [tok for _, _, tok in new_children]
            live = live + [c for _, c, _ in new_children]
            idx = torch.tensor(rows, dtype=torch.long, device=logits.device)
            if new_children:
                cache.reorder_cache(idx)
                mask, pos = mask[idx], pos[idx]
            tok_t = torch.tensor(toks, dtype=torch.long, device=logits.device)
            lps = lp_table[idx].gather(1, tok_t[:, None])[:, 0].tolist()
            decoded += len(live)
            for b, tok, lp in zip(live, toks, lps):
                b.tokens.append(tok)
                b.logprobs.append(lp)
                if tok in eos:
                    b.finish = "stop"
                elif len(b.tokens) >= sampling.max_new_tokens:
                    b.finish = "length"
            t += 1
            self._prune(live, t, eos)
            keep = [i for i, b in enumerate(live) if b.finish is None and not b.pruned]
            if not keep:
                live = []
                break
            if len(keep) < len(live):
                kidx = torch.tensor(keep, dtype=torch.long, device=logits.device)
                cache.reorder_cache(kidx)
                mask, pos, tok_t = mask[kidx], pos[kidx], tok_t[kidx]
            live = [live[i] for i in keep]
            inp = tok_t[:, None]
            pos = pos[:, -1:] + 1
            mask = torch.cat([mask, torch.ones((len(live), 1), dtype=mask.dtype, device=mask.device)], dim=1)
        return branches, decoded, t  # pruned ones included (for the stats)

    @staticmethod
    def _branch_counts(branches, n_roots) -> list[int]:
        counts = [0] * n_roots
        for b in branches:
            if not b.pruned:
                counts[b.root] += 1
        return counts

    def _should_exit(self, branches, ks, live, t, max_r) -> bool:
        o = self.opts
        per_root: dict[int, list[_Branch]] = {}
        for b in branches:
            if not b.pruned:
                per_root.setdefault(b.root, []).append(b)
        full = 0
        for r, k in enumerate(ks):
            bs = per_root.get(r, [])
            full += k if (len(bs) >= k or all(b.finish is not None for b in bs)) else len(bs)
        frac = o.exit_fraction - (o.exit_decay * t / o.force_return_step if o.force_return_step else 0.0)
        young = any(b.parent is not None and t - b.birth < max_r for b in live)
        return full >= frac * sum(ks) and not young

    def _prune(self, live, t, eos) -> None:
        """Lookahead test for children whose age (tokens since birth) is in ``lookahead``."""
        o = self.opts
        for b in live:
            if b.pruned or b.parent is None or (t - b.birth) not in o.lookahead:
                continue
            seg = b.tokens[b.birth : t]
            par = b.parent.tokens[b.birth : t]
            if any(x in eos for x in seg) or any(x in eos for x in par) or len(par) < len(seg):
                continue
            if o.keep_math_symbols and par and par[0] in self.symbol_ids:
                continue
            if too_similar(seg, par, o):
                _remove(b)

    # ------------------------------------------------------------ phase 5-6
    def _fill_and_continue(self, prompts, ks, branches, sampling, generator):
        per_root: list[list[_Branch]] = [[] for _ in prompts]
        for b in branches:
            per_root[b.root].append(b)
        # Fill: copies of the root's first branch; every copy of a branch splits at its end.
        entries: list[list[tuple[_Branch, list[tuple[int, int]]]]] = []
        for r, bs in enumerate(per_root):
            copies = {id(b): 1 for b in bs}
            copies[id(bs[0])] += max(0, ks[r] - len(bs))
            items = []
            for b in bs:
                if copies[id(b)] == 1:
                    items.append((b, list(b.path)))
                else:
                    at = len(b.tokens)
                    items.extend((b, b.path + [(next(self._ids), at)]) for _ in range(copies[id(b)]))
            entries.append(items[: ks[r]])
        todo = [(r, i) for r, items in enumerate(entries) for i, (b, _) in enumerate(items) if b.finish is None]
        done, cont_tokens = continue_prefixes(
            self.backend, [prompts[r] for r, _ in todo], [entries[r][i][0].tokens for r, i in todo], sampling, generator
        )
        conts: dict[tuple[int, int], Completion] = dict(zip(todo, done))
        out = []
        for r, items in enumerate(entries):
            paths = merge_unary([p for _, p in items])
            group = []
            for i, (b, _) in enumerate(items):
                c = conts.get((r, i))
                if c is None:
                    comp = Completion(tuple(b.tokens), tuple(b.logprobs), b.finish or "length")
                else:
                    comp = Completion(tuple(b.tokens) + c.token_ids, tuple(b.logprobs) + c.logprobs, c.finish)
                group.append((comp, paths[i]))
            out.append(group)
        return out, cont_tokens


def _remove(b: _Branch) -> None:
    b.pruned = True
    for c in b.children:
        _remove(c)
