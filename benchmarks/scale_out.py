"""Scale-out figures of issue #12, each from whole ``rollwise train`` runs in subprocesses:

``steps``: seconds per RL step of ``configs/smollm2_arithmetic.toml`` (SmolLM2-135M, LoRA, 4 prompts
x 8 rollouts, 24 new tokens) with ``model.backend = "hf"`` and ``"vllm"``, split into generation,
weight sync, verification and training as the run's ledger records them (``time/*_s``). The first
step of each run is reported apart (vLLM's first step includes its engine's warm-up); the others
give the median. Both sides train in fp32 (``model.compute_dtype = "float32"``, as the vLLM preset).

``ray``: wall-clock of the embedded default (tiny model, 32 x 8 rollouts) for ``--ray-steps`` steps on
the local pool and on 2 Ray rollout workers (``distributed.workers = 2``, one CPU each), and the
local pool with per-request seeds (``distributed.request_seeds = true``: the same draws as the Ray
run, one request at a time). Wall-clock is the whole process (Ray start-up, worker model loads
included) and the sum of the ledger's per-step seconds.

    HF_HUB_OFFLINE=1 python benchmarks/scale_out.py            # -> benchmarks/results/scale_out.json
    HF_HUB_OFFLINE=1 python benchmarks/scale_out.py --only ray
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from benchinfo import RESULTS, git, machine, median, stamp  # noqa: E402

STAGES = ("time/generate_s", "time/weight_sync_s", "time/verify_s", "time/train_s")


def train(overrides: list[str], config: str | None, runs: Path, name: str) -> dict:
    cmd = [sys.executable, "-m", "rollwise.cli", "train", "--set", f"run.name={name}", "--set", f"run.dir={runs}"]
    if config:
        cmd += ["--config", str(ROOT / config)]
    for o in overrides:
        cmd += ["--set", o]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{name}: rollwise train failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    lines = [json.loads(x) for x in (runs / name / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {"command": " ".join(cmd[1:]), "process_wall_s": round(wall, 2), "steps": lines}


def stage_summary(lines: list[dict]) -> dict:
    def row(line):
        return {k.split("/")[1]: round(float(line.get(k, 0.0)), 3) for k in STAGES}

    first = row(lines[0])
    rest = [row(x) for x in lines[1:]]
    med = {k: round(median(r[k] for r in rest), 3) for k in rest[0]} if rest else None
    if med:
        med["step_s"] = round(sum(med.values()), 3)
    return {"first_step": first, "median_later_steps": med, "n_steps": len(lines)}


def bench_steps(steps: int, runs: Path) -> dict:
    out = {}
    for backend in ("hf", "vllm"):
        r = train(
            [
                f"model.backend={backend}",
                "model.compute_dtype=float32",
                f"train.steps={steps}",
                "eval.every=0",
                "run.checkpoint_every=0",
                "run.progress=false",
            ],
            "configs/smollm2_arithmetic.toml",
            runs,
            f"steps-{backend}",
        )
        out[backend] = {
            "process_wall_s": r["process_wall_s"],
            **stage_summary(r["steps"]),
            "mismatch": {k: r["steps"][-1][k] for k in r["steps"][-1] if k.startswith("mismatch/")},
        }
    return out


def bench_ray(steps: int, runs: Path) -> dict:
    base = [f"train.steps={steps}", "eval.every=0", "run.checkpoint_every=0", "run.progress=false", "run.threads=2"]
    arms = {
        "local": [],
        "local_request_seeds": ["distributed.request_seeds=true"],
        "ray_2_workers": ["distributed.workers=2", "distributed.cpus_per_worker=1"],
    }
    out = {}
    for name, extra in arms.items():
        r = train(base + extra, None, runs, f"ray-{name}")
        ledger = sum(sum(float(x.get(k, 0.0)) for k in STAGES) for x in r["steps"])
        out[name] = {
            "process_wall_s": r["process_wall_s"],
            "ledger_stage_s": round(ledger, 2),
            **stage_summary(r["steps"]),
            "final_reward_mean": r["steps"][-1].get("reward/mean"),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=["steps", "ray"], default=None)
    ap.add_argument("--smollm2-steps", type=int, default=4)
    ap.add_argument("--ray-steps", type=int, default=20)
    ap.add_argument("--out", default=str(RESULTS / "scale_out.json"))
    args = ap.parse_args()
    result = {
        "benchmark": "scale_out",
        "created": stamp(),
        "git": git(),
        "machine": machine(),
        "command": "python benchmarks/scale_out.py " + " ".join(sys.argv[1:]),
    }
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp)
        if args.only in (None, "steps"):
            result["smollm2_steps"] = bench_steps(args.smollm2_steps, runs)
        if args.only in (None, "ray"):
            result["ray_vs_local"] = bench_ray(args.ray_steps, runs)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("machine",)}, indent=1))


if __name__ == "__main__":
    main()
