"""Data-parallel training (issue #14 item 5; rollwise.distributed.data_parallel): seconds per RL
step of the embedded default's tiny model on one process and on ``torchrun --nproc_per_node 2``
(gloo, CPU), from whole ``rollwise train`` runs in subprocesses.

Arms (same config: 8 prompts x 8 rollouts, ``train.micro_batch = 32`` so each rank's shard is one
of the one-process run's micro-batches; per-request seeds on every arm, so all arms draw the same
rollouts and train on the same batches):

- ``one_process_1_thread`` / ``one_process_2_threads``: ``run.threads`` 1 and 2;
- ``torchrun_2x1_thread``: 2 ranks of one thread each (torchrun's ``OMP_NUM_THREADS=1``).

Per step the ledger gives ``time/generate_s`` (for data parallel: the slower rank's generation +
verification), ``time/train_s`` and the step's wall-clock (difference of consecutive ``wall_s``,
which also holds the collectives and the bookkeeping); the first step is left out (warm-up) and
the median of the others reported per run, and per arm the median over ``--repeats`` runs (the
arms interleaved). Evaluation is off except the run's final one (after the last
ledger line). Start-up (imports, warm-start cache load, process group) is in ``process_wall_s``.

    HF_HUB_OFFLINE=1 python benchmarks/data_parallel.py      # -> benchmarks/results/data_parallel.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchinfo import RESULTS, git, machine, median, stamp  # noqa: E402

BASE = [
    "run.progress=false",
    "eval.at_start=false",
    "eval.every=0",
    "eval.n_prompts=8",
    "run.checkpoint_every=0",
    "control.prompts_per_step=8",
    "control.rollouts_per_prompt=8",
    "train.micro_batch=32",
    "distributed.request_seeds=true",
]


def step_times(lines: list[dict]) -> list[dict]:
    """Per step: generate, train and wall seconds (wall = this line's ``wall_s`` minus the previous
    one's; the first line has no previous one and is dropped)."""
    return [
        {"generate_s": b["time/generate_s"], "train_s": b["time/train_s"], "wall_s": b["wall_s"] - a["wall_s"]}
        for a, b in zip(lines, lines[1:])
    ]


def summarise(times: list[dict]) -> dict | None:
    if not times:
        return None
    return {k: round(median(t[k] for t in times), 4) for k in ("generate_s", "train_s", "wall_s")}


def run(name: str, launcher: list[str], overrides: list[str], runs: Path) -> dict:
    cmd = launcher + ["-m", "rollwise.cli", "train", "--set", f"run.name={name}", "--set", f"run.dir={runs}"]
    for o in BASE + overrides:
        cmd += ["--set", o]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=dict(os.environ, HF_HUB_OFFLINE="1"), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{name}: failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    lines = [json.loads(x) for x in (runs / name / "metrics.jsonl").read_text().splitlines() if x.strip()]
    times = step_times(lines)
    return {
        "command": " ".join([Path(cmd[0]).name] + cmd[1:]),
        "process_wall_s": round(wall, 2),
        "median_step": summarise(times),
        "steps": [{k: round(v, 4) for k, v in t.items()} for t in times],
        "final_cost": {k: lines[-1][k] for k in ("cost/generated_tokens", "cost/rollouts", "cost/trained_tokens")},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument(
        "--repeats", type=int, default=2, help="runs per arm, arms interleaved (a shared machine's load drifts)"
    )
    ap.add_argument("--out", default=str(RESULTS / "data_parallel.json"))
    args = ap.parse_args()
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    steps = [f"train.steps={args.steps}"]
    result = {
        "benchmark": "data_parallel",
        "created": stamp(),
        "git": git(),
        "machine": machine(),
        "command": "python benchmarks/data_parallel.py " + " ".join(sys.argv[1:]),
    }
    arms = {
        "one_process_1_thread": ([sys.executable], ["run.threads=1"]),
        "one_process_2_threads": ([sys.executable], ["run.threads=2"]),
        "torchrun_2x1_thread": ([torchrun, "--nproc_per_node", "2"], []),
    }
    runs_of: dict[str, list[dict]] = {name: [] for name in arms}
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp)
        run("warm", [sys.executable], ["train.steps=1"], runs)  # fills the warm-start cache for every arm
        for i in range(args.repeats):
            for name, (launcher, extra) in arms.items():
                runs_of[name].append(run(f"{name}-{i}", launcher, steps + extra, runs))
    result["arms"] = {
        name: {"median_step_wall_s_over_runs": round(median(r["median_step"]["wall_s"] for r in rs), 4), "runs": rs}
        for name, rs in runs_of.items()
    }
    base = result["arms"]["one_process_1_thread"]["median_step_wall_s_over_runs"]
    result["speedup_vs_one_process_1_thread"] = {
        name: round(base / a["median_step_wall_s_over_runs"], 2) for name, a in result["arms"].items()
    }
    costs = {json.dumps(r["final_cost"], sort_keys=True) for rs in runs_of.values() for r in rs}
    result["same_costs_on_every_run"] = len(costs) == 1
    result["load_avg_1min_at_end"] = os.getloadavg()[0]
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("machine", "arms")}, indent=1))
    for name, a in result["arms"].items():
        print(name, a["median_step_wall_s_over_runs"], [r["median_step"] for r in a["runs"]])


if __name__ == "__main__":
    main()
