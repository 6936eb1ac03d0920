"""A run's assembled parts and its bookkeeping (set-up, evaluation, checkpoints, progress),
kept out of ``loop.py`` so the loop reads as the table of contents.

``Run`` keeps the bookkeeping (directory, config file, seeds, resume, ledger, trackers, the first
weight sync); the parts come from the assembler (``rollwise.components``: ``open_run`` then
``assemble``), in an order that rejects bad input early: run directory, task (reads files),
strategies (validated options), and only then the model.
"""

from __future__ import annotations

import json
import math
import random
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from rollwise import components, defaults, progress
from rollwise import resume as resume_check
from rollwise.config import Config, to_toml
from rollwise.eval.evaluate import evaluate
from rollwise.ledger import Ledger
from rollwise.trainer import checkpoint
from rollwise.types import RunState, Stateful


@dataclass
class RunResult:
    run_dir: Path
    steps: int
    first_eval: dict = field(default_factory=dict)
    last_eval: dict = field(default_factory=dict)
    totals: dict = field(default_factory=dict)

    def summary(self) -> str:
        a, b = self.first_eval.get("eval/pass@1"), self.last_eval.get("eval/pass@1")
        n = self.last_eval.get("eval/n_prompts")
        acc = (
            f"held-out pass@1 {a:.3f} -> {b:.3f} ({100 * (b - a):+.1f} pts{within_noise(a, b, n)})"
            if a is not None and b is not None
            else "no evaluation"
        )
        return (
            f"{self.steps} steps, {acc}, {self.totals.get('generated_tokens', 0):,} generated tokens, "
            f"{self.totals.get('rollouts', 0):,} rollouts"
        )

    def noise_hint(self) -> str:
        """The line that follows a summary whose held-out change is within noise ("" otherwise): what would
        measure one."""
        a, b = self.first_eval.get("eval/pass@1"), self.last_eval.get("eval/pass@1")
        if a is None or b is None or not within_noise(a, b, self.last_eval.get("eval/n_prompts")):
            return ""
        return (
            "this run measured no held-out gain (nor loss): more held-out prompts (eval.n_prompts, up to the task's "
            "held-out split) narrow the interval, more steps (train.steps) give training the time to move it"
        )


def within_noise(a: float, b: float, n: float | None) -> str:
    """``"; no measured change: within ±X pts, 2 standard errors over N prompts"`` when a change of held-out pass@1 from
    ``a`` to ``b``, each measured on ``n`` prompts, is smaller than two standard errors of a difference of two
    pass rates (sqrt(a(1-a)/n + b(1-b)/n), every prompt counted as one trial: conservative when a prompt has
    several samples); "" when it is larger or ``n`` is unknown. E.g. 0.141 -> 0.172 on 16 prompts: 2 SE =
    25.7 pts, so the +3.1 is within noise. A rate of exactly 0 or 1 is taken as half a prompt away from it
    (1/(2n)), so 0 -> 0 on 64 prompts is "within ±3.1 pts", not a change measured exactly."""
    if not n:
        return ""
    a_, b_ = (min(max(x, 0.5 / n), 1 - 0.5 / n) for x in (a, b))
    two_se = 2 * math.sqrt((a_ * (1 - a_) + b_ * (1 - b_)) / n)
    if abs(b - a) >= two_se:
        return ""
    return f"; no measured change: within ±{100 * two_se:.1f} pts, 2 standard errors over {int(n)} prompts"


def without_warm_start(cfg: Config) -> Config:
    """``cfg`` with ``model.warm_start.steps = 0`` (a resumed run's weights come from its checkpoint)."""
    ws = cfg.model.warm_start.model_copy(update={"steps": 0})
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"warm_start": ws})})


class Run:
    async_pool = base_pool = None  # until the assembler sets them: close() after a set-up that failed early

    def __init__(self, cfg: Config, resume: bool = False, backend=None, log=print):
        dp, cfg, log = components.start_data_parallel(cfg, log)  # torchrun ranks > 0 take rank 0's run name
        cfg = defaults.resolve(cfg, log=log)  # unset keys that follow the model and the task (issue #32)
        if resume:  # the saved config against the requested one, before anything in the directory is touched
            changes = resume_check.check(cfg, cfg.run_dir())
        else:  # a default run name never reuses an existing run directory
            cfg, changes = cfg.with_run_name(), {}
        self.cfg, self.log, self.main = cfg, log, dp is None or dp.main  # main: this process writes the run directory
        self.dir, task, parts = components.open_run(cfg, resume, self.main)  # rejects bad input before the model loads
        if not resume:
            self._write_config()
        random.seed(cfg.run.seed), np.random.seed(cfg.run.seed), torch.manual_seed(cfg.run.seed)
        ckpt = checkpoint.latest(self.dir, log=log) if resume else None
        wiring = components.Wiring(lambda: self.state, self.dir, log)
        built = cfg if ckpt is None else without_warm_start(cfg)  # weights from the checkpoint: no warm start
        try:
            self._set_up(built, task, parts, wiring, dp, backend, resume, ckpt, changes)
        except BaseException:  # Ray may be up already (check_runtime): the pools built so far closed, Ray stopped
            self._release()
            raise

    def _set_up(self, built, task, parts, wiring, dp, backend, resume, ckpt, changes) -> None:
        """``__init__`` from the assembly on (``__init__`` releases what it started if this raises)."""
        cfg = self.cfg
        vars(self).update(vars(components.assemble(built, task, parts, wiring, dp, backend)))  # parts: run attributes
        self.ledger = Ledger(
            self.dir,
            write=self.main,
            facts=self.precision.ledger_fields() | self.verifier_facts,
            device=next(self.model.parameters()).device,
        )  # precision/*, sandbox/* (code tasks) and device/* on every line
        self.state = RunState(seed=cfg.run.seed)
        self.evals: list[dict] = []
        self.saved_step: int | None = None  # the newest checkpoint this run wrote or resumed from
        self._plotted_at: float | None = None
        self._plotted_step: int | None = None
        if resume:
            self._resume(ckpt, changes)
        self.start_step = self.state.step  # finish(): a resumed run that trains no step leaves its final/ as it is
        if self.dp is not None:  # rank 0 releases the others; every rank takes rank 0's weights
            self.dp.lead(self.cfg, [self.model, self.trainer.ref_model])
        if cfg.train.fsdp:  # the trainer shards a copy; self.model stays whole (rollwise.trainer.fsdp)
            self.trainer.shard()
        self.sync_weights()  # the engines start from the trainer's weights (warm-started or resumed)
        self.trackers = self._open_trackers() if cfg.run.report_to and self.main else None

    def _open_trackers(self):
        """Experiment trackers fed by the ledger (rollwise.trackers)."""
        from rollwise.trackers import Trackers

        cfg = self.cfg
        trackers = Trackers(
            cfg.run.report_to,
            self.dir,
            cfg.model_dump(mode="json"),
            to_toml(cfg),
            self.state.step,
            self.ledger.totals["generated_tokens"],
            log=self.log,
        )
        self.ledger.sinks.append(trackers)
        for line in self.evals:  # kept evaluations at the resumed step (tensorboard purged them)
            if line["step"] >= self.state.step:
                trackers("eval", line)
        return trackers

    def _write_config(self) -> None:
        if not self.main:
            return
        resolved = self.dir / "config.resolved.toml"  # atomic: a kill here must not spoil a later --resume
        resolved.with_suffix(".tmp").write_text(to_toml(self.cfg))
        resolved.with_suffix(".tmp").replace(resolved)

    def sync_weights(self) -> float:
        """Publish the trainer's weights to every engine that does not share its module (vLLM,
        Ray workers; rollwise.distributed.weights); returns the seconds (0.0 when none does)."""
        if not self.receivers:
            return 0.0
        from rollwise.distributed.weights import policy_weights

        t0 = now()
        weights = policy_weights(self.model)
        for r in self.receivers:
            r.load_weights(self.state.policy_version, weights)
        return now() - t0

    # -------------------------------------------------------------- checkpoints
    def _stateful(self) -> dict:
        p = self.parts
        return {
            "controller": p.controller,
            "replay": p.replay,
            "trainer": self.trainer,
            "ledger": self.ledger,
            "backend": self.backend,
            "arrol": self.arrol,
            "async_pool": self.async_pool,
            "value": self.value,
        }

    def _frozen(self) -> dict:
        """Frozen models saved with the policy (the KL reference: it is the warm-started model,
        which a resumed run does not rebuild)."""
        ref = self.trainer.ref_model
        return {"reference": ref} if ref is not None else {}

    def checkpoint(self) -> Path | None:
        if not self.main:  # rank 0 saves the (identical) state of every data-parallel rank
            if self.cfg.train.fsdp:  # ... but gathers FSDP's optimizer shards from every rank
                self.trainer.state_dict()
            return None
        if self.async_pool is not None:  # the generator's current plan finishes first (AsyncPool.paused)
            with self.async_pool.paused():
                return self._checkpoint()
        return self._checkpoint()

    def _checkpoint(self) -> Path:
        state = {name: obj.state_dict() for name, obj in self._stateful().items() if isinstance(obj, Stateful)}
        state["run_state"] = vars(self.state).copy()
        history = self.parts.controller.history
        if history is not None:  # per-prompt statistics, for inspection
            (self.dir / "prompt_stats.json").write_text(json.dumps(history.dump(), indent=1))
        path = checkpoint.save(
            self.dir,
            self.state.step,
            self.model,
            state,
            self.cfg.run.keep_checkpoints,
            self._frozen(),
            previous=self.saved_step,
        )
        self.saved_step = self.state.step
        return path

    def _resume(self, ckpt: Path | None, changes: dict) -> None:
        self._restore(ckpt)
        if changes and self.main:  # allowed mid-run changes (steps, budgets, cadences): recorded at the step they start
            resume_check.record(self.dir, self.state.step, changes)
            self._write_config()
            self.log(
                "changed on resume at step {}: {}".format(
                    self.state.step, ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changes.items())
                )
            )

    def _restore(self, ckpt: Path | None) -> None:
        if ckpt is None:
            self.log(f"no checkpoint in {self.dir}; starting from step 0")
            self.ledger.truncate(0)
            if self.main:
                (self.dir / "eval.jsonl").unlink(missing_ok=True)
            return
        state = checkpoint.load(ckpt, self.model, self._frozen())
        self.saved_step = int(ckpt.name.split("-")[1])
        for name, obj in self._stateful().items():
            if name in state and isinstance(obj, Stateful):
                obj.load_state_dict(state[name])
        self.state = RunState(**state["run_state"])
        self.ledger.truncate(self.state.step)
        from rollwise.ledger import read_jsonl

        self.evals = read_jsonl(self.ledger.eval_path)
        self.log(f"resumed from {ckpt} (step {self.state.step})")

    # -------------------------------------------------------------- evaluation
    def observe_values(self, groups) -> dict:
        """The pass-rate predictor learns the step's groups (``value.enabled``); its ``value/*`` metrics
        and cost (prefill tokens and seconds, probe fitting seconds) since the last step, else {}."""
        if self.value is None:
            return {}
        return {**self.value.observe(groups, self.state.policy_version), **self.value.take_cost()}

    def evaluate(self, record: bool = True) -> dict:
        outcomes: dict[str, list[bool]] = {}
        m = evaluate(
            self.pool,
            self.task.heldout_prompts(),
            self.cfg.eval,
            self.sampling,
            self.cfg.run.seed,
            self.state.step,
            self.state.policy_version,
            outcomes=outcomes,
        )
        if self.value is not None:  # the predictor scored on the held-out prompts just evaluated (never trained on)
            m.update(
                self.value.evaluate(
                    self.task.heldout_prompts(), outcomes, self.state.policy_version, f"step {self.state.step}"
                )
            )
        if not record:  # `rollwise eval` of a finished run leaves its ledger as it is
            return {"step": self.state.step, **m}
        line = self.ledger.record_eval(self.state.step, m)
        self.evals.append(line)
        self._plot()
        return line

    PLOT_EVERY_S = 30.0  # redraw the run's plots at most this often while training (a redraw takes ~1-2 s on a CPU)

    def _plot(self, final: bool = False) -> None:
        """Redraw ``plots/`` after an evaluation, at most every ``PLOT_EVERY_S`` seconds, and at the
        end of the run if an evaluation since the last redraw is not drawn yet."""
        last = self._plotted_at
        if final and (not self.evals or self._plotted_step == self.evals[-1]["step"]):
            return
        if final or last is None or time.perf_counter() - last >= self.PLOT_EVERY_S:
            self.ledger.plot()
            if self.value is not None and self.value.curves and self.main:
                from rollwise.value.metrics import plot_calibration

                plot_calibration(self.value.curves, self.dir / "plots" / "value_calibration.png")
            self._plotted_at, self._plotted_step = time.perf_counter(), self.evals[-1]["step"]

    def within_budget(self) -> bool:
        """False once the ledger's cumulative training cost reaches ``train.budget_generated_tokens``
        or ``train.budget_rollouts`` (the step that crosses a budget completes, so a run may end
        up to one step's cost above it; evaluation is never charged)."""
        t, c = self.ledger.totals, self.cfg.train
        return not (
            (c.budget_generated_tokens is not None and t["generated_tokens"] >= c.budget_generated_tokens)
            or (c.budget_rollouts is not None and t["rollouts"] >= c.budget_rollouts)
        )

    def due(self, every: int) -> bool:
        step = self.state.step
        return step == self.cfg.train.steps or (every > 0 and step % every == 0)

    def finish(self) -> RunResult:
        if not self.evals or self.evals[-1]["step"] != self.state.step:
            self.evaluate()
        saved = checkpoint.list_steps(self.dir)
        missing = not saved or saved[-1] != self.state.step
        if self.dp is not None:  # rank 0's listing decides: every rank takes part in an FSDP checkpoint
            missing = self.dp.all_gather(missing)[0]
        if missing:
            self.checkpoint()
        from rollwise import storage
        from rollwise.export import write_hf  # final/: the trained model as a Hugging Face directory

        if self.state.step == self.start_step and (self.dir / "final").is_dir():  # resumed, nothing left to train
            self.log(
                f"run {self.dir} is already complete at step {self.state.step}: nothing trained, final/ left as it is "
                f"(to train on, resume with a larger train.steps or budget: --set train.steps=N)"
            )
        elif self.main:
            with storage.guard(f"the exported model {self.dir / 'final'}", self.dir):
                write_hf(self.model, self.codec.tokenizer, self.dir / "final", overwrite=True)
        self._plot(final=True)  # after final/: the model first, the plots can be redrawn from the ledger
        return RunResult(
            self.dir,
            self.state.step,
            self.evals[0] if self.evals else {},
            self.evals[-1] if self.evals else {},
            dict(self.ledger.totals),
        )

    # -------------------------------------------------------------- progress
    @contextmanager
    def progress(self):
        """The training session: a progress bar (or a no-op update), and on leaving it, normally
        or not, the trackers finished and the run directory unlocked (``close``)."""
        try:
            with self._bar() as update:
                yield update
        finally:
            self.close()

    def close(self) -> None:
        try:
            self._release()
        finally:
            if self.trackers is not None:
                self.trackers.close()
            checkpoint.unlock_run_dir(self.dir)

    def _release(self) -> None:
        """In this order (issue #47): the asynchronous generator (its thread, then its engine), the base
        pool (Ray workers, episode threads), then the Ray this run started (``components.release_runtime``),
        so that nothing calls into Ray after it is down; each step even if one before it failed."""
        try:
            for pool in (self.async_pool, self.base_pool):
                if pool is not None:
                    pool.close()
        finally:
            components.release_runtime(self.cfg)

    def _budget(self) -> tuple[str, int, int]:
        """(unit, spent, total) of what ends the run: a compute budget when one is set, else steps."""
        t, c = self.ledger.totals, self.cfg.train
        if c.budget_generated_tokens is not None:
            return "tokens", t["generated_tokens"], c.budget_generated_tokens
        if c.budget_rollouts is not None:
            return "rollouts", t["rollouts"], c.budget_rollouts
        return "steps", self.state.step, self.cfg.train.steps

    @contextmanager
    def _bar(self):
        """A rich progress bar on a terminal; plain log lines (through ``log``, so ``rollwise compare -j``
        labels them by run) when stdout is not one (nohup, cluster jobs, pipes) or ROLLWISE_PROGRESS=plain:
        one per step, or per hundredth of the steps cap. Budget runs show the budget's progress. Both name the
        step just trained by its number in ``metrics.jsonl`` (steps count from 0; README "Step numbers")."""
        if not self.cfg.run.progress or not self.main:
            yield lambda **kw: None
            return
        if progress.plain():
            every = max(1, self.cfg.train.steps // 100)
            t0 = time.perf_counter()

            def line(**kw):
                step = self.state.step
                if step == 0 or not (step % every == 0 or step >= self.cfg.train.steps or not self.within_budget()):
                    return
                unit, spent, total = self._budget()
                tokens = f"tokens {self.ledger.totals['generated_tokens']:,}"
                if unit != "steps":  # the budget's progress (tokens or rollouts)
                    tokens = (
                        tokens + "  " if unit != "tokens" else ""
                    ) + f"{unit} {spent:,}/{total:,} ({100 * spent / max(1, total):.0f}%)"
                self.log(
                    f"step {step - 1} ({step}/{self.cfg.train.steps} done)  reward {kw.get('reward', '-')}  pass@1 "
                    f"{self._acc()}  {tokens}  {time.perf_counter() - t0:.0f}s"
                )

            yield line
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        unit, spent, total = self._budget()
        cols = (
            TextColumn(unit),
            MofNCompleteColumn(),
            BarColumn(),
            TextColumn("step {task.fields[step]}"),
            TextColumn("reward {task.fields[reward]}"),
            TextColumn("pass@1 {task.fields[acc]}"),
            TextColumn("tokens {task.fields[tokens]}"),
            TimeElapsedColumn(),
        )
        with Progress(*cols) as bar:
            last = lambda: self.state.step - 1 if self.state.step else "-"  # noqa: E731  the step just trained
            tid = bar.add_task(
                "train", total=total, completed=spent, reward="-", acc=self._acc(), tokens="0", step=last()
            )

            def update(**kw):
                bar.update(tid, completed=min(self._budget()[1], total), acc=self._acc(), step=last(), **kw)

            yield update

    def _acc(self) -> str:
        return f"{self.evals[-1]['eval/pass@1']:.3f}" if self.evals else "-"


def step_metrics(groups, dropped: dict[str, int], plan_sizes: list[int]) -> dict:
    """Per-step reward, degeneracy, filter and allocation metrics of the generated groups."""
    scores = [s for g in groups for s in g.rewards() if s is not None]
    degenerate = sum(1 for g in groups if len({s for s in g.rewards() if s is not None}) <= 1)
    sizes = [g.size for g in groups] or [0]
    out = {
        "reward/mean": sum(scores) / len(scores) if scores else 0.0,
        "groups/count": len(groups),
        "groups/degenerate_frac": degenerate / max(1, len(groups)),
        "control/rollouts_per_prompt_mean": sum(sizes) / len(sizes),
        "control/rollouts_per_prompt_min": min(sizes),
        "control/rollouts_per_prompt_max": max(sizes),
        "control/rollouts_per_prompt_p90": percentile(sizes, 0.9),
        "control/budget_used": sum(plan_sizes),
        "control/rounds": len(plan_sizes),
    }
    out.update({f"filter/{reason}": n for reason, n in dropped.items()})
    out.update(regime_metrics(groups))
    named: dict[str, list[float]] = {}  # named reward components (Verdict.rewards): their means as reward/<name>
    for g in groups:
        for r in g.rollouts:
            for k, v in (
                (r.verdict.rewards or {}) if r.verdict is not None and r.verdict.score is not None else {}
            ).items():
                named.setdefault(k, []).append(float(v))
    out.update({f"reward/{k}": sum(v) / len(v) for k, v in named.items()})
    return out


def regime_metrics(groups) -> dict:
    """The statistics that say how much waste a regime holds (issue #18; docs/regime.md):
    the share of groups whose verified rewards (two or more) are all correct or all wrong (binary
    threshold ``CORRECT``), and the response lengths in tokens (nearest-rank p50/p90/p99, max) with
    the share cut at ``max_new_tokens``."""
    from rollwise.types import CORRECT

    verified = [v for v in (g.verified_rewards() for g in groups) if len(v) >= 2]
    n = max(1, len(verified))
    lengths = [len(r.completion_ids) for g in groups for r in g.rollouts] or [0]
    # an episode counts when a turn was cut at max_new_tokens (Episode.end "length"), not when it ran out of turns
    cut = sum(
        r.finish == "length" if r.episode is None else r.episode.end == "length" for g in groups for r in g.rollouts
    )
    return {
        "groups/all_correct_frac": sum(min(v) >= CORRECT for v in verified) / n,
        "groups/all_wrong_frac": sum(max(v) < CORRECT for v in verified) / n,
        "length/p50": percentile(lengths, 0.5),
        "length/p90": percentile(lengths, 0.9),
        "length/p99": percentile(lengths, 0.99),
        "length/max": max(lengths),
        "length/truncated_frac": cut / max(1, sum(g.size for g in groups)),
    }


def percentile(values: list[int], q: float) -> int:
    """Nearest-rank percentile: the smallest value with at least ``q`` of the values at or below
    it (sizes 1..10, q 0.9 -> 9; sizes (4, 4, 4, 28) -> 28)."""
    ordered = sorted(values)
    rank = math.ceil(q * len(ordered) - 1e-9)  # 1-based; the epsilon absorbs float noise in q * n
    return ordered[min(len(ordered), max(1, rank)) - 1]


def now() -> float:
    return time.perf_counter()
