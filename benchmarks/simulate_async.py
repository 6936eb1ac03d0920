"""Discrete-event simulation of one RL step under synchronous, asynchronous (AReaL, staleness bound
eta) and periodic (on-policy streaming) scheduling, for 1-64 generation workers (issue #14 item 7).

It predicts mean seconds per training step in steady state, generator and trainer idle time, the
staleness of what the trainer consumes, and the speed-up over synchronous training. It is a model,
fed by measured costs; it runs no model and needs only numpy.

Methods modelled (docs/specs/systems.md):

- **sync**: generate the whole batch with weights version i, then train, then publish the weights.
- **async** (AReaL, Fu et al., arXiv 2505.24298, §2 of the spec): a group may be submitted only while
  ``accepted + running < (eta + i + 1) * B`` (the code form of the paper's eq. 3, counted in groups:
  every submitted group is either running or accepted, so the gate is ``submitted < (eta+i+1)B``);
  the trainer takes B finished groups as soon as it is free and B are there, the oldest (smallest
  submission index) first; generation is interruptible: a weight publish pauses every worker, and
  in-flight sequences continue under the new weights (no drain). ``eta = 0`` is synchronous.
- **periodic** (Periodic Asynchrony, arXiv 2511.18871, spec §4, where the mechanism is [inferred]
  from the abstracts): batch k is generated with weights k; the trainer consumes each group as it
  finishes (forward/backward with gradient accumulation, ``train_c1 * tokens`` seconds per group),
  takes the optimizer step (``train_c0``) once all B groups are in, publishes, and only then does
  batch k+1 start. Strictly on-policy.

Where it differs from the papers: the AReaL gate counts groups (a GRPO group is one request), not
trajectories; AReaL's global ``max_concurrent_rollouts`` cap is replaced by per-worker slots with a
queue in front (a submitted group waits on its worker); the objective (decoupled PPO) does not
matter to timing and is not modelled. Periodic asynchrony's shared-prompt attention is not
modelled (it would lower ``train_c1``). Neither paper's system is simulated in detail: this is the
scheduling skeleton both share, with stated costs.

Model and assumptions (state them with any figure this produces):

1. **Batch.** A step trains B groups of G rollouts. Response lengths are drawn i.i.d. per rollout
   from a length distribution (no correlation within a group; regime.md 2.6 says real groups are
   correlated, which makes tails worse than modelled here). The lengths of group n do not depend
   on the mode, so modes are compared on the same draws.
2. **Decode.** A worker runs decode iterations; one iteration advances every sequence it holds by
   one token and takes ``decode_a + decode_b * k`` seconds with k sequences held (batched decode:
   a fixed part, memory- or overhead-bound, plus a part that grows with the batch). A sequence of
   length L holds its worker for L iterations. Prefill is not modelled separately (fold it into
   the costs). Iterations are continuous in time (a sequence may join between iterations; the
   error is below one iteration per sequence).
3. **Batching.** ``continuous``: a worker holds up to ``max_concurrent`` sequences; a new one joins
   as soon as a slot frees (vLLM / SGLang). ``static``: a worker takes up to ``max_concurrent``
   queued sequences when it holds none and decodes them until the last one finishes, finished rows
   leaving the batch (rollwise's hf backend per request: a Ray worker generates one group per call,
   so ``max_concurrent = G``; the local pool generates the whole plan in one call).
4. **Placement.** A group goes whole to the worker with the fewest held + queued sequences (ties:
   lowest index), as rollwise's Ray pool keeps a request's rollouts on one engine.
5. **Training.** One step costs ``train_c0 + train_c1 * trained tokens`` (trained tokens = the
   batch's response tokens) on the trainer's own devices (AReaL's split). ``--colocated``: the
   trainer shares the generators' devices, so generation is paused while the trainer works (as on
   this CPU machine); synchronous training is the same either way.
6. **Weight sync.** After every optimizer step the trainer publishes its weights: ``sync_s``
   seconds during which the trainer is busy and every worker is paused; the new version is visible
   when the publish ends.
7. **Staleness** of a consumed group = the trainer's version when it trains on the group minus the
   oldest weights version any of its tokens was decoded with (AReaL's "head" off-policyness). The
   gate bounds the version at *submission*; with out-of-order completion (a long group finishing
   after younger ones were consumed) the consumed staleness can exceed eta, and the histogram shows
   it. ``--take submitted`` makes the trainer consume groups strictly in submission order instead
   (staleness <= eta, at the price of waiting for the slowest group).
8. **Steady state.** The first ``warmup`` steps are excluded: mean step seconds = (end of the last
   step - end of step warmup-1) / (steps - warmup); idle shares are over that window. A generator
   is idle when it decodes nothing (waiting, or paused for a publish or for a colocated trainer);
   the trainer is idle when it neither trains nor publishes.

Inputs: CLI flags, or ``--from-run RUN_DIR`` (a rollwise run directory: ``metrics.jsonl`` per step,
``config.resolved.toml``), which fits the costs: training ``c0 + c1 * tokens`` by least squares on
``time/train_s`` against the step's trained tokens (plus the per-step seconds the ledger does not
split, ``wall_s`` minus the stage times, added to ``c0``), ``sync_s`` the median
``time/weight_sync_s``, and the decode scale such that simulating the run's own configuration
reproduces its median ``time/generate_s`` (the shape ``decode_b / decode_a`` comes from
``benchmarks/results/gen_throughput.json`` for the run's model). The ledger does not store per-rollout
lengths, so the run's lengths are the "rollwise" log-normal shape rescaled to the run's mean
tokens per rollout and capped at its ``sampling.max_new_tokens`` (or ``--lengths jsonl:PATH``).

Length distributions (``--lengths``): ``rollwise`` (default): log-normal fitted to the lengths that
``benchmarks/april_throughput.py`` measured on rollwise's chain-of-thought arithmetic (p50 31, p90
52, cap 64 tokens); ``lognormal``: ``--median`` and ``--p99`` (sigma = ln(p99/median)/2.326),
capped at ``--cap``; ``constant``: every rollout ``--median`` tokens; ``jsonl:PATH``: resample
lengths read from a file (one integer, or an object with ``length`` / ``completion_tokens`` /
``tokens``, per line).

``--validate RUN_DIR ...`` predicts each run's seconds per step from the costs of ``--calibrate``
(default: the first sync run given; ``committed``: ``machine_costs()``, fitted on the committed
``scale_out.json`` and ``gen_throughput.json``) and the run's own configuration (``distributed.workers``, and
``train.async.max_staleness`` / ``train.async.periodic`` read defensively, default sync / 0), against
its measured median seconds per step (``wall_s`` differences, evaluation time removed;
``--quiet-frac F`` keeps the fastest fraction F of the steps, for runs on a shared machine).

The comparison with published figures (``comparison`` in the JSON; AReaL 2.77x, verl fully-async
2.35x) is documented in docs/results.md, "Simulated asynchrony".

    python benchmarks/simulate_async.py                        # -> benchmarks/results/simulate_async.json
    python benchmarks/simulate_async.py --from-run runs/my-run --workers 1 2 4 8
    python benchmarks/simulate_async.py --validate runs/w1 runs/w2 runs/w2-async
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import sys
from collections import Counter, deque
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import benchinfo  # noqa: E402

MODES = ("sync", "async", "periodic")
Z99, Z90 = 2.3263478740408408, 1.2815515655446004  # standard normal quantiles


# ---------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Costs:
    """Seconds. ``decode_a + decode_b * k``: one decode iteration of a worker holding k sequences;
    ``train_c0 + train_c1 * tokens``: one optimizer step; ``sync_s``: one weight publish."""

    decode_a: float
    decode_b: float
    train_c0: float
    train_c1: float
    sync_s: float

    def iteration_s(self, k: int) -> float:
        return self.decode_a + self.decode_b * k

    def train_s(self, tokens: float) -> float:
        return self.train_c0 + self.train_c1 * tokens


@dataclass(frozen=True)
class Setup:
    mode: str = "sync"  # sync | async | periodic
    workers: int = 1  # generation workers
    groups: int = 32  # B: groups per training step
    group_size: int = 8  # G: rollouts per group
    eta: int = 0  # async staleness bound
    max_concurrent: int = 64  # sequences a worker holds at once
    batching: str = "continuous"  # continuous | static
    colocated: bool = False  # trainer shares the generators' devices
    take: str = "finished"  # async: oldest finished groups | strictly in submission order
    steps: int = 40
    warmup: int = 5

    def check(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {self.mode!r}")
        if self.batching not in ("continuous", "static"):
            raise ValueError(f"batching must be 'continuous' or 'static', not {self.batching!r}")
        if self.take not in ("finished", "submitted"):
            raise ValueError(f"take must be 'finished' or 'submitted', not {self.take!r}")
        for name in ("workers", "groups", "group_size", "max_concurrent", "steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, not {getattr(self, name)}")
        if self.eta < 0 or not 0 <= self.warmup < self.steps:
            raise ValueError(
                f"need eta >= 0 and 0 <= warmup < steps (eta={self.eta}, warmup={self.warmup}, steps={self.steps})"
            )


# ---------------------------------------------------------------- length distributions


@dataclass(frozen=True)
class LogNormal:
    """Rollout lengths ``round(median * exp(sigma * z))``, z standard normal, clipped to [1, cap]."""

    median: float
    sigma: float
    cap: int

    @classmethod
    def from_quantile(cls, median: float, q_value: float, z: float, cap: int) -> LogNormal:
        if not 0 < median < q_value:
            raise ValueError(f"need 0 < median < upper quantile (median={median}, quantile={q_value})")
        return cls(float(median), math.log(q_value / median) / z, int(cap))

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        x = np.rint(self.median * np.exp(self.sigma * rng.standard_normal(n)))
        return np.clip(x, 1, self.cap).astype(np.int64)

    def describe(self) -> dict:
        return {
            "kind": "lognormal",
            "median": self.median,
            "sigma": round(self.sigma, 4),
            "cap": self.cap,
            "p90_uncapped": round(self.median * math.exp(self.sigma * Z90), 1),
            "p99_uncapped": round(self.median * math.exp(self.sigma * Z99), 1),
        }


@dataclass(frozen=True)
class Empirical:
    """Lengths resampled with replacement from measured values."""

    values: tuple[int, ...]
    source: str = ""

    def draw(self, rng, n):
        return rng.choice(np.asarray(self.values, dtype=np.int64), size=n, replace=True)

    def describe(self):
        v = np.asarray(self.values)
        return {
            "kind": "empirical",
            "source": self.source,
            "n": len(v),
            "mean": round(float(v.mean()), 2),
            "p50": float(np.percentile(v, 50)),
            "p90": float(np.percentile(v, 90)),
            "p99": float(np.percentile(v, 99)),
            "max": int(v.max()),
        }


@dataclass(frozen=True)
class Cycle:
    """Deterministic lengths: rollout j (counted over the whole run, group by group) gets
    ``values[j % len(values)]`` (hand-worked tests)."""

    values: tuple[int, ...]

    def draw(self, rng, n):
        return np.resize(np.asarray(self.values, dtype=np.int64), n)

    def describe(self):
        return {"kind": "cycle", "values": list(self.values)[:16], "period": len(self.values)}


def constant(length: int) -> Cycle:
    return Cycle((int(length),))


# rollwise's own measured lengths: chain-of-thought arithmetic, levels 1-4, 64-token budget, 1,536
# rollouts (benchmarks/results/april_throughput.json, arm "sync"): p50 31, p90 52, p99 64 = the cap.
ROLLWISE_LENGTHS = {
    "p50": 31,
    "p90": 52,
    "cap": 64,
    "source": "benchmarks/results/april_throughput.json arms.sync.trained_response_length",
}


def rollwise_lengths(results: Path = benchinfo.RESULTS) -> LogNormal:
    """Log-normal through rollwise's measured p50 and p90 (p99 is at the cap, so it does not fix the
    spread), capped at the budget; read from the committed JSON when present."""
    q = dict(ROLLWISE_LENGTHS)
    try:
        r = json.loads((results / "april_throughput.json").read_text())["arms"]["sync"]["trained_response_length"]
        q.update(p50=r["p50"], p90=r["p90"], cap=r["max"])
    except (OSError, KeyError, ValueError):
        pass
    return LogNormal.from_quantile(q["p50"], q["p90"], Z90, q["cap"])


def read_lengths(path: str) -> Empirical:
    vals = []
    for ln in Path(path).read_text().splitlines():
        if not ln.strip():
            continue
        x = json.loads(ln)
        if isinstance(x, dict):
            x = next((x[k] for k in ("length", "completion_tokens", "tokens") if k in x), None)
        if not isinstance(x, (int, float)) or x < 1:
            raise ValueError(f"{path}: each line must be a positive length or an object with 'length', got {ln[:80]!r}")
        vals.append(int(x))
    if not vals:
        raise ValueError(f"{path}: no lengths")
    return Empirical(tuple(vals), source=str(path))


def lognormal_with_mean(mean: float, sigma: float, cap: int) -> LogNormal:
    """The log-normal of spread ``sigma`` capped at ``cap`` whose capped, rounded mean is ``mean``
    (bisection on the median; the mean is computed on a fixed quadrature of z)."""
    if not 1 <= mean <= cap:
        raise ValueError(f"mean length {mean} must be in [1, cap={cap}]")
    z = np.linspace(-6, 6, 4001)
    w = np.exp(-z * z / 2)
    w /= w.sum()

    def capped_mean(m):
        return float((np.clip(np.rint(m * np.exp(sigma * z)), 1, cap) * w).sum())

    lo, hi = 1e-3, float(cap) * 10
    for _ in range(100):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if capped_mean(mid) < mean else (lo, mid)
    return LogNormal(round(math.sqrt(lo * hi), 4), sigma, cap)


# ---------------------------------------------------------------- the simulation


class _Worker:
    __slots__ = ("it", "t", "active", "queue", "paused", "version", "stamp", "busy", "kint")

    def __init__(self):
        self.it = 0.0  # decode iterations done (continuous)
        self.t = 0.0  # the time `it` refers to
        self.active = []  # heap of (iteration at which the sequence ends, sequence id)
        self.queue = deque()  # sequence ids waiting for a slot
        self.paused = False
        self.version = 0  # weights version it decodes with
        self.stamp = 0  # invalidates its scheduled event when its state changes
        self.busy = 0.0  # seconds spent decoding
        self.kint = 0.0  # integral of held sequences over decoding time


_EV_WORKER, _EV_TRAIN_DONE, _EV_PUBLISH_DONE, _EV_GROUP_TRAINED = range(4)


class Simulation:
    """One run of ``setup.steps`` training steps; ``run()`` returns the summary dict."""

    def __init__(self, setup: Setup, costs: Costs, lengths, seed: int = 0):
        setup.check()
        self.s, self.c = setup, costs
        B, G = setup.groups, setup.group_size
        n_groups = (setup.steps + setup.eta + 1) * B
        table = np.asarray(lengths.draw(np.random.default_rng(seed), n_groups * G), dtype=np.int64)
        if table.min() < 1:
            raise ValueError("lengths must be >= 1")
        self.L = table.tolist()  # length of sequence s (group s // G)
        self.group_tokens = table.reshape(n_groups, G).sum(axis=1).tolist()
        self.left = [G] * n_groups  # unfinished sequences per group
        self.head = [None] * n_groups  # oldest version among its tokens
        self.done = [False] * n_groups
        self.workers = [_Worker() for _ in range(setup.workers)]
        self.heap, self.tick, self.t = [], 0, 0.0
        self.version = 0
        self.trainer_busy_since = None
        self.trainer_busy = 0.0
        self.step_end: list[float] = []
        self.staleness: list[int] = []  # per consumed group, in order
        self.gen_phase: list[float] = []  # sync/periodic: batch start -> last group done
        self._snap = None

    # -- event plumbing

    def _push(self, t, kind, a=0, b=0):
        self.tick += 1
        heapq.heappush(self.heap, (t, self.tick, kind, a, b))

    def _advance(self, w: _Worker, t: float):
        if w.active and not w.paused and t > w.t:
            dt = t - w.t
            k = len(w.active)
            w.it += dt / self.c.iteration_s(k)
            w.busy += dt
            w.kint += dt * k
        w.t = t

    def _schedule(self, i: int):
        w = self.workers[i]
        w.stamp += 1
        if w.active and not w.paused:
            end_it = w.active[0][0]
            self._push(w.t + max(0.0, end_it - w.it) * self.c.iteration_s(len(w.active)), _EV_WORKER, i, w.stamp)

    def _admit(self, w: _Worker):
        G = self.s.group_size
        # a paused worker takes no one in (a trainer step may pause it while its finished
        # sequences are being handled); the new ones join when it resumes, with the new version
        if w.paused or (self.s.batching == "static" and w.active):
            return
        while w.queue and len(w.active) < self.s.max_concurrent:
            sid = w.queue.popleft()
            heapq.heappush(w.active, (w.it + self.L[sid], sid))
            g = sid // G
            if self.head[g] is None or w.version < self.head[g]:
                self.head[g] = w.version

    def _submit(self, g: int):
        loads = [len(w.active) + len(w.queue) for w in self.workers]
        i = loads.index(min(loads))
        w = self.workers[i]
        self._advance(w, self.t)
        G = self.s.group_size
        w.queue.extend(range(g * G, (g + 1) * G))
        self._admit(w)
        self._schedule(i)

    def _pause_all(self):
        for _i, w in enumerate(self.workers):
            self._advance(w, self.t)
            w.paused = True
            w.stamp += 1

    def _resume_all(self):
        for i, w in enumerate(self.workers):
            w.t = self.t
            w.version = self.version
            w.paused = False
            self._admit(w)
            self._schedule(i)

    def _on_worker(self, i: int, stamp: int):
        w = self.workers[i]
        if stamp != w.stamp:
            return
        self._advance(w, self.t)
        finished = []
        while w.active and w.active[0][0] <= w.it + 1e-9 * max(1.0, w.it):
            finished.append(heapq.heappop(w.active)[1])
        G = self.s.group_size
        for sid in finished:
            g = sid // G
            self.left[g] -= 1
            if self.left[g] == 0:
                self.done[g] = True
                self._group_finished(g)
        self._admit(w)
        self._schedule(i)

    # -- trainer

    def _trainer_start(self, seconds: float, kind: int, a=0):
        self.trainer_busy_since = self.t
        if self.s.colocated and kind != _EV_PUBLISH_DONE:
            self._pause_all()
        self._push(self.t + seconds, kind, a)

    def _trainer_stop(self):
        self.trainer_busy += self.t - self.trainer_busy_since
        self.trainer_busy_since = None

    def _publish(self):
        self._pause_all()
        self._trainer_start(self.c.sync_s, _EV_PUBLISH_DONE)

    def _train_batch(self, groups: list[int]):
        for g in groups:
            self.staleness.append(self.version - self.head[g])
        tokens = sum(self.group_tokens[g] for g in groups)
        self._trainer_start(self.c.train_s(tokens), _EV_TRAIN_DONE)

    def _step_done(self):
        self.step_end.append(self.t)
        if len(self.step_end) == self.s.warmup:
            self._snapshot()

    def _snapshot(self):
        self._snap = (self.t, sum(w.busy for w in self.workers), sum(w.kint for w in self.workers), self.trainer_busy)

    # -- modes

    def _group_finished(self, g: int):
        m = self.s.mode
        if m == "async":
            heapq.heappush(self.pool, g)
            self._async_try_train()
            return
        self.generated += 1
        if self.generated == self.s.groups:
            self.gen_phase.append(self.t - self.batch_start)
        if m == "sync":
            if self.generated == self.s.groups:
                self._train_batch(list(range(self.batch_lo, self.batch_lo + self.s.groups)))
        else:
            self.stream.append(g)
            self._periodic_next()

    def _start_batch(self):
        B = self.s.groups
        self.batch_lo = len(self.step_end) * B
        self.batch_start = self.t
        self.generated = 0  # groups of this batch generated
        self.trained = 0  # periodic: groups of this batch through forward/backward
        self.stream = deque()
        for g in range(self.batch_lo, self.batch_lo + B):
            self._submit(g)

    def _periodic_next(self):
        if self.trainer_busy_since is not None:
            return
        if self.stream:
            g = self.stream.popleft()
            self.staleness.append(self.version - self.head[g])
            self._trainer_start(self.c.train_c1 * self.group_tokens[g], _EV_GROUP_TRAINED)
        elif self.trained == self.s.groups:
            self._trainer_start(self.c.train_c0, _EV_TRAIN_DONE)

    def _async_fill(self):
        B = self.s.groups
        limit = min((self.s.eta + self.version + 1) * B, len(self.left))
        while self.submitted < limit:
            self._submit(self.submitted)
            self.submitted += 1

    def _async_try_train(self):
        B = self.s.groups
        if self.trainer_busy_since is not None or len(self.step_end) + self.in_training >= self.s.steps:
            return
        if self.s.take == "submitted":
            lo = self.consumed
            if lo + B > self.submitted or not all(self.done[lo : lo + B]):
                return
            batch = list(range(lo, lo + B))
            self.consumed += B
            taken = set(batch)
            self.pool = [g for g in self.pool if g not in taken]
            heapq.heapify(self.pool)
        else:
            if len(self.pool) < B:
                return
            batch = [heapq.heappop(self.pool) for _ in range(B)]
        self.in_training = 1
        self._train_batch(batch)

    def run(self) -> dict:
        m = self.s.mode
        if m == "async":
            self.submitted, self.consumed, self.pool, self.in_training = 0, 0, [], 0
            self._async_fill()
        else:
            self._start_batch()
        while len(self.step_end) < self.s.steps:
            if not self.heap:
                raise RuntimeError("simulation stalled (no events left): a bug, not an input problem")
            t, _, kind, a, b = heapq.heappop(self.heap)
            self.t = t
            if kind == _EV_WORKER:
                self._on_worker(a, b)
            elif kind == _EV_GROUP_TRAINED:
                self._trainer_stop()
                self.trained += 1
                if self.s.colocated:
                    self._resume_all()
                self._periodic_next()
            elif kind == _EV_TRAIN_DONE:
                self._trainer_stop()
                self._publish()
            elif kind == _EV_PUBLISH_DONE:
                self._trainer_stop()
                self.version += 1
                self._step_done()
                self._resume_all()
                if len(self.step_end) >= self.s.steps:
                    break
                if m == "async":
                    self.in_training = 0
                    self._async_fill()
                    self._async_try_train()
                else:
                    self._start_batch()
        return self.summary()

    def summary(self) -> dict:
        s = self.s
        t0, busy0, kint0, tr0 = self._snap if s.warmup else (0.0, 0.0, 0.0, 0.0)
        t1 = self.step_end[-1]
        window = t1 - t0
        n = s.steps - s.warmup
        busy = sum(w.busy for w in self.workers) - busy0
        kint = sum(w.kint for w in self.workers) - kint0
        stale = Counter(self.staleness[s.warmup * s.groups :])
        out = {
            "mode": s.mode,
            "eta": s.eta if s.mode == "async" else None,
            "workers": s.workers,
            "step_s": window / n,
            "generator_idle_pct": 100.0 * (1 - busy / (s.workers * window)) if window > 0 else 0.0,
            "slot_occupancy_pct": 100.0 * kint / (s.workers * s.max_concurrent * window) if window > 0 else 0.0,
            "trainer_idle_pct": 100.0 * (1 - (self.trainer_busy - tr0) / window) if window > 0 else 0.0,
            "staleness_hist": {int(k): v for k, v in sorted(stale.items())},
            "max_staleness": max(stale) if stale else 0,
        }
        if self.gen_phase:
            out["generation_phase_s"] = float(np.mean(self.gen_phase[s.warmup :] or self.gen_phase))
        return out


def simulate(setup: Setup, costs: Costs, lengths, seed: int = 0) -> dict:
    """Simulate ``setup`` (see the module docstring for the model); returns ``step_s`` (mean seconds
    per step in steady state), ``generator_idle_pct``, ``slot_occupancy_pct``, ``trainer_idle_pct``,
    ``staleness_hist`` ({staleness: groups}) and ``max_staleness``. Deterministic in ``seed``."""
    return Simulation(setup, costs, lengths, seed).run()


# ---------------------------------------------------------------- measured inputs


def fit_decode_shape(gen_throughput: dict, model: str) -> tuple[float, float]:
    """Least-squares ``(a, b)`` of per-iteration seconds ``a + b * batch`` from the rows of
    ``benchmarks/results/gen_throughput.json`` for ``model`` (seconds per call / new tokens)."""
    for m in gen_throughput.get("models", []):
        if m["model"] == model:
            k = np.array([b["batch"] for b in m["batches"]], dtype=float)
            y = np.array([b["seconds_median"] / m["new_tokens"] for b in m["batches"]])
            b, a = np.polyfit(k, y, 1)
            return float(a), float(max(b, 0.0))
    raise ValueError(
        f"model {model!r} is not in gen_throughput.json (have {[m['model'] for m in gen_throughput.get('models', [])]})"
    )


def fit_line(x, y) -> tuple[float, float]:
    """``(c0, c1)`` of ``y = c0 + c1 x``, both kept >= 0. When x varies by less than 25% of its
    median (a run whose steps train about the same number of tokens), the slope cannot be told
    from noise: ``c1 = median(y) / median(x)``, ``c0 = 0``. Otherwise least squares, falling back to
    the same ratio if a coefficient comes out negative. Medians, because step times on a shared
    machine have a long upper tail."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    mx = float(np.median(x)) if len(x) else 0.0
    if mx <= 0:
        return float(np.median(y)) if len(y) else 0.0, 0.0
    if np.ptp(x) >= 0.25 * mx:
        c1, c0 = np.polyfit(x, y, 1)
        if c0 >= 0 and c1 >= 0:
            return float(c0), float(c1)
    return 0.0, float(np.median(y)) / mx


def _model_alias(name: str) -> str:
    return {"tiny": "tiny-s"}.get(name, name)


def run_schedule(cfg: dict) -> dict:
    """Mode, eta and pool of a run from its resolved config, read defensively: ``distributed.workers``
    (0 = the local pool); ``train.async`` with ``max_staleness`` and ``periodic`` (``enabled``:
    ``false`` forces synchronous); absent keys mean synchronous."""
    train = cfg.get("train", {}) or {}
    a = train.get("async_", train.get("async", {})) or {}
    if not isinstance(a, dict):
        a = {}
    eta = int(a.get("max_staleness", a.get("eta", 0)) or 0)
    mode = "periodic" if a.get("periodic") else str(a.get("mode", "") or "").lower()
    enabled = a.get("enabled", True)
    enabled = True if enabled is None else enabled
    if mode == "periodic" and enabled:
        mode = "periodic"
    elif enabled and (mode in ("async", "areal") or (mode in ("", "on") and eta > 0)):
        mode = "async"
    else:
        mode, eta = "sync", 0
    ctrl, samp = cfg.get("control", {}), cfg.get("sampling", {})
    return {
        "mode": mode,
        "eta": eta,
        "workers": int(cfg.get("distributed", {}).get("workers", 0) or 0),
        "groups": int(ctrl.get("prompts_per_step", 32)),
        "group_size": int(ctrl.get("rollouts_per_prompt", 8)),
        "max_new_tokens": int(samp.get("max_new_tokens", 8)),
        "model": cfg.get("model", {}).get("name", "tiny"),
    }


def read_run(run_dir, quiet_frac: float = 1.0) -> dict:
    """Per-step measurements of a rollwise run directory (the first step, which carries start-up,
    is dropped): seconds between steps with evaluation time removed (``dwall``), the ledger's stage
    seconds, and per-step generated / trained tokens and rollouts (differences of the cumulative
    ``cost/*``); plus ``run_schedule`` of its config. ``quiet_frac < 1`` keeps only that fraction
    of the steps, the fastest (by ``dwall``): on a machine shared with other jobs the slow steps
    measure the other jobs (timeit's reasoning for taking the minimum)."""
    import tomllib

    from rollwise.ledger import read_jsonl

    d = Path(run_dir)
    if not (d / "metrics.jsonl").exists() or not (d / "config.resolved.toml").exists():
        raise SystemExit(f"{d}: not a rollwise run directory (needs metrics.jsonl and config.resolved.toml)")
    cfg = tomllib.loads((d / "config.resolved.toml").read_text())
    lines = read_jsonl(d / "metrics.jsonl")
    # an evaluation after step s-1 is recorded with step s (the loop counts the step first)
    eval_s = {int(e["step"]): float(e.get("time/eval_s", 0.0)) for e in read_jsonl(d / "eval.jsonl")}
    if len(lines) < 3:
        raise SystemExit(f"{d}: needs at least 3 recorded steps, has {len(lines)}")
    rows, prev = [], None
    for ln in lines:
        if prev is not None:
            rows.append(
                {
                    "dwall": ln["wall_s"] - prev["wall_s"] - eval_s.get(int(ln["step"]), 0.0),
                    "generate_s": float(ln.get("time/generate_s", 0.0)),
                    "train_s": float(ln.get("time/train_s", 0.0)),
                    "sync_s": float(ln.get("time/weight_sync_s", 0.0)),
                    "tokens": ln["cost/generated_tokens"] - prev["cost/generated_tokens"],
                    "trained": ln["cost/trained_tokens"] - prev["cost/trained_tokens"],
                    "rollouts": ln["cost/rollouts"] - prev["cost/rollouts"],
                }
            )
        prev = ln
    if not 0 < quiet_frac <= 1:
        raise SystemExit(f"--quiet-frac must be in (0, 1], not {quiet_frac}")
    if quiet_frac < 1:
        rows = sorted(rows, key=lambda r: r["dwall"])[: max(2, math.ceil(quiet_frac * len(rows)))]
    med = {k: float(np.median([r[k] for r in rows])) for k in rows[0]}
    mean_len = float(np.median([r["tokens"] / r["rollouts"] for r in rows if r["rollouts"]]))
    return {
        "dir": str(d),
        **run_schedule(cfg),
        "steps_used": len(rows),
        "quiet_frac": quiet_frac,
        "median": med,
        "mean_length": mean_len,
        "rows": rows,
    }


def run_setup(
    run: dict,
    *,
    steps: int = 30,
    warmup: int = 5,
    mode: str | None = None,
    eta: int | None = None,
    colocated: bool = True,
) -> Setup:
    """The simulated counterpart of a run: the local pool is one worker decoding the whole plan in
    one static batch; a Ray worker generates one group per backend call (static, G sequences)."""
    w = run["workers"]
    B, G = run["groups"], run["group_size"]
    return Setup(
        mode=mode or run["mode"],
        eta=run["eta"] if eta is None else eta,
        workers=max(w, 1),
        groups=B,
        group_size=G,
        max_concurrent=B * G if w == 0 else G,
        batching="static",
        colocated=colocated,
        steps=steps,
        warmup=warmup,
    )


def calibrate(run: dict, sigma: float, gen_throughput: dict, seed: int = 0) -> tuple[Costs, LogNormal, dict]:
    """Costs and lengths of a measured (synchronous) run; see the module docstring."""
    lengths = lognormal_with_mean(run["mean_length"], sigma, run["max_new_tokens"])
    a0, b0 = fit_decode_shape(gen_throughput, _model_alias(run["model"]))
    rows = run["rows"]
    c0, c1 = fit_line([r["trained"] for r in rows], [r["train_s"] for r in rows])
    # what the stage medians leave of the median step (the loop's other work, and the skew of a
    # shared machine's step times), so that the run's own configuration reproduces its median step
    med = run["median"]
    other = max(0.0, med["dwall"] - med["generate_s"] - med["train_s"] - med["sync_s"])
    # the same setup (steps, warm-up, seed) as run_setup's default, so the run's own generation is reproduced exactly
    probe = simulate(run_setup(run, mode="sync", eta=0), Costs(a0, b0, 0.0, 0.0, 0.0), lengths, seed)
    scale = run["median"]["generate_s"] / probe["generation_phase_s"]
    costs = Costs(a0 * scale, b0 * scale, c0 + other, c1, run["median"]["sync_s"])
    notes = {
        "decode_shape_from": f"gen_throughput.json model {_model_alias(run['model'])}: a={a0:.3g} s, b={b0:.3g} s",
        "decode_scale": round(scale, 4),
        "train_fit": {"c0": c0, "c1": c1},
        "other_s_added_to_c0": round(other, 4),
        "mean_length": round(run["mean_length"], 3),
        "lengths": lengths.describe(),
    }
    return costs, lengths, notes


def load_gen_throughput() -> dict:
    try:
        return json.loads((benchinfo.RESULTS / "gen_throughput.json").read_text())
    except OSError:
        raise SystemExit(
            "benchmarks/results/gen_throughput.json is missing: run benchmarks/gen_throughput.py or pass the costs as "
            "flags"
        ) from None


# ---------------------------------------------------------------- published-figure scenarios

# Response lengths of math RLVR (docs/regime.md 2.1-2.2, RollPacker arXiv 2509.21009 Fig. 2a):
# median 661 tokens; a single log-normal through p50 and p90 gives p99/p50 ~ 12; 16k cap.
PAPER_LENGTHS = {"median": 661, "p99": 661 * 12, "cap": 16384}

# Published end-to-end comparisons, each sync colocated vs async on the same devices, and the
# costs the simulator is given for them. Costs are stated as shares of the synchronous step.
_VERL_ROW = {"gen": 177.85, "old_log_prob": 53.92, "update_actor": 113.81, "step": 356.30}  # colocate sync, 128 GPUs
_VERL_ASYNC_UPDATE = 113.16  # fully async 64:64, update_actor
_VERL_SHARES = (
    _VERL_ROW["gen"] / _VERL_ROW["step"],
    (_VERL_ROW["old_log_prob"] + _VERL_ROW["update_actor"]) / _VERL_ROW["step"],
    1 - (_VERL_ROW["gen"] + _VERL_ROW["old_log_prob"] + _VERL_ROW["update_actor"]) / _VERL_ROW["step"],
)
AREAL_CITE = (
    "AReaL (Fu et al., arXiv 2505.24298) Table 1: up to 2.77x end-to-end at a fixed number of PPO steps, "
    "sync vs async on the same GPUs (1.5B math: 41.0 h -> 14.8 h), H800, 16-48 nodes"
)
VERL_CITE = (
    "verl recipe/fully_async_policy README (Meituan): Qwen2.5-Math-7B, DAPO, 28k max response, 128 H20, "
    "colocate sync vs fully async 64:64 (staleness 0.5, partial rollout): 400 steps 1d16h48m -> 17h22m = 2.35x"
)
SCENARIOS = {
    "areal": {
        "published_speedup": 2.77,
        "cite": AREAL_CITE,
        "gen_train_devices": (3, 1),  # AReaL: inference:training devices 3:1
        "sync_shares": (0.72, 0.23, 0.05),
        "share_source": "RollPacker Table 1 (math, Qwen2.5-14B, veRL): rollout 72%, training 23%, the rest 5% "
        "(counted as weight sync)",
    },
    "areal_light_training": {
        "published_speedup": 2.77,
        "cite": AREAL_CITE,
        "gen_train_devices": (3, 1),
        "sync_shares": (0.87, 0.08, 0.05),
        "share_source": "[I] hypothetical: the largest training share at which a 3:1 split can reach 2.77x "
        "(trainer-bound: 4 * train + rest <= 1/2.77 of the sync step -> train <= 7.8%)",
    },
    "verl_fully_async": {
        "published_speedup": 2.35,
        "cite": VERL_CITE,
        "gen_train_devices": (1, 1),
        "sync_shares": _VERL_SHARES,
        "share_source": "verl README, colocate sync on 128 GPUs: gen 177.85 s, old_log_prob 53.92 + update_actor "
        "113.81 s, rest 10.72 s of a 356.30 s step; the async trainer on half the devices, perfect scaling",
    },
    "verl_fully_async_measured_trainer": {
        "published_speedup": 2.35,
        "cite": VERL_CITE,
        "gen_train_devices": (1, 1),
        "sync_shares": _VERL_SHARES,
        "async_train_share": _VERL_ASYNC_UPDATE / _VERL_ROW["step"],
        "share_source": "as verl_fully_async, but the async trainer costs what verl measured for it: update_actor "
        "113.16 s on its 64 GPUs and no old_log_prob recompute (rollout log-probs are used)",
    },
}
BATCH = {"groups": 512, "group_size": 16}  # AReaL's paper setup and verl's recipe: 512 prompts x 16 responses
# [I] GPU decode: one iteration costs twice as much at 128 concurrent sequences as at one (memory-bound
# weights read plus KV reads and compute growing with the batch); 256 sequences per engine.
GPU_DECODE = {"b_over_a": 1 / 128, "max_concurrent": 256}


def scenario_costs(sc: dict, devices: int, lengths, seed: int) -> tuple[Costs, Costs, dict]:
    """Costs in units of one decode iteration at batch 1 (``decode_a = 1``) for the synchronous run
    on all ``devices`` (colocated, every device a generation worker) and for the asynchronous one on
    the scenario's split. The synchronous generation phase is simulated once; training and weight
    sync are then set so the synchronous step splits as ``sync_shares``. Training is charged per
    token (c0 = 0). The async trainer has ``devices * t / (g + t)`` devices and is slower in
    proportion (perfect data-parallel scaling), unless the scenario gives its measured share."""
    gen_share, train_share, rest_share = sc["sync_shares"]
    probe = simulate(
        Setup(
            mode="sync",
            workers=devices,
            max_concurrent=GPU_DECODE["max_concurrent"],
            steps=6,
            warmup=0,
            colocated=True,
            **BATCH,
        ),
        Costs(1.0, GPU_DECODE["b_over_a"], 0.0, 0.0, 0.0),
        lengths,
        seed,
    )
    gen = probe["generation_phase_s"]
    sync_step = gen / gen_share
    tokens = BATCH["groups"] * BATCH["group_size"] * _mean_length(lengths, seed)
    sync = Costs(1.0, GPU_DECODE["b_over_a"], 0.0, sync_step * train_share / tokens, sync_step * rest_share)
    g, t = sc["gen_train_devices"]
    train_dev = devices * t / (g + t)
    c1 = (
        sync_step * sc["async_train_share"] / tokens
        if "async_train_share" in sc
        else sync.train_c1 * devices / train_dev
    )
    return (
        sync,
        replace(sync, train_c1=c1),
        {"sync_generation_phase_units": round(gen, 1), "mean_tokens_per_step": round(tokens)},
    )


def _mean_length(lengths, seed: int) -> float:
    return float(np.mean(lengths.draw(np.random.default_rng(seed + 1), 200_000)))


def compare_published(devices_list=(8, 64), etas=(1, 2, 4), steps: int = 24, warmup: int = 6, seed: int = 0) -> dict:
    """For each scenario and device count D: sync colocated on D devices against async (eta) and
    periodic on the scenario's split of the same D devices; plus the generator-bound ceiling (async
    eta = 4 with training free)."""
    lengths = LogNormal.from_quantile(PAPER_LENGTHS["median"], PAPER_LENGTHS["p99"], Z99, PAPER_LENGTHS["cap"])
    out = {
        "lengths": {
            **lengths.describe(),
            "source": "notes/regime.md 2.1-2.2 (RollPacker Fig. 2a, math): p50 661, p99/p50 ~ 12, cap 16k",
        },
        "gpu_decode": GPU_DECODE,
        "batch": BATCH,
        "steps": steps,
        "warmup": warmup,
        "scenarios": {},
    }
    for name, sc in SCENARIOS.items():
        rows = []
        for D in devices_list:
            sync_costs, split, probe = scenario_costs(sc, D, lengths, seed)
            g, t = sc["gen_train_devices"]
            gen_w = max(1, round(D * g / (g + t)))
            base = dict(max_concurrent=GPU_DECODE["max_concurrent"], steps=steps, warmup=warmup, **BATCH)
            sync = simulate(Setup(mode="sync", workers=D, colocated=True, **base), sync_costs, lengths, seed)
            row = {
                "devices": D,
                "async_generation_workers": gen_w,
                "async_trainer_devices": D - gen_w,
                "costs_units_sync": asdict(sync_costs),
                "costs_units_async": asdict(split),
                **probe,
                "sync_colocated": _brief(sync),
            }
            for eta in etas:
                r = simulate(Setup(mode="async", eta=eta, workers=gen_w, **base), split, lengths, seed)
                row[f"async_eta{eta}"] = {**_brief(r), "speedup_vs_sync": round(sync["step_s"] / r["step_s"], 3)}
            r = simulate(Setup(mode="periodic", workers=gen_w, **base), split, lengths, seed)
            row["periodic"] = {**_brief(r), "speedup_vs_sync": round(sync["step_s"] / r["step_s"], 3)}
            free = simulate(
                Setup(mode="async", eta=max(etas), workers=gen_w, **base), replace(split, train_c1=0.0), lengths, seed
            )
            row["ceiling_training_free"] = {
                "step_s": round(free["step_s"], 3),
                "speedup_vs_sync": round(sync["step_s"] / free["step_s"], 3),
            }
            rows.append(row)
        out["scenarios"][name] = {**sc, "rows": rows}
    return out


def _brief(r: dict) -> dict:
    keep = ("step_s", "generator_idle_pct", "slot_occupancy_pct", "trainer_idle_pct", "max_staleness", "staleness_hist")
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if k in keep}


# ---------------------------------------------------------------- sweep and validation


# Default costs: this machine (2-core AMD EPYC, AVX2, quiet), the embedded default (tiny-s, 32 x 8
# rollouts, 8-token budget, 3.2 generated tokens per rollout in its runs), from two committed
# measurements: benchmarks/results/scale_out.json (local pool, medians of steps 2-15: generation
# 0.048 s, training 0.123 s, verification 0.003 s; Ray 2 workers: weight sync 0.020 s) and
# gen_throughput.json (the tiny-s decode shape). machine_costs() recomputes them from those files.
EMBEDDED = {"groups": 32, "group_size": 8, "mean_length": 3.2, "cap": 8}
FALLBACK_COSTS = Costs(decode_a=1.7e-3, decode_b=3.6e-5, train_c0=0.003, train_c1=0.123 / (32 * 8 * 3.2), sync_s=0.020)


def machine_costs(seed: int = 0) -> tuple[Costs, dict]:
    """Costs of the embedded default on this machine (see the comment above): the decode shape of
    tiny-s scaled so that the local pool (one worker, the whole plan in one static batch) spends
    the measured generation seconds; training per token; verification added to c0."""
    try:
        so = json.loads((benchinfo.RESULTS / "scale_out.json").read_text())["ray_vs_local"]
        a0, b0 = fit_decode_shape(json.loads((benchinfo.RESULTS / "gen_throughput.json").read_text()), "tiny-s")
    except (OSError, KeyError, ValueError):
        return FALLBACK_COSTS, {"source": "fallback constants (scale_out.json or gen_throughput.json missing)"}
    local = so["local"]["median_later_steps"]
    B, G = EMBEDDED["groups"], EMBEDDED["group_size"]
    lengths = lognormal_with_mean(EMBEDDED["mean_length"], rollwise_lengths().sigma, EMBEDDED["cap"])
    probe = simulate(
        Setup(
            mode="sync", workers=1, groups=B, group_size=G, max_concurrent=B * G, batching="static", steps=20, warmup=0
        ),
        Costs(a0, b0, 0.0, 0.0, 0.0),
        lengths,
        seed,
    )
    scale = local["generate_s"] / probe["generation_phase_s"]
    costs = Costs(
        a0 * scale,
        b0 * scale,
        local["verify_s"],
        local["train_s"] / (B * G * EMBEDDED["mean_length"]),
        so["ray_2_workers"]["median_later_steps"]["weight_sync_s"],
    )
    return costs, {
        "source": "scale_out.json (local pool medians; Ray weight sync) + gen_throughput.json (tiny-s decode shape)",
        "decode_scale": round(scale, 4),
        "embedded_default": EMBEDDED,
    }


def validate_committed(seed: int = 0) -> dict:
    """Predicted against measured generation and step seconds for the two arms of
    ``scale_out.json`` that the calibration (machine_costs: the local pool's one batched call) did
    not see: one worker generating request by request (``local_request_seeds``, what one Ray worker
    does) and 2 Ray workers. Both synchronous, 15 steps on a quiet machine. Each arm's weight-sync
    seconds are its own measured ones (an input of the model, not a prediction)."""
    costs, _ = machine_costs(seed)
    lengths = lognormal_with_mean(EMBEDDED["mean_length"], rollwise_lengths().sigma, EMBEDDED["cap"])
    so = json.loads((benchinfo.RESULTS / "scale_out.json").read_text())["ray_vs_local"]
    out = []
    for arm, workers in (("local", 0), ("local_request_seeds", 1), ("ray_2_workers", 2)):
        m = so[arm]["median_later_steps"]
        B, G = EMBEDDED["groups"], EMBEDDED["group_size"]
        st = Setup(
            mode="sync",
            workers=max(workers, 1),
            groups=B,
            group_size=G,
            max_concurrent=B * G if workers == 0 else G,
            batching="static",
            steps=20,
            warmup=2,
        )
        # weight sync is an input (measured, constant): the arm's own (0 for the local pool)
        p = simulate(st, replace(costs, sync_s=m["weight_sync_s"]), lengths, seed)
        out.append(
            {
                "arm": arm,
                "workers": workers,
                "calibrated_on": arm == "local",
                "measured_generate_s": m["generate_s"],
                "predicted_generate_s": round(p["generation_phase_s"], 4),
                "generate_error_pct": round(100 * (p["generation_phase_s"] / m["generate_s"] - 1), 1),
                "measured_step_s": m["step_s"],
                "predicted_step_s": round(p["step_s"], 4),
                "step_error_pct": round(100 * (p["step_s"] / m["step_s"] - 1), 1),
            }
        )
    return {
        "source": "benchmarks/results/scale_out.json (ray_vs_local; medians of steps 2-15; measured step = sum of "
        "stage medians)",
        "rows": out,
    }


def sweep(costs: Costs, lengths, workers, etas, base: Setup, seed: int) -> list[dict]:
    rows = []
    for w in workers:
        sync = simulate(replace(base, mode="sync", workers=w, eta=0), costs, lengths, seed)
        row = {"workers": w, "sync": _brief(sync)}
        for eta in etas:
            r = simulate(replace(base, mode="async", workers=w, eta=eta), costs, lengths, seed)
            row[f"async_eta{eta}"] = {**_brief(r), "speedup_vs_sync": round(sync["step_s"] / r["step_s"], 3)}
        r = simulate(replace(base, mode="periodic", workers=w, eta=0), costs, lengths, seed)
        row["periodic"] = {**_brief(r), "speedup_vs_sync": round(sync["step_s"] / r["step_s"], 3)}
        rows.append(row)
    return rows


def validate(run_dirs, calibrate_dir, sigma: float, seed: int, quiet_frac: float = 1.0) -> dict:
    """Predicted against measured seconds per step for each run (see the module docstring)."""
    runs = [read_run(d, quiet_frac) for d in run_dirs]
    if calibrate_dir == "committed":
        costs, notes = machine_costs(seed)
        cal = {"dir": "committed (machine_costs: scale_out.json + gen_throughput.json)"}
    else:
        cal = (
            read_run(calibrate_dir, quiet_frac)
            if calibrate_dir
            else next((r for r in runs if r["mode"] == "sync"), None)
        )
        if cal is None:
            raise SystemExit(
                "--validate needs a synchronous run to take the costs from (give one, or --calibrate RUN_DIR)"
            )
        if cal["mode"] != "sync":
            raise SystemExit(f"--calibrate {cal['dir']}: the calibration run must be synchronous (it is {cal['mode']})")
        costs, _, notes = calibrate(cal, sigma, load_gen_throughput(), seed)
    out = {
        "calibration_run": cal["dir"],
        "quiet_frac": quiet_frac,
        "costs": asdict(costs),
        "calibration": notes,
        "runs": [],
    }
    for r in runs:
        lengths = lognormal_with_mean(r["mean_length"], sigma, r["max_new_tokens"])
        entry = {
            "dir": r["dir"],
            "mode": r["mode"],
            "eta": r["eta"],
            "workers": r["workers"],
            "groups": r["groups"],
            "group_size": r["group_size"],
            "steps_used": r["steps_used"],
            "measured_step_s": round(r["median"]["dwall"], 4),
            "measured_generate_s": round(r["median"]["generate_s"], 4),
            "measured_train_s": round(r["median"]["train_s"], 4),
        }
        for coloc in (True, False) if r["mode"] != "sync" else (True,):
            p = simulate(run_setup(r, colocated=coloc), costs, lengths, seed)
            key = "predicted" if coloc else "predicted_dedicated_trainer"
            entry[f"{key}_step_s"] = round(p["step_s"], 4)
            entry[f"{key}_error_pct"] = round(100 * (p["step_s"] / r["median"]["dwall"] - 1), 1)
            if "generation_phase_s" in p:
                entry[f"{key}_generate_s"] = round(p["generation_phase_s"], 4)
        out["runs"].append(entry)
    return out


def machine_info() -> dict:
    """benchinfo.machine() (CPU, cores, versions) when torch is importable; the CPU lines alone otherwise."""
    try:
        return benchinfo.machine()
    except ImportError:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
        import os

        return {
            "cpu": benchinfo.cpu_model(cpuinfo),
            "cpu_features": benchinfo.cpu_features(cpuinfo),
            "cores": os.cpu_count(),
        }


def git_info() -> dict | None:
    try:
        return benchinfo.git()
    except ImportError:  # rollwise not importable: the simulation itself does not need it
        return None


def pick_lengths(args) -> object:
    kind = args.lengths or "rollwise"
    if kind == "rollwise":
        return rollwise_lengths()
    if kind == "lognormal":
        return LogNormal.from_quantile(args.median, args.p99, Z99, args.cap)
    if kind == "constant":
        return constant(int(args.median))
    if kind.startswith("jsonl:"):
        return read_lengths(kind.split(":", 1)[1])
    raise SystemExit(f"--lengths must be rollwise, lognormal, constant or jsonl:PATH, not {kind!r}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--eta", type=int, nargs="+", default=[1, 2, 4], help="async staleness bounds to simulate")
    p.add_argument("--groups", type=int, default=32, help="B: groups per step")
    p.add_argument("--group-size", type=int, default=8, help="G: rollouts per group")
    p.add_argument("--max-concurrent", type=int, default=64, help="sequences a worker holds at once")
    p.add_argument("--batching", choices=["continuous", "static"], default="continuous")
    p.add_argument("--colocated", action="store_true", help="trainer shares the generators' devices")
    p.add_argument("--take", choices=["finished", "submitted"], default="finished")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    for name, what in (
        ("decode-a", "s per decode iteration, fixed part"),
        ("decode-b", "s per decode iteration per held sequence"),
        ("train-c0", "s per optimizer step, fixed part"),
        ("train-c1", "s per trained token"),
        ("sync-s", "s per weight publish"),
    ):
        p.add_argument(
            f"--{name}", type=float, default=None, help=f"{what} (default: machine_costs(), or from --from-run)"
        )
    p.add_argument("--from-run", default=None, help="a rollwise run directory: costs, B, G and lengths from its ledger")
    p.add_argument(
        "--lengths",
        default=None,
        help="rollwise (default) | lognormal | constant | jsonl:PATH; with --from-run, "
        "default: the run's mean length on rollwise's log-normal shape",
    )
    p.add_argument("--median", type=float, default=661.0, help="lognormal / constant: median length")
    p.add_argument("--p99", type=float, default=661.0 * 12, help="lognormal: 99th percentile")
    p.add_argument("--cap", type=int, default=16384, help="lognormal: length cap")
    p.add_argument(
        "--sigma",
        type=float,
        default=None,
        help="--from-run / --validate: log-normal spread of the run's lengths "
        "(default: that of rollwise's measured lengths)",
    )
    p.add_argument("--validate", nargs="+", default=None, metavar="RUN_DIR")
    p.add_argument(
        "--calibrate",
        default=None,
        metavar="RUN_DIR",
        help="--validate: the sync run to take costs from, or 'committed' for machine_costs() (default: the first "
        "sync run given)",
    )
    p.add_argument(
        "--quiet-frac",
        type=float,
        default=1.0,
        help="--from-run / --validate: use only this fraction of each "
        "run's steps, the fastest (a shared machine's slow steps measure the other jobs)",
    )
    p.add_argument("--no-comparison", action="store_true", help="skip the published-figure scenarios")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    sigma = args.sigma if args.sigma is not None else rollwise_lengths().sigma
    result = {
        "benchmark": "simulate_async",
        "created": benchinfo.stamp(),
        "git": git_info(),
        "machine": machine_info(),
        "command": "python benchmarks/simulate_async.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "assumptions": __doc__.split("Model and assumptions (state them with any figure this produces):")[1]
        .split("\nInputs:")[0]
        .strip(),
    }
    if args.validate:
        result["validation"] = validate(args.validate, args.calibrate, sigma, args.seed, args.quiet_frac)
        out = Path(args.out or benchinfo.RESULTS / "simulate_async_validation.json")
        out.write_text(json.dumps(result, indent=1) + "\n")
        for r in result["validation"]["runs"]:
            print(
                f"{r['dir']}: {r['mode']} eta={r['eta']} workers={r['workers']}: measured {r['measured_step_s']:.3f} "
                f"s/step, predicted {r['predicted_step_s']:.3f} ({r['predicted_error_pct']:+.1f}%)"
                + (
                    f", dedicated trainer {r['predicted_dedicated_trainer_step_s']:.3f}"
                    if "predicted_dedicated_trainer_step_s" in r
                    else ""
                )
            )
        print(f"-> {out}")
        return
    base = Setup(
        groups=args.groups,
        group_size=args.group_size,
        max_concurrent=args.max_concurrent,
        batching=args.batching,
        colocated=args.colocated,
        take=args.take,
        steps=args.steps,
        warmup=args.warmup,
    )
    (costs, source), lengths = machine_costs(args.seed), pick_lengths(args)
    if args.from_run:
        run = read_run(args.from_run, args.quiet_frac)
        costs, run_lengths, notes = calibrate(run, sigma, load_gen_throughput(), args.seed)
        lengths = lengths if args.lengths else run_lengths
        base = replace(base, groups=run["groups"], group_size=run["group_size"])
        source = {"from_run": args.from_run, **notes}
    flags = {
        "decode_a": args.decode_a,
        "decode_b": args.decode_b,
        "train_c0": args.train_c0,
        "train_c1": args.train_c1,
        "sync_s": args.sync_s,
    }
    costs = replace(costs, **{k: v for k, v in flags.items() if v is not None})
    base.check()
    result["sweep"] = {
        "costs": asdict(costs),
        "costs_source": source,
        "lengths": lengths.describe(),
        "setup": asdict(base),
        "rows": sweep(costs, lengths, args.workers, args.eta, base, args.seed),
    }
    if not args.from_run and not any(v is not None for v in flags.values()):
        result["validation_committed"] = validate_committed(args.seed)
    if not args.no_comparison:
        result["comparison"] = compare_published(seed=args.seed)
    out = Path(args.out or benchinfo.RESULTS / "simulate_async.json")
    out.write_text(json.dumps(result, indent=1) + "\n")
    for r in result["sweep"]["rows"]:
        print(
            f"workers {r['workers']:3d}: sync {r['sync']['step_s']:.4g} s/step; "
            + "; ".join(
                f"{k} x{v['speedup_vs_sync']:.2f}"
                for k, v in r.items()
                if isinstance(v, dict) and "speedup_vs_sync" in v
            )
        )
    for r in result.get("validation_committed", {}).get("rows", []):
        print(
            f"{r['arm']}: generation measured {r['measured_generate_s']} s, predicted {r['predicted_generate_s']} s; "
            f"step measured {r['measured_step_s']} s, predicted {r['predicted_step_s']} s ({r['step_error_pct']:+.1f}%)"
        )
    for name, sc in result.get("comparison", {}).get("scenarios", {}).items():
        for r in sc["rows"]:
            print(
                f"{name} D={r['devices']}: "
                + "; ".join(
                    f"{k} x{v['speedup_vs_sync']:.2f}"
                    for k, v in r.items()
                    if isinstance(v, dict) and "speedup_vs_sync" in v
                )
                + f" (published {sc['published_speedup']}x)"
            )
    print(f"-> {out}")


if __name__ == "__main__":
    main()
