"""The compute ledger (docs/architecture.md §7): ``metrics.jsonl`` (one line per training step, cumulative
costs), ``eval.jsonl`` (one line per evaluation) and ``plots/``.

Training costs come only from the pool's ``StepCost`` of training rounds; evaluation is
recorded separately and never charged. Lines are appended and flushed at once, so a killed run
loses nothing it had recorded; an append that fails part-way (a full disk) is cut back to the
line before and stops the run (``rollwise.storage``), so no half line is left; ``truncate(step)`` drops lines written
after the checkpoint a run resumes from, so a resumed run's files read as if it had never stopped.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

from rollwise.storage import read_jsonl  # noqa: F401 (the reader lives in storage.py since #27: eval/plots reads it too)

COST_KEYS = ("generated_tokens", "trained_tokens", "rollouts", "verifier_calls", "unverified")
# Rollout-reuse costs (SPEC-RL, rollwise.generate.spec_rl): cumulative, 0 for other strategies.
REUSE_KEYS = ("reused_tokens", "verify_tokens")
# Multi-turn episodes (rollwise.generate.episodes): per-step ``episodes/<key>``, written only on steps
# that ran episodes, so single-turn runs write the lines they always wrote.
EPISODE_KEYS = ("episodes", "turns", "tool_calls", "tool_s", "observation_tokens", "env_s", "waiting_s")


def episode_fields(cost) -> dict:
    """``episodes/<key>`` of a step's cost (``EPISODE_KEYS``; ``episodes/count`` for the number of
    episodes), or {} when the step ran none."""
    if not getattr(cost, "episodes", 0):
        return {}
    out = {f"episodes/{k}": getattr(cost, k) for k in EPISODE_KEYS if k != "episodes"}
    return {"episodes/count": cost.episodes, **out}


class Ledger:
    def __init__(self, run_dir: Path, write: bool = True, facts: dict | None = None, device=None):
        self.dir = Path(run_dir)
        self.write = write  # False: totals and lines are kept, no file is touched (data-parallel ranks > 0)
        # facts of this session written on every training line, e.g. the compute dtype it chose and
        # why (precision/*, rollwise.hardware.precision); a resumed session decides (and writes) its own
        self.facts = dict(facts or {})
        self.metrics_path = self.dir / "metrics.jsonl"
        self.eval_path = self.dir / "eval.jsonl"
        self.totals = {k: 0 for k in COST_KEYS}
        self.filter_counts: Counter[str] = Counter()
        self.elapsed_before = 0.0  # wall seconds of earlier (resumed-from) sessions
        self.t0 = time.perf_counter()
        # callables (kind, line) given every line written, kind "train" or "eval" (rollwise.trackers)
        self.sinks: list = []
        # the device's facts (device/*, rollwise.hardware.device.describe) join them and, on CUDA, each
        # line reports the device's peak memory since the last line
        self.device = None
        if device is not None:
            from rollwise.hardware.device import describe

            self.facts.update(describe(device))
            self.device = device if device.type == "cuda" else None

    def wall_s(self) -> float:
        return self.elapsed_before + time.perf_counter() - self.t0

    def record(self, step: int, version: int, cost, trained_tokens: int, extra: dict) -> dict:
        self.totals["generated_tokens"] += cost.generated_tokens
        self.totals["rollouts"] += cost.rollouts
        self.totals["verifier_calls"] += cost.verifier_calls
        self.totals["unverified"] += cost.unverified
        self.totals["trained_tokens"] += trained_tokens
        for k in REUSE_KEYS:  # .get: checkpoints written before these keys existed
            self.totals[k] = self.totals.get(k, 0) + getattr(cost, k, 0)
        line = {"step": step, "policy_version": version, "wall_s": round(self.wall_s(), 4)}
        line.update({f"cost/{k}": v for k, v in self.totals.items()})
        line.update({"time/generate_s": cost.generate_s, "time/verify_s": cost.verify_s})
        line.update(self.facts)
        line.update(episode_fields(cost))
        line.update(getattr(cost, "metrics", None) or {})
        line.update(extra)
        if self.device is not None:
            from rollwise.hardware.device import peak_memory

            line.update(peak_memory(self.device))
        self._append(self.metrics_path, line)
        for sink in self.sinks:
            sink("train", line)
        return line

    def record_eval(self, step: int, metrics: dict) -> dict:
        line = {
            "step": step,
            "cost/generated_tokens": self.totals["generated_tokens"],
            "cost/rollouts": self.totals["rollouts"],
            "wall_s": round(self.wall_s(), 4),
            **metrics,
        }
        self._append(self.eval_path, line)
        for sink in self.sinks:
            sink("eval", line)
        return line

    def _append(self, path: Path, line: dict) -> None:
        if not self.write:
            return
        from rollwise import storage

        with storage.guard(f"{path.name} in {self.dir}", self.dir):  # a full disk: the line is cut back, the run stops
            storage.append_line(path, json.dumps(line) + "\n")

    def truncate(self, step: int) -> None:
        """Keep metrics lines with step < ``step`` and eval lines with step <= ``step``. A last
        line cut short by a kill (no newline, not JSON) is dropped; the file is replaced
        atomically, so a kill during truncation leaves the old file or the new one."""
        import os

        if not self.write:
            return
        for path, keep in ((self.metrics_path, lambda s: s < step), (self.eval_path, lambda s: s <= step)):
            if path.exists():
                text = path.read_text()
                complete = text if text.endswith("\n") else text[: text.rfind("\n") + 1]
                lines = [ln for ln in complete.splitlines() if ln.strip() and keep(json.loads(ln)["step"])]
                tmp = path.with_name(path.name + ".tmp")
                tmp.write_text("".join(ln + "\n" for ln in lines))
                os.replace(tmp, path)

    def state_dict(self) -> dict:
        return {"totals": dict(self.totals), "filter_counts": dict(self.filter_counts), "wall_s": self.wall_s()}

    def load_state_dict(self, s: dict) -> None:
        self.totals = dict(s["totals"])
        self.filter_counts = Counter(s["filter_counts"])
        self.elapsed_before, self.t0 = s["wall_s"], time.perf_counter()

    def plot(self) -> None:
        if not self.write:
            return
        from rollwise.eval.plots import plot_run

        plot_run(self.dir)
