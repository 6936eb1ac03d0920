"""``async`` pool (``train.async``): rollouts generated ahead of the trainer, with a staleness bound.

Paper: Fu et al. 2025, "AReaL: A Large-Scale Asynchronous Reinforcement Learning System for
Language Reasoning", arXiv 2505.24298 (staleness-bounded submission, eq. 3; interruptible
generation; decoupled PPO, eq. 4-5); docs/specs/systems.md §2. As docs/architecture.md §8 has it, asynchrony
is a pool that runs ahead: the staleness bound η is enforced by admission, η = 0 is exactly
synchronous, and there is no second loop. The loop is unchanged: it still calls
``pool.generate(plan, groups, version)`` once per round.

How it works:

- **Plans ahead.** Plan ``k`` is the plan trained at step ``k``. At step ``k`` the pool holds
  plans ``k .. k + η`` (the loop's ``plan`` of this step is appended as plan ``k + η``; at the
  first step the pool draws ``η`` more from the controller through ``draw``, i.e. the
  controller's ``select``/``plan``, so prompts are taken in the controller's order). Controllers
  therefore choose plan ``k + η`` from statistics observed up to step ``k - 1``: the price of
  running ahead, as in AReaL, whose prompts never depend on the trainer. Plans from index
  ``train.steps`` on (the loop's plans of its last η steps) are kept but never generated: no
  step trains them (a resume that raises ``train.steps`` generates them then).
- **Generator.** One background thread (the *generator*) takes plans in order and generates them
  on the *engine*: a pool whose weights are its own (an in-process copy of the policy for the
  ``hf`` backend, the colocated vLLM engine, or Ray rollout workers). It starts plan ``k`` only
  when ``k <= i + η``, ``i`` being the newest published policy version (AReaL's submission gate
  ``floor((N_r - 1) / B) <= i + η`` with one plan per step as the unit B). Before each plan it
  loads the newest published weights. Every rollout is tagged with the version it was drawn from.
- **Admission.** The loop's ``generate`` returns plan ``k``'s groups once generated; each rollout
  is admitted only if its oldest token is at most ``η`` versions behind the trainer (with the gate
  this always holds; a violation is dropped and counted in ``async/stale_dropped``, never trained).
  ``η = 0``: plan ``k`` starts only after version ``k`` is published, so every token of a batch
  trained at version ``k`` is of version ``k``: the synchronous run, token for token
  (tests/invariants/test_async.py).
- **New weights mid-plan** (``on_new_weights``): ``finish`` (default) completes the plan with the
  weights it started with; ``interrupt`` (AReaL's interruptible generation) stops decoding as soon
  as new weights are published, loads them and continues every unfinished rollout from its token
  ids under the new weights (the prefix is re-encoded by the next call's prefill), so one rollout
  can hold tokens of several versions (``Rollout.token_versions`` shows the switch); ``discard``
  drops the unfinished rollouts' tokens (charged as generated) and restarts them under the new
  weights. ``interrupt``/``discard`` need an in-process engine that can stop between decode steps
  (``hf``); Ray workers and vLLM take ``finish`` (refused at config load otherwise).
- **APRIL** (``replay.name = "april"``, ``on_new_weights = "finish"``, the in-process ``hf``
  engine): APRIL's scheduler wraps the engine and the generator hands it each plan; it returns
  the first complete groups (buffered ones first) and keeps unfinished rollouts, with their
  per-token versions, for a later plan. A continued rollout whose oldest token is then more than
  η versions old is not admitted (``async/stale_dropped``). APRIL draws extra prompts from the
  controller in the generator thread, so the run's controller is then used under one lock
  (:class:`Locked`), and checkpoints wait for the generator's current plan (:meth:`paused`).
- **Top-up rounds** (DARS, XRPO, ...: ``generate`` with non-empty ``groups``) and evaluation are
  generated at once, ahead of queued plans, at the newest weights; evaluation is never charged.
- **Objective.** Stale data needs the behaviour/proximal split: use ``objective.name =
  "decoupled_ppo"`` or a behaviour weight (``objective.options.tis_level``), as AReaL does; the
  trainer recomputes the proximal log-probs (``Trainer``'s ``needs_prox``). η >= 1 with an
  objective that does not (``rollwise.compat.corrects_off_policy`` states the rule) is refused at config load
  unless ``train.async.allow_uncorrected = true``.
- **Controllers.** Plans ahead are drawn before the current step's ``next_round``/``observe``/
  ``after_update``: this pool declares ``Compat(plans_ahead=True)``, a controller that keeps per-plan
  state between them declares ``Compat(keeps_plan_state=True)``, and η >= 1 is refused with it
  (``rollwise.compat.check_plans_ahead``; rollwise/control/__init__.py lists the rule).

Costs and metrics (per step, in ``metrics.jsonl``): the cost of plan ``k`` is charged at step ``k``
(its tokens, rollouts, verifier calls, generation seconds); ``async/staleness_<d>`` counts the
step's trained rollouts whose oldest token is ``d`` versions behind, ``async/max_staleness`` the
largest ``d``, ``async/plan`` the index of the plan trained (always the step);
``async/interrupted`` rollouts that took new weights mid-generation,
``async/restarted`` (``discard``) and ``async/discarded_tokens``; ``time/trainer_wait_s`` the
seconds the loop waited for its plan, ``time/generator_idle_s`` the generator's seconds without
an admissible plan since the previous step, and ``util/trainer`` / ``util/generator`` the share
of the step's wall-clock (from one plan's return to the next) each was busy. ``timeline.jsonl`` in the run directory
holds one line per generation span (per Ray worker when the engine is Ray) and per trainer span (the loop's
time between two ``generate`` calls: training, evaluation, checkpoints); ``rollwise.eval.plots``
draws it.

Checkpoints (``state_dict``): the plans drawn and not yet trained, with the rollouts of those
already generated (accepted) and their costs; plans being generated at the checkpoint are
regenerated after a resume (their tokens were never accepted or charged). So a run killed and
resumed trains every drawn plan exactly once, loses no accepted rollout and charges none twice.

Differences from AReaL: one generator thread takes whole plans in order (AReaL streams single
trajectories to many servers and forms batches from the oldest finished ones); the gate counts
plans, not trajectories; with ``finish`` a plan never mixes versions. The A-3PO log-linear
proximal approximation is not implemented (the trainer recomputes the proximal policy).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rollwise.generate.common import StepCost, merge_groups
from rollwise.registry import Compat
from rollwise.types import Completion, Controller, Plan, Request

now = time.perf_counter


@dataclass
class Job:
    """One plan for the generator. ``index``: the step that trains it (None: a top-up round or
    an evaluation, generated at once)."""

    index: int | None
    plan: Plan
    sampling: object = None
    generator: object = None
    charge: bool = True
    pairs: list | None = None
    cost: StepCost | None = None
    error: BaseException | None = None
    done: bool = False
    running: bool = False
    chunks: list = field(default_factory=list)  # periodic: each generated chunk's pairs, in order
    consumed: int = 0  # periodic: chunks handed to the trainer


@dataclass
class _Slot:
    """An unfinished rollout of an interruptible plan: its ids, log-probs and versions so far."""

    req: Request
    pids: tuple
    ids: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    versions: list = field(default_factory=list)
    last: Completion | None = None  # the latest segment
    held: int = -1  # version of the latest segment
    segments: int = 0


class AsyncPool:
    """See the module docstring. ``engine``: the pool that generates (``rollouts``, ``take_cost``);
    ``receive(version, weights)`` loads published weights into it; ``backend``: the engine's
    in-process backend for ``interrupt``/``discard`` (None otherwise); ``draw()``: the
    controller's next plan."""

    def __init__(
        self,
        engine,
        receive: Callable,
        opts,
        draw: Callable[[], Plan],
        backend=None,
        timeline: Path | None = None,
        codec=None,
        sampling=None,
        consume: Callable | None = None,
        scheduler=None,
        steps: int | None = None,
    ):
        self.engine, self.receive, self.draw, self.backend = engine, receive, draw, backend
        self.steps = steps  # train.steps: plans from this index on are never trained, so never generated
        self.scheduler = scheduler  # APRIL's pool around the engine: takes each training plan (module docstring)
        self.eta, self.on_new_weights = opts.max_staleness, opts.on_new_weights
        self.consume = consume  # periodic asynchrony: the trainer takes each chunk's groups as it arrives
        self.chunks = opts.periodic_chunks if consume is not None else 1  # train.async.periodic_chunks
        self.codec = codec if codec is not None else getattr(engine, "codec", None)
        self.sampling = sampling if sampling is not None else getattr(engine, "sampling", None)
        self.timeline = timeline
        self.cond = threading.Condition()
        self.engine_lock = threading.Lock()
        self.jobs: dict[int, Job] = {}  # plans drawn and not yet trained, by index
        self.urgent: list[Job] = []  # top-ups and evaluations: before any plan
        self.next_index = 0  # the plan the next step trains
        self.drawn = 0  # plans drawn so far
        self.version = -1  # newest published version
        self.held = -1  # version the engine holds
        self.pending = None  # (version, weights) published, not yet loaded by the engine
        self.closed = False
        self.cost = StepCost()
        self._idle = 0.0  # generator seconds without an admissible plan, since the last step
        self._left = None  # when the loop last left generate() (the trainer's span starts)
        self._t0 = time.time()
        self._thread = None

    # ------------------------------------------------------------ weights
    def load_weights(self, version: int, weights: dict) -> float:
        """Publish weights (copied: the trainer's tensors change at its next step); the engine
        loads them before its next plan, or at once between decode steps with ``interrupt``."""
        t0 = now()
        copy = {k: v.detach().clone() for k, v in weights.items()}
        with self.cond:
            self.pending, self.version = (version, copy), version
            self.cond.notify_all()
        return now() - t0

    def _load_pending(self) -> bool:
        """Load the newest published weights into the engine (generator thread or evaluation,
        under ``engine_lock``); True if it loaded any."""
        with self.cond:
            pending, self.pending = self.pending, None
        if pending is None:
            return False
        self.receive(*pending)
        self.held = pending[0]
        return True

    # ------------------------------------------------------------ the loop's side
    def take_cost(self) -> StepCost:
        cost, self.cost = self.cost, StepCost()
        return cost

    def generate(self, plan: Plan, groups: list, version: int) -> list:
        arrived = now()
        if self._left is not None and not groups:  # the loop's time since its last plan: training, evaluation
            self._span("trainer", "train", self.next_index - 1, self._left, arrived)
        if groups:  # a later round of this step: now, at the newest weights
            job = self._submit_urgent(Job(None, plan))
        else:
            self._submit(plan)
            ahead = (
                self.next_index + self.eta if self.steps is None else min(self.next_index + self.eta, self.steps - 1)
            )
            while self.drawn <= ahead:  # keep plans k .. k + eta drawn (none past the last step)
                self._submit(self.draw())
            job = self.jobs[self.next_index]
        streamed = self._wait(job, self.consume if job.index is not None else None)
        if self.consume is not None:
            self.cost.count(**{"time/streamed_train_s": streamed})
        if job.index is not None:
            with self.cond:  # the generator reads jobs under the same lock
                del self.jobs[job.index]
                self.next_index += 1
            self.cost.metrics["async/plan"] = job.index  # = the step: no plan lost or trained twice
        self.cost.add(job.cost)
        pairs = self._admit(job.pairs, version)
        with self.cond:
            idle, self._idle = self._idle, 0.0
        prev, self._left = self._left, now()
        wait = self._left - arrived - streamed  # periodic: back-propagating arrived groups is work, not waiting
        self.cost.count(**{"time/trainer_wait_s": wait, "time/generator_idle_s": idle})
        if prev is not None and not groups:  # utilisation over the step (from the previous plan's return to this one's)
            wall = max(self._left - prev, 1e-9)
            self.cost.metrics.update({"util/trainer": 1 - wait / wall, "util/generator": max(0.0, 1 - idle / wall)})
        return merge_groups(groups, pairs)

    def rollouts(self, plan: Plan, version: int, sampling=None, generator=None, charge: bool = True):
        """Evaluation (``charge=False``) or a direct call: generated now at the newest weights."""
        job = self._submit_urgent(Job(None, plan, sampling, generator, charge))
        self._wait(job)
        if charge:
            self.cost.add(job.cost)
        return job.pairs

    def _admit(self, pairs, version: int) -> list:
        lags: Counter[int] = Counter()
        kept = []
        for prompt, r in pairs:
            lag = version - min(r.token_versions or (r.policy_version,))
            if lag > self.eta:
                self.cost.count(**{"async/stale_dropped": 1})
                continue
            lags[lag] += 1
            kept.append((prompt, r))
        self.cost.count(**{f"async/staleness_{d}": n for d, n in lags.items()})
        self.cost.metrics["async/max_staleness"] = max(
            self.cost.metrics.get("async/max_staleness", 0), max(lags, default=0)
        )
        return kept

    def _submit(self, plan: Plan) -> None:
        with self.cond:
            self.jobs[self.drawn] = Job(self.drawn, plan)
            self.drawn += 1
            self.cond.notify_all()
        self._start()

    def _submit_urgent(self, job: Job) -> Job:
        with self.cond:
            self.urgent.append(job)
            self.cond.notify_all()
        self._start()
        return job

    def _wait(self, job: Job, consume: Callable | None = None) -> float:
        """Wait for ``job``; with ``consume`` (periodic), hand it each chunk's groups as they arrive.
        Returns the seconds spent in ``consume``."""
        spent = 0.0
        while True:
            with self.cond:
                while not job.done and (consume is None or job.consumed >= len(job.chunks)):
                    self.cond.wait()
                new, job.consumed = job.chunks[job.consumed :], len(job.chunks)
                done = job.done
            if consume is not None and job.error is None:
                for pairs in new:
                    t0 = now()
                    consume(merge_groups([], pairs))
                    spent += now() - t0
                    self._span("trainer", "train", job.index, t0, now())  # back-propagated while the rest generates
            if done and not new:
                break
        if job.error is not None:
            raise job.error
        return spent

    # ------------------------------------------------------------ the generator thread
    def _start(self) -> None:
        if self._thread is None:
            import torch

            threads = torch.get_num_threads()  # run.threads: a new thread starts with the default count

            def generator():
                torch.set_num_threads(threads)
                self._generator()

            self._thread = threading.Thread(target=generator, name="rollwise-generator", daemon=True)
            self._thread.start()

    def _admissible(self) -> Job | None:
        if self.urgent:
            return self.urgent[0]
        for k in sorted(self.jobs):
            job = self.jobs[k]
            if (
                self.steps is not None and k >= self.steps
            ):  # the loop's plans of its last eta steps: no step trains them
                return None
            if job.pairs is None and not job.running:
                return job if k <= self.version + self.eta else None  # AReaL's gate, in plans
        return None

    def _generator(self) -> None:
        while True:
            with self.cond:
                t0 = now()
                while not self.closed and self._admissible() is None:
                    self.cond.wait()
                if self.closed:
                    return
                self._idle += now() - t0
                job = self._admissible()
                if job in self.urgent:
                    self.urgent.remove(job)
                job.running = True
            try:
                with self.engine_lock:
                    job.pairs, job.cost = self._run(job)
            except BaseException as e:  # raised in the loop's thread by _wait
                job.error = e
            with self.cond:
                job.done, job.running = True, False
                self.cond.notify_all()

    def _run(self, job: Job):
        self._load_pending()
        t0 = now()
        if job.charge and self.on_new_weights != "finish" and self.backend is not None:
            pairs = self._interruptible(job.plan)
            self._spans(job, t0)
        elif self.chunks > 1 and job.index is not None:  # periodic: chunk by chunk, each handed over when done
            reqs, pairs = job.plan.requests, []
            size = -(-len(reqs) // self.chunks)
            for start in range(0, len(reqs), size):
                t1 = now()
                out = self.engine.rollouts(Plan(reqs[start : start + size]), self.held)
                pairs += out
                self._spans(job, t1)
                with self.cond:
                    job.chunks.append(out)
                    self.cond.notify_all()
        elif self.scheduler is not None and job.index is not None:  # APRIL: buffered groups first, partials kept
            groups = self.scheduler.generate(job.plan, [], self.held)
            pairs = [(g.prompt, r) for g in groups for r in g.rollouts]
            self._spans(job, t0)
        else:
            pairs = self.engine.rollouts(job.plan, self.held, job.sampling, job.generator, job.charge)
            self._spans(job, t0)
        cost = self.engine.take_cost() if job.charge else StepCost()
        return pairs, cost

    def _spans(self, job: Job, t0: float) -> None:
        """Timeline spans of the engine call that started at ``t0``: one per Ray worker, else one."""
        spans = getattr(self.engine, "last_spans", None)
        for lane, a, b in spans or [("generator", t0, now())]:
            self._span(lane, "generate" if job.charge else "evaluate", job.index, a, b)

    def _interruptible(self, plan: Plan) -> list:
        """Generate ``plan`` on the in-process backend, taking new weights between decode steps
        (module docstring, ``on_new_weights``)."""
        sampling, pool = self.sampling, self.engine
        slots = []
        for req in plan.requests:
            pids = tuple(self.codec.encode_prompt(req.prompt))
            prefix = list(req.prefix or ())
            versions = list(req.prefix_versions or (self.held,) * len(prefix))
            slots += [
                _Slot(req, pids, list(prefix), list(req.prefix_logprobs or ()), list(versions)) for _ in range(req.n)
            ]
        todo, decoded, interrupted, restarted, discarded = list(slots), 0, set(), 0, 0
        t0 = now()
        while todo:
            self._load_pending()
            sofar = [tuple(s.ids) + (s.last.token_ids if s.last is not None else ()) for s in todo]
            comps = self.backend.generate(
                [s.pids + ids for s, ids in zip(todo, sofar)],
                sampling,
                None,
                max_new_tokens=[sampling.max_new_tokens - len(ids) for ids in sofar],
                stop_when=lambda done: self.pending is not None,
            )
            decoded += sum(len(c.token_ids) for c in comps)
            left = []
            for s, c in zip(todo, comps):
                if c.finish == "partial" and self.on_new_weights == "discard":
                    discarded += len(c.token_ids)
                    restarted += 1
                    left.append(s)
                    continue
                if s.last is not None:  # the previous segment becomes part of the prefix
                    s.ids += s.last.token_ids
                    s.logprobs += s.last.logprobs
                    s.versions += [s.held] * len(s.last.token_ids)
                s.last, s.held = c, self.held
                s.segments += 1
                if c.finish == "partial":
                    interrupted.add(id(s))
                    left.append(s)
            todo = left
        t1 = now()
        items, versions = [], []
        for s in slots:
            req = (
                s.req
                if s.segments == 1 and not s.req.prefix
                else Request(s.req.prompt, 1, tuple(s.ids), tuple(s.logprobs), tuple(s.versions))
            )
            items.append((req, s.pids, s.last))
            versions.append(s.held)
        done: list = [None] * len(items)
        for v in sorted(set(versions)):  # one call per final version: decoded and verified together
            idx = [i for i, x in enumerate(versions) if x == v]
            for i, r in zip(idx, pool.finish_rollouts([items[i] for i in idx], v)):
                done[i] = r
        t2 = now()
        pool.cost.charge(decoded, len(done), [r.verdict for r in done], t1 - t0, t2 - t1)
        pool.cost.count(
            **{"async/interrupted": len(interrupted), "async/restarted": restarted, "async/discarded_tokens": discarded}
        )
        return [(s.req.prompt, r) for s, r in zip(slots, done)]

    # ------------------------------------------------------------ timeline, state, shutdown
    def _span(self, lane: str, kind: str, step, a: float, b: float) -> None:
        if self.timeline is None:
            return
        base = now() - (time.time() - self._t0)  # perf_counter value at self._t0
        line = {"lane": lane, "kind": kind, "step": step, "start": round(a - base, 4), "end": round(b - base, 4)}
        with open(self.timeline, "a") as f:
            f.write(json.dumps(line) + "\n")

    @contextmanager
    def paused(self):
        """No engine work inside (the current plan finishes first): a checkpoint reads state the
        generator changes (APRIL's buffer, the controller) consistently with the pool's own."""
        with self.engine_lock:
            yield

    def state_dict(self) -> dict:
        """Plans drawn and not yet trained; the generated ones with their rollouts and costs."""
        with self.cond:
            jobs = [
                (k, j.plan, j.pairs if j.done and j.error is None else None, j.cost if j.done else None)
                for k, j in sorted(self.jobs.items())
            ]
            return {"jobs": jobs, "next_index": self.next_index, "drawn": self.drawn}

    def load_state_dict(self, s: dict) -> None:
        with self.cond:
            self.jobs = {}
            for k, plan, pairs, cost in s["jobs"]:
                job = Job(k, plan, pairs=pairs, cost=cost, done=pairs is not None)
                self.jobs[k] = job
            self.next_index, self.drawn = s["next_index"], s["drawn"]
            self.cond.notify_all()

    def close(self) -> None:
        """The generator first (it finishes the plan in progress, up to a minute), then the engine
        (Ray workers killed); a generator still inside the engine then fails out of it, and is waited
        for once more, so that nothing of this pool calls into Ray after the run shuts Ray down
        (``ray_pool``'s docstring, "Closing"; issue #47)."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=60)
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=30)


# ---------------------------------------------------------------- config checks and assembly


def check_config(cfg) -> None:
    """Local refusals for ``train.async``, its own options consistent (``rollwise.compat.check``; what
    asynchrony cannot be combined with is derived there from ``COMPAT`` and the other parts' records)."""
    from rollwise.registry import UserError

    a = cfg.train.async_
    if a.periodic and a.max_staleness > 0:
        raise UserError(
            "train.async.periodic = true is strictly on-policy; set train.async.max_staleness = 0 "
            "(or periodic = false for bounded staleness)"
        )
    if not a.on and a.on_new_weights != "finish":
        raise UserError(
            f"train.async.on_new_weights = {a.on_new_weights!r} needs asynchronous rollouts: set "
            "train.async.max_staleness >= 1"
        )


# The generator has its own weights and runs ahead: a wrapper cannot drive the trainer's backend,
# one generator thread per process is not shared across data-parallel ranks, and it draws the plans of
# up to η later steps before a step's rounds and observe (plans ahead).
COMPAT = Compat(decode_hooks=False, per_rank=False, plans_ahead=True)


class Locked(Controller):
    """``obj`` with every method call (and its ``stream``'s) under ``lock``: the controller, when
    APRIL in the generator thread draws prompts from it while the loop's thread uses it. The
    controller hooks (the contract, ``rollwise.types.Controller``) are forwarded by name, every other
    attribute through ``__getattr__``."""

    def __init__(self, obj, lock):
        self._obj, self._lock = obj, lock

    def _call(self, name, *a, **k):
        with self._lock:
            return getattr(self._obj, name)(*a, **k)

    metrics = property(lambda self: self._obj.metrics)
    history = property(lambda self: self._obj.history)

    def select(self, state):
        return self._call("select", state)

    def plan(self, prompts, state):
        return self._call("plan", prompts, state)

    def next_round(self, groups, state):
        return self._call("next_round", groups, state)

    def finish_batch(self, groups, kept, dropped):
        return self._call("finish_batch", groups, kept, dropped)

    def observe(self, groups, state) -> None:
        self._call("observe", groups, state)

    def bind(self, services) -> None:
        self._call("bind", services)

    def advantage_inputs(self, rows, needs=()):
        return self._call("advantage_inputs", rows, needs)

    def after_update(self, batch, rows, metrics: dict, advantages) -> None:
        self._call("after_update", batch, rows, metrics, advantages)

    def state_dict(self) -> dict:
        return self._call("state_dict")

    def load_state_dict(self, s: dict) -> None:
        self._call("load_state_dict", s)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        value = getattr(self._obj, name)
        if name == "stream":
            return Locked(value, self._lock)
        if not callable(value):
            return value

        def call(*a, **k):
            with self._lock:
                return value(*a, **k)

        return call


def build(cfg, engine, backend, model, draw, timeline, consume=None, april=None, log=print) -> AsyncPool:
    """The async pool around ``engine`` (the pool ``components.build_pool`` made). The engine gets
    weights of its own: Ray workers and a vLLM engine already have them; the in-process ``hf``
    backend gets a copy of the policy (a plain model of its architecture, LoRA merged, as
    ``distributed.weights`` publishes) so the trainer's module is never read while it trains.
    ``consume``: periodic asynchrony's trainer hand-off (``StreamingTrainer.consume``); ``april``:
    ``pool -> AprilPool`` (``replay.name = "april"``), wrapped around the engine."""
    inner = getattr(engine, "pool", engine)  # SeededPool wraps the local pool
    if hasattr(engine, "load_weights"):  # Ray workers
        receive, local = engine.load_weights, None
    elif hasattr(backend, "load_weights"):  # the colocated vLLM engine
        receive, local = backend.load_weights, None
    elif getattr(backend, "model", None) is model and model is not None:
        import copy

        from rollwise.distributed.weights import base_model

        base = base_model(model)
        if base is model:
            # requires_grad kept as the policy's: some CPU kernels round differently for frozen weights,
            # and eta = 0 must sample exactly what the trainer's module would (generation is no-grad)
            shadow = copy.deepcopy(model)
        else:  # peft: a plain model of the base architecture
            from transformers import AutoModelForCausalLM

            from rollwise.distributed.weights import plain_config

            shadow = AutoModelForCausalLM.from_config(plain_config(model)).to(next(model.parameters()).dtype)
        local = copy.copy(backend)  # same sampling RNG (checkpointed as "backend"), own weights
        local.model = shadow
        inner.backend = local

        def receive(version, weights):
            shadow.load_state_dict(weights)
    else:  # a scripted backend (tests): nothing to load
        receive, local = (lambda version, weights: None), backend
    a = cfg.train.async_
    log(
        f"periodic asynchrony: {a.periodic_chunks} chunks a step"
        if a.periodic
        else f"async rollouts: max_staleness {a.max_staleness}, on new weights: {a.on_new_weights}"
    )
    scheduler = april(inner) if april is not None else None  # APRIL around the engine, run by the generator
    return AsyncPool(
        engine,
        receive,
        a,
        draw,
        backend=local,
        timeline=timeline,
        consume=consume,
        scheduler=scheduler,
        steps=cfg.train.steps,
    )
