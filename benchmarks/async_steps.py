"""Seconds per RL step of the synchronous loop, asynchronous rollouts (AReaL bounded staleness,
η = 1 and 2) and periodic asynchrony (issue #14), on 1 and 2 Ray rollout workers, each from a
whole ``rollwise train`` run in a subprocess; arms interleaved over ``--repeats`` so that load
drift on a shared machine hits them alike.

Tasks: ``default`` (the embedded default: arithmetic, tiny model, cached warm start, 32 x 8
rollouts) and ``cot`` (the chain-of-thought variant at levels 3-5, traces of very different
lengths, 64 new tokens, 16 x 8 rollouts), as benchmarks/async.toml and async_cot.toml. Every arm trains with
``decoupled_ppo``; evaluation and checkpoints are off. Per run: the median over steps 2.. of the
step's wall-clock (consecutive ``wall_s``), of ``time/generate_s``, ``time/train_s``,
``time/trainer_wait_s`` (async: the loop waiting for its plan), ``util/*``, and the largest
staleness trained. The run directories stay under ``--runs`` for ``simulate_async.py --validate``.

    HF_HUB_OFFLINE=1 python benchmarks/async_steps.py     # -> benchmarks/results/async_steps.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchinfo import RESULTS, git, machine, median, stamp  # noqa: E402
from scale_out import train  # noqa: E402

TASKS = {
    "default": [],
    "cot": [
        "task.options={cot = true, levels = [3, 4, 5]}",
        "sampling.max_new_tokens=64",
        "control.prompts_per_step=16",
    ],
}
MODES = {
    "sync": [],
    "async_eta1": ["train.async.max_staleness=1"],
    "async_eta2": ["train.async.max_staleness=2"],
    "periodic": ["train.async.periodic=true", "train.async.periodic_chunks=4"],
}
BASE = [
    "objective.name=decoupled_ppo",
    "eval.every=0",
    "eval.at_start=false",
    "run.checkpoint_every=0",
    "run.progress=false",
    "distributed.cpus_per_worker=1",
]
KEYS = (
    "time/generate_s",
    "time/train_s",
    "time/trainer_wait_s",
    "time/generator_idle_s",
    "util/trainer",
    "util/generator",
)


def summary(lines: list[dict]) -> dict:
    """Medians over steps 2.. (the first steps include Ray's and the generator's start)."""
    walls = [b["wall_s"] - a["wall_s"] for a, b in zip(lines, lines[1:])][1:]
    rest = lines[2:]
    out = {"step_s": round(median(walls), 4), "steps": len(lines)}
    for k in KEYS:
        vals = [x[k] for x in rest if k in x]
        if vals:
            out[k.split("/", 1)[1] if k.startswith("time/") else k] = round(median(vals), 4)
    out["max_staleness"] = max((x.get("async/max_staleness", 0) for x in lines), default=0)
    out["tokens_per_step"] = round(lines[-1]["cost/generated_tokens"] / len(lines), 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20, help="steps per run (default task; cot runs half)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--tasks", nargs="+", default=list(TASKS))
    ap.add_argument("--runs", type=Path, default=Path("runs/async_steps"))
    ap.add_argument("--out", type=Path, default=RESULTS / "async_steps.json")
    args = ap.parse_args()
    info = {
        "benchmark": "async_steps",
        "machine": machine(),
        "git": git(),
        "started": stamp(),
        "base": BASE,
        "tasks": TASKS,
        "modes": MODES,
        "runs": {},
    }
    for rep in range(args.repeats):
        for task in args.tasks:
            for w in args.workers:
                for mode, extra in MODES.items():
                    name = f"{task}-w{w}-{mode}-r{rep}"
                    steps = args.steps if task == "default" else max(4, args.steps // 2)
                    overrides = BASE + TASKS[task] + extra + [f"distributed.workers={w}", f"train.steps={steps}"]
                    try:
                        res = train(overrides, None, args.runs, name)
                    except SystemExit as e:  # a crashed run is recorded, retried once under another name
                        info.setdefault("failures", []).append({"run": name, "error": str(e)[-600:]})
                        print(f"{name}: FAILED, retrying once", flush=True)
                        name += "-retry"
                        res = train(overrides, None, args.runs, name)
                    s = summary(res["steps"])
                    info["runs"][name] = {
                        "task": task,
                        "workers": w,
                        "mode": mode,
                        "repeat": rep,
                        "process_wall_s": res["process_wall_s"],
                        **s,
                    }
                    print(
                        f"{name}: {s['step_s']:.3f} s/step, trainer wait {s.get('trainer_wait_s', '-')}, "
                        f"max staleness {s['max_staleness']}",
                        flush=True,
                    )
    table = {}
    for r in info["runs"].values():
        table.setdefault(f"{r['task']}-w{r['workers']}", {}).setdefault(r["mode"], []).append(r["step_s"])
    info["median_step_s"] = {k: {m: round(median(v), 4) for m, v in arms.items()} for k, arms in table.items()}
    info["speedup_vs_sync"] = {
        k: {m: round(arms["sync"] / v, 3) for m, v in arms.items()}
        for k, arms in info["median_step_s"].items()
        if "sync" in arms
    }
    info["finished"], info["machine_after"] = stamp(), machine()
    args.out.write_text(json.dumps(info, indent=1))
    print(json.dumps(info["median_step_s"], indent=1), json.dumps(info["speedup_vs_sync"], indent=1), sep="\n")


if __name__ == "__main__":
    main()
