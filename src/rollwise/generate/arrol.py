"""ARRoL: online rollout pruning with a quality head trained on the fly.

Paper: "Prune as You Generate: Online Rollout Pruning for Faster and Better RLVR" (ARRoL),
arXiv 2603.24840, ACL 2026 (allocation.md §10). The authors' repository holds only a README, so
everything past the abstract's components (a lightweight quality head, pruning part-way through
decoding towards correctness-balanced groups, target ratio 0.5) is the spec's reconstruction
[RECON] or ours, marked below. Config: ``[sampling.arrol]`` (``enabled = true``).

Algorithm, per generation call (``ArrolPool.generate``; a pool wrapper, so the loop is unchanged):

1. A request for ``n`` rollouts (``N_keep``) starts ``N_0 = ceil(oversample * n)`` (default 2n,
   the spec's example) once the head is trusted (step 7); before that, exactly ``n``.
2. At the check point ``L_p`` (``check_tokens``, or ``ceil(check_fraction * max_new_tokens)``,
   default 25% [RECON]) the hf backend's decode hook hands over the policy's last-layer hidden
   state at each row's current position (the state after its L_p generated tokens). The head
   scores every still-running row: ``q = sigmoid(head(h))`` (``head = "linear"``, the spec's
   ``w^T h + b``, or a one-hidden-layer ``"mlp"``; on detached, standardised features).
3. **Pruning rule** (balance-seeking): of a group's rows, those already finished stay (they cost
   nothing more); of the running ones ``k = N_keep - finished`` survive, chosen by
   :func:`balanced_subset` so that their mean ``q`` is as close as possible to
   ``target_ratio`` (0.5). The spec's greedy "k/2 highest + k/2 lowest" is one of the
   candidates, so the rule is never worse than it. The rest stop at once (finish "partial").
4. **Exactly N_keep survivors** (spec §10.4): rows that finished before the check point are
   outside the running rows' quota, and a chunk whose rows all finish before ``L_p`` never
   reaches the hook, so after decoding :func:`trim_surplus` cuts each request's survivors to
   ``n``: featureless (finished-early) rows first, in row order (a uniform choice, rows being
   i.i.d.; no RNG), then the head-scored ones by :func:`balanced_subset`. The extras are
   dropped *before* verification (``arrol/surplus``, ``arrol/surplus_tokens``).
5. Survivors finish decoding and are verified. **Pruned and surplus rollouts are never
   verified and never trained on**: they are not in the returned groups. Their tokens (and the
   prompt work) were spent, so ``cost/generated_tokens`` counts every generated token and
   ``cost/rollouts`` every started rollout; ``cost/verifier_calls`` counts the verified ones.
   Tokens generated per request are at most ``N_0 * L_p + N_keep * (L_max - L_p)``.
6. **Head training** (online): every completed, verified rollout that was running at the check
   point gives one (feature at the check point, reward) pair; pairs go to a FIFO buffer
   (``buffer``), and the head takes ``head_steps`` full-batch Adam steps of BCE on it after
   each generation call. Pruned rollouts have no outcome, so they give no pair (the spec's
   "pruned and finished if cached" needs an outcome the pruned ones never get). Deviation:
   once pruning is on, the head learns from survivors only (a selection the head itself made).
7. **Warm-up** [RECON, the spec's first suggestion]: pruning stays off until the head has seen
   ``min_examples`` pairs and its *prequential* AUC (each call's new pairs scored before the
   head trains on them; exponential average with ``auc_decay``) reaches ``min_auc``; it turns
   off again if the AUC falls below. While off, groups are generated as usual (features are
   still collected; ``N_0 = n``, so nothing is pruned or trimmed).

Also ours: a group that the backend's ``max_batch`` chunking splits over two chunks is pruned
per chunk, its ``N_keep`` shared in proportion to the rows in each chunk. Evaluation
(``rollouts(..., charge=False)``) is never pruned. Advantages are computed over the survivors
(the group is the surviving set), as the spec says.

Metrics (``cost.metrics``, one ledger line per step): ``arrol/active``, ``arrol/started``,
``arrol/pruned``, ``arrol/pruned_tokens``, ``arrol/surplus`` and ``arrol/surplus_tokens``
(finished rows beyond ``N_keep`` dropped unverified, step 4), ``arrol/examples``, ``arrol/head_auc`` (averaged
prequential AUC), ``arrol/head_loss``, ``arrol/q_running_mean`` and ``arrol/q_kept_mean`` (mean
head score of the running rows at the check point, and of the survivors among them).
The head's weights, optimiser, buffer and AUC go into checkpoints (``state_dict``).
"""

from __future__ import annotations

import inspect
import itertools
import math
import time
from collections.abc import Sequence

import torch

from rollwise.config import ArrolOptions as Options  # noqa: F401 (the schema lives in config.py)
from rollwise.generate.common import merge_groups
from rollwise.registry import Compat, UserError
from rollwise.types import Group, Plan, PoolWrapper


def check_step(opts: Options, max_new_tokens: int) -> int:
    """L_p: tokens generated before the check point."""
    if opts.check_tokens is not None:
        return opts.check_tokens
    return max(1, math.ceil(opts.check_fraction * max_new_tokens - 1e-9))


def check_config(cfg) -> None:
    """Local check of ``sampling.arrol`` (``rollwise.compat.check``): the check point comes before
    ``sampling.max_new_tokens``. What it cannot be combined with is in ``COMPAT``."""
    a = cfg.sampling.arrol
    if not a.enabled:
        return
    at, limit = check_step(a, cfg.sampling.max_new_tokens), cfg.sampling.max_new_tokens
    if at >= limit:
        key = "check_tokens" if a.check_tokens is not None else "check_fraction"
        raise UserError(
            f"sampling.arrol.{key} puts the check point at {at} tokens; it must be below "
            f"sampling.max_new_tokens={limit}"
        )


COMPAT = Compat(
    needs_decode_hooks=True, owns_generation=True
)  # the hf backend's decode hook; makes the training rollouts


# ---------------------------------------------------------------------------- pruning rule


EXACT_LIMIT = 256  # balanced_subset enumerates every subset up to this many


def balanced_subset(q: Sequence[float], k: int, rho: float = 0.5) -> list[int]:
    """Indices (sorted) of ``k`` of the scores ``q`` whose mean is as close as possible to ``rho``.

    Exact (all subsets) when there are at most ``EXACT_LIMIT`` of them (e.g. 8 choose 4 = 70).
    Otherwise a heuristic (the exact problem is a cardinality-constrained subset sum): the best of
    every window of k consecutive scores in sorted order and every "j highest + (k - j) lowest"
    (the spec's greedy is j = k/2), improved by single swaps until none helps; so it is never
    worse than the spec's greedy and no single swap improves it. Ties: the first candidate.

    Example: q = [0.9, 0.8, 0.2, 0.7, 0.1, 0.3], k = 2, rho = 0.5 -> a pair with mean 0.5, e.g.
    {0.8, 0.2} or {0.7, 0.3} or {0.9, 0.1}. Note: the spec's property "the survivors' mean is at
    least as close to rho as the mean over all" cannot always hold: q = [0, 0, 0, 1], k = 2,
    rho = 0.3 has overall mean 0.25 (distance 0.05) but every pair has mean 0 or 0.5.
    """
    n = len(q)
    if k >= n:
        return list(range(n))
    if k <= 0:
        return []
    order = sorted(range(n), key=lambda i: q[i])
    target = rho * k
    if math.comb(n, k) <= EXACT_LIMIT:
        return list(min(itertools.combinations(range(n), k), key=lambda s: abs(sum(q[i] for i in s) - target)))
    cands = [order[i : i + k] for i in range(n - k + 1)] + [order[: k - j] + order[n - j :] for j in range(1, k + 1)]
    best = min(cands, key=lambda s: abs(sum(q[i] for i in s) - target))
    kept, total = set(best), sum(q[i] for i in best)
    while True:
        d, swap = abs(total - target), None
        for a in kept:
            for b in range(n):
                if b not in kept and abs(total - q[a] + q[b] - target) < d - 1e-12:
                    d, swap = abs(total - q[a] + q[b] - target), (a, b)
        if swap is None:
            return sorted(kept)
        kept.remove(swap[0])
        kept.add(swap[1])
        total += q[swap[1]] - q[swap[0]]


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float | None:
    """Area under the ROC curve (Mann-Whitney, ties count 1/2); None without both classes.

    Example: scores [0.1, 0.4, 0.35, 0.8], labels [0, 0, 1, 1] -> 3 of 4 (pos, neg) pairs
    ordered correctly -> 0.75.
    """
    pos, neg = scores[labels > 0.5], scores[labels <= 0.5]
    if not pos.numel() or not neg.numel():
        return None
    diff = pos[:, None] - neg[None, :]
    return float(((diff > 0).double() + 0.5 * (diff == 0).double()).mean())


# ---------------------------------------------------------------------------- quality head


class QualityHead:
    """q = sigmoid(head(standardise(h))), trained with BCE on a FIFO buffer of (h, reward)."""

    def __init__(self, opts: Options, seed: int = 0):
        self.opts, self.seed = opts, seed
        self.net: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.x = torch.zeros(0, 0)
        self.y = torch.zeros(0)
        self.mu = self.sd = None
        self.auc: float | None = None
        self.seen = 0
        self.last_loss: float | None = None

    def _build(self, dim: int) -> None:
        with torch.random.fork_rng():  # the head's init must not move the run's global RNG
            torch.manual_seed(self.seed)
            if self.opts.head == "linear":
                self.net = torch.nn.Linear(dim, 1)
            else:
                self.net = torch.nn.Sequential(
                    torch.nn.Linear(dim, self.opts.head_hidden),
                    torch.nn.ReLU(),
                    torch.nn.Linear(self.opts.head_hidden, 1),
                )
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=self.opts.head_lr)
        self.x = torch.zeros(0, dim)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.net((x - self.mu) / self.sd)[:, 0]

    @torch.no_grad()
    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """(n,) predicted success probability of features ``x`` (n, H); 0.5 before any training."""
        if self.net is None or self.mu is None:
            return torch.full((x.shape[0],), 0.5)
        return torch.sigmoid(self._logits(x.float()))

    def trusted(self) -> bool:
        return (
            self.seen >= self.opts.min_examples
            and self.net is not None
            and (self.opts.min_auc <= 0 or (self.auc is not None and self.auc >= self.opts.min_auc))
        )

    def update(self, x: torch.Tensor, y: torch.Tensor) -> dict:
        """Score the new pairs (prequential AUC), add them to the buffer, take the BCE steps."""
        if x.shape[0] == 0:
            return {}
        x, y = x.float(), y.float().clamp(0.0, 1.0)
        if self.net is None:
            self._build(x.shape[1])
        new_auc = auc(self.predict(x), y) if self.mu is not None else None
        if new_auc is not None:
            d = self.opts.auc_decay
            self.auc = new_auc if self.auc is None else d * self.auc + (1 - d) * new_auc
        self.x = torch.cat([self.x, x])[-self.opts.buffer :]
        self.y = torch.cat([self.y, y])[-self.opts.buffer :]
        self.seen += int(x.shape[0])
        self.mu, self.sd = self.x.mean(0), self.x.std(0, unbiased=False) + 1e-5
        loss_fn = torch.nn.BCEWithLogitsLoss()
        for _ in range(self.opts.head_steps):
            self.optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(self._logits(self.x), self.y)
            loss.backward()
            self.optimizer.step()
        with torch.no_grad():
            self.last_loss = float(loss_fn(self._logits(self.x), self.y))
        return {"arrol/head_loss": self.last_loss}

    def state_dict(self) -> dict:
        return {
            "net": None if self.net is None else self.net.state_dict(),
            "dim": int(self.x.shape[1]) if self.net is not None else None,
            "optimizer": None if self.optimizer is None else self.optimizer.state_dict(),
            "x": self.x,
            "y": self.y,
            "mu": self.mu,
            "sd": self.sd,
            "auc": self.auc,
            "seen": self.seen,
            "last_loss": self.last_loss,
        }

    def load_state_dict(self, s: dict) -> None:
        self.net, self.optimizer = None, None
        if s["net"] is not None:
            self._build(s["dim"])
            self.net.load_state_dict(s["net"])
            self.optimizer.load_state_dict(s["optimizer"])
        self.x, self.y, self.mu, self.sd = s["x"], s["y"], s["mu"], s["sd"]
        self.auc, self.seen, self.last_loss = s["auc"], s["seen"], s["last_loss"]


# ---------------------------------------------------------------------------- decode hook


class PruneHook:
    """The hf backend's decode hook for one generation call (``HFBackend.generate(decode_hook=)``).
    Both decode paths call it before exactly the step it asks for (``wants``): the static path
    (``rollwise.backends.static_decode``) runs that step outside its CUDA graph and reads "done"
    there, so pruning acts at the same token as on the eager path; only the host's other reads
    of "done" (the end of a chunk, APRIL's stop) come every 8 steps.

    ``units``: one ``(rows, keep)`` per request, ``rows`` its indices into the call's sequences.
    At the check point it caches each running row's feature and, when ``active``, stops the
    rows :func:`balanced_subset` does not keep.
    """

    def __init__(self, check_at: int, units: list[tuple[list[int], int]], head: QualityHead, active: bool, rho: float):
        self.check_at, self.head, self.active, self.rho = check_at, head, active, rho
        self.unit_of = {r: u for u, (rows, _) in enumerate(units) for r in rows}
        self.remaining = [[len(rows), keep] for rows, keep in units]  # rows not yet seen, keep quota left
        self.features: dict[int, torch.Tensor] = {}
        self.pruned: set[int] = set()
        self.q_running: list[float] = []
        self.q_kept: list[float] = []

    def wants(self, t: int) -> bool:
        return t == self.check_at

    def __call__(self, t: int, rows: torch.Tensor, hidden: torch.Tensor, alive: torch.Tensor) -> torch.Tensor | None:
        ids, running = rows.tolist(), alive.cpu().tolist()
        h = hidden.detach().float().cpu()
        for i, r in enumerate(ids):
            if running[i]:
                self.features[r] = h[i].clone()
        if not self.active:
            return None
        q = self.head.predict(h).tolist()
        stop = torch.zeros(len(ids), dtype=torch.bool)
        by_unit: dict[int, list[int]] = {}
        for i, r in enumerate(ids):
            by_unit.setdefault(self.unit_of[r], []).append(i)
        for u, local in by_unit.items():
            left, quota_left = self.remaining[u]
            quota = quota_left if len(local) >= left else round(quota_left * len(local) / left)
            self.remaining[u] = [left - len(local), quota_left - quota]
            live = [i for i in local if running[i]]
            k = min(len(live), max(0, quota - (len(local) - len(live))))
            keep = {live[j] for j in balanced_subset([q[i] for i in live], k, self.rho)}
            self.q_running += [q[i] for i in live]
            self.q_kept += [q[i] for i in keep]
            for i in live:
                if i not in keep:
                    stop[i] = True
                    self.pruned.add(ids[i])
        return stop


def trim_surplus(units: list[tuple[list[int], int]], hook: PruneHook, head, rho: float) -> set[int]:
    """Rows to drop so that each unit (request) keeps at most its ``N_keep`` (spec §10.4: exactly
    ``N_keep`` survivors). The hook keeps rows that finished before the check point outside the
    running rows' quota, and never fires on a chunk whose rows all finish before ``L_p``, so more
    than ``N_keep`` can come back. Of a unit's surviving (not pruned) rows:

    - rows the head never scored (finished before the check point, no feature) come first, in row
      order: rows are i.i.d. draws and the order does not depend on their content, so taking the
      first ones is a uniform choice among them, deterministic and with no RNG to checkpoint;
    - the rest of the quota goes to the rows scored at the check point, chosen among them by
      :func:`balanced_subset` on the head's predictions (the pruning rule itself).

    Finished-early rows first mirrors the hook (they cost nothing more); like the hook it then
    favours short completions in groups where many rows finish before ``L_p``.

    Example: N_keep = 4, survivors 0..7 all finished before L_p (the hook never fired) -> rows
    4..7 are dropped. Dropped rows were generated (their tokens stay charged, ``arrol/surplus*``)
    but are not verified or trained on, like pruned ones.
    """
    drop: set[int] = set()
    for rows, keep in units:
        alive = [r for r in rows if r not in hook.pruned]
        if len(alive) <= keep:
            continue
        unscored = [r for r in alive if r not in hook.features]
        scored = [r for r in alive if r in hook.features]
        kept = unscored[:keep]
        k = keep - len(kept)
        if k > 0:
            q = head.predict(torch.stack([hook.features[r] for r in scored])).tolist()
            kept += [scored[j] for j in balanced_subset(q, k, rho)]
        drop |= set(alive) - set(kept)
    return drop


# ---------------------------------------------------------------------------- the pool wrapper


class ArrolPool(PoolWrapper):
    """Wraps a ``LocalPool``: training generation is pruned (module docstring), evaluation
    (``rollouts``) and the cost hand-over (``take_cost``) are the wrapped pool's."""

    def __init__(self, pool, opts: Options, max_new_tokens: int, seed: int = 0):
        if "decode_hook" not in inspect.signature(pool.backend.generate).parameters:
            raise UserError(
                f"sampling.arrol needs a backend with decode hooks (the hf backend), got {type(pool.backend).__name__}"
            )
        super().__init__(pool)
        self.opts = opts
        self.check_at = check_step(opts, max_new_tokens)
        self.head = QualityHead(opts, seed)

    def generate(self, plan: Plan, groups: list[Group], version: int) -> list[Group]:
        pool, active = self.pool, self.head.trusted()
        jobs, seqs, units = [], [], []
        for req in plan.requests:
            if req.n <= 0:
                continue
            pids = pool.codec.encode_prompt(req.prompt)
            prefix = tuple(req.prefix or ())
            first = len(seqs)
            for _ in range(math.ceil(self.opts.oversample * req.n - 1e-9) if active else req.n):
                jobs.append((req, pids, prefix))
                seqs.append(pids + prefix)
            units.append((list(range(first, len(seqs))), req.n))
        hook = PruneHook(self.check_at, units, self.head, active, self.opts.target_ratio)
        t0 = time.perf_counter()
        comps = pool.backend.generate(seqs, pool.sampling, None, decode_hook=hook) if seqs else []
        surplus = trim_surplus(units, hook, self.head, self.opts.target_ratio)
        t1 = time.perf_counter()
        out = []
        for row, ((req, pids, _prefix), c) in enumerate(zip(jobs, comps)):
            if row in hook.pruned or row in surplus:  # stopped part-way / beyond N_keep: never verified or trained on
                continue
            out.append((row, req.prompt, pool.finish_rollout(req, pids, c, version)))
        t2 = time.perf_counter()
        pairs = [(hook.features[row], r.reward) for row, _, r in out if row in hook.features and r.reward is not None]
        head_metrics = (
            self.head.update(torch.stack([f for f, _ in pairs]), torch.tensor([y for _, y in pairs])) if pairs else {}
        )
        t3 = time.perf_counter()
        self._charge(comps, out, hook, surplus, active, t1 - t0 + t3 - t2, t2 - t1, head_metrics)
        return merge_groups(groups, [(prompt, rollout) for _, prompt, rollout in out])

    def _charge(
        self,
        comps,
        out,
        hook: PruneHook,
        surplus: set[int],
        active: bool,
        generate_s: float,
        verify_s: float,
        head_metrics: dict,
    ) -> None:
        cost = self.pool.cost
        # pruned and surplus tokens were generated: they count; generate_s includes the head's training
        cost.charge(
            sum(len(c.token_ids) for c in comps), len(comps), [r.verdict for _, _, r in out], generate_s, verify_s
        )
        cost.count(
            **{
                "arrol/started": len(comps),
                "arrol/pruned": len(hook.pruned),
                "arrol/pruned_tokens": sum(len(comps[r].token_ids) for r in hook.pruned),
                "arrol/surplus": len(surplus),
                "arrol/surplus_tokens": sum(len(comps[r].token_ids) for r in surplus),
            }
        )
        m = cost.metrics
        m["arrol/active"] = float(active)
        m["arrol/examples"] = self.head.seen
        if self.head.auc is not None:
            m["arrol/head_auc"] = self.head.auc
        if hook.q_running:
            m["arrol/q_running_mean"] = sum(hook.q_running) / len(hook.q_running)
        if hook.q_kept:
            m["arrol/q_kept_mean"] = sum(hook.q_kept) / len(hook.q_kept)
        m.update(head_metrics)

    def state_dict(self) -> dict:
        return {"head": self.head.state_dict()}

    def load_state_dict(self, s: dict) -> None:
        self.head.load_state_dict(s["head"])
