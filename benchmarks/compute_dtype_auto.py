"""What ``model.compute_dtype = "auto"`` picks on this CPU, and whether the pick is the faster
one (issue #33).

1. **The decision**: ``rollwise.hardware.precision.decide_compute_dtype("auto", ...)`` for the
   embedded default's tiny model and for SmolLM2-135M (its config only, no weights needed), with
   a fresh cache, so the measurement runs and its wall time is recorded beside its timings.
2. **The embedded default pair**: ``rollwise.train`` with ``train.steps`` (default 60), no
   evaluation during training (``eval.at_start = false``, ``eval.every = 0``; the final one is cut
   to 8 prompts x 1 sample and comes after the last step) and no checkpoints, once per
   ``--dtypes`` arm (default ``auto float32 bfloat16``), each in its own process and in turn. Step
   time is the ledger's: the last ``metrics.jsonl`` ``wall_s`` (the training loop, from the end of
   the set-up to the end of the last step); the process wall time (imports, model, final
   evaluation, export) is recorded too. The warm start is run (and cached) before the first arm
   (not with ``--warm-start-steps 0``: nothing to cache).
3. **vs_trl** (optional, ``--vs-trl-json``): the summary of a ``benchmarks/vs_trl.py`` result
   run separately, e.g. the issue's reduced pair::

       python benchmarks/vs_trl.py --model smollm2-135m --prompts 4 --group 8 --max-new-tokens 64 \\
           --settings same best --lengths forced --steps 1 --warmup 1 --profile never \\
           --out benchmarks/results/compute_dtype_auto_vs_trl.json

Usage::

    HF_HUB_OFFLINE=1 python benchmarks/compute_dtype_auto.py \\
        --vs-trl-json benchmarks/results/compute_dtype_auto_vs_trl.json   # -> results/compute_dtype_auto.json
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchinfo  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def arm_overrides(
    dtype: str, steps: int, run_dir: Path, name: str, threads: int | None, warm_start_steps: int | None = None
) -> list[str]:
    """``--set`` overrides of one embedded-default arm (pure); ``warm_start_steps`` None keeps the
    default's warm start (the measured figures), a small number makes a smoke run."""
    sets = [
        f"model.compute_dtype={dtype}",
        f"train.steps={steps}",
        "eval.at_start=false",
        "eval.every=0",
        "eval.n_prompts=8",
        "eval.samples=1",
        "eval.k=[1]",
        "run.checkpoint_every=0",
        "run.progress=false",
        f"run.dir={run_dir}",
        f"run.name={name}",
        "run.overwrite=true",
    ]
    if threads:
        sets.append(f"run.threads={threads}")
    if warm_start_steps is not None:
        sets.append(f"model.warm_start.steps={warm_start_steps}")
    return sets


def train_command(overrides: list[str]) -> list[str]:
    """A fresh Python process running ``rollwise.train`` on the default config with ``overrides``,
    its log on stdout (the Python API: no CLI dependencies needed)."""
    code = (
        "import json, sys, rollwise; from rollwise.config import load_config; "
        "rollwise.train(load_config(overrides=json.loads(sys.argv[1])), log=print)"
    )
    return [sys.executable, "-c", code, json.dumps(overrides)]


def summarise_run(lines: list[dict]) -> dict:
    """Training wall time, phase sums and the recorded precision of one run's metrics lines (pure)."""
    last = lines[-1]
    return {
        "steps": len(lines),
        "train_loop_wall_s": round(last["wall_s"], 2),
        "generate_s": round(sum(ln["time/generate_s"] for ln in lines), 2),
        "train_s": round(sum(ln["time/train_s"] for ln in lines), 2),
        "generated_tokens": last["cost/generated_tokens"],
        "precision": {k: v for k, v in last.items() if k.startswith("precision/")},
    }


def vs_trl_summary(result: dict) -> dict:
    """Per settings/mode of a vs_trl.py result: each side's median s/step and what rollwise's
    ledger recorded for its precision (pure)."""
    out = {
        "command": result.get("command"),
        "created": result.get("created"),
        "compute_dtype_auto": result.get("settings", {}).get("compute_dtype_auto"),
        "modes": {},
    }
    for name, m in result.get("modes", {}).items():
        out["modes"][name] = {
            side: {
                "s_per_step_median": m[side]["s_per_step_median"],
                "generate_s_median": m[side].get("generate_s_median"),
                "bf16_autocast": m[side].get("bf16_autocast"),
                **({"precision": m[side]["precision"]} if "precision" in m[side] else {}),
            }
            for side in ("rollwise", "trl")
            if side in m
        }
    return out


def decision(name: str, config, cache: Path) -> dict:
    from rollwise.hardware.precision import decide_compute_dtype

    t0 = time.perf_counter()
    p = decide_compute_dtype("auto", "cpu", config, cache_path=cache)
    return {
        "model": name,
        "chose": p.name,
        "bf16_speedup": round(p.bf16_speedup, 4),
        "fp32_ms_per_pass": round(p.fp32_s * 1e3, 3),
        "bf16_ms_per_pass": round(p.bf16_s * 1e3, 3),
        "measure_wall_s": round(time.perf_counter() - t0, 2),
        "detail": p.detail,
    }


def smollm2_config():
    """SmolLM2-135M's architecture (its published config.json) as a LlamaConfig; no weights."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        tie_word_embeddings=True,
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument(
        "--dtypes", nargs="+", default=["auto", "float32", "bfloat16"], choices=["auto", "float32", "bfloat16"]
    )
    ap.add_argument("--threads", type=int, default=None, help="run.threads of each arm (default: the config's)")
    ap.add_argument(
        "--warm-start-steps", type=int, default=None, help="model.warm_start.steps of every arm (default: the config's)"
    )
    ap.add_argument("--vs-trl-json", default=None, help="a benchmarks/vs_trl.py result to summarise beside")
    ap.add_argument("--note", default=None, help="free text stored in the JSON (e.g. which CPU types were available)")
    ap.add_argument("--out", default=str(benchinfo.RESULTS / "compute_dtype_auto.json"))
    a = ap.parse_args(argv)

    import torch

    from rollwise.hardware.precision import cpu_flags, cpu_model
    from rollwise.trainer.tiny import build_tiny

    cuda = None
    if torch.cuda.is_available():  # the CUDA rule (no measurement), recorded where a GPU is present
        from rollwise.hardware.precision import decide_compute_dtype

        p = decide_compute_dtype("auto", "cuda", build_tiny("tiny")[0].config)
        cuda = {"device": torch.cuda.get_device_name(0), "chose": p.name, "reason": p.reason, "detail": p.detail}
    if a.threads:
        torch.set_num_threads(a.threads)
    work = Path(tempfile.mkdtemp(prefix="rollwise-dtype-"))
    cache = work / "compute_dtype.json"  # a fresh cache: the decisions below are measured, not read
    decisions = [
        decision("tiny (embedded default)", build_tiny("tiny")[0].config, cache),
        decision("smollm2-135m", smollm2_config(), cache),
    ]
    for d in decisions:
        print(
            f"auto for {d['model']}: {d['chose']} ({d['detail']}; measuring took {d['measure_wall_s']} s)", flush=True
        )

    if a.warm_start_steps != 0:  # with no warm start (a smoke run) there is nothing to cache: no extra process
        print("warm start (cached for the arms) ...", flush=True)
        subprocess.run(
            train_command(arm_overrides("float32", 1, work, "prep", a.threads, a.warm_start_steps)),
            check=True,
            stdout=subprocess.DEVNULL,
        )
    arms = {}
    for dtype in a.dtypes:
        print(f"embedded default, compute_dtype={dtype}, {a.steps} steps ...", flush=True)
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        proc = subprocess.run(
            train_command(arm_overrides(dtype, a.steps, work, dtype, a.threads, a.warm_start_steps)),
            check=True,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - t0
        from rollwise.ledger import read_jsonl

        s = summarise_run(read_jsonl(work / dtype / "metrics.jsonl"))
        said = [ln for ln in proc.stdout.splitlines() if ln.startswith("compute dtype:")]
        arms[dtype] = {**s, "process_wall_s": round(wall, 2), "load_avg_1min_before": load, "log": said}
        print(f"  {s['precision']}: training loop {s['train_loop_wall_s']} s, process {wall:.1f} s", flush=True)

    shutil.rmtree(work, ignore_errors=True)  # the runs and the fresh cache: their figures are in the JSON
    flags = sorted(cpu_flags())
    result = {
        "benchmark": "compute_dtype_auto",
        "issue": 33,
        "created": benchinfo.stamp(),
        "git": benchinfo.git(),
        "machine": {
            **benchinfo.machine(),
            "cpu_model": cpu_model(),
            "cpu_flags_all": flags,
            "bf16_related_flags": [f for f in flags if "bf16" in f or f.startswith("amx") or f.startswith("avx512")],
        },
        "note": a.note,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "decisions": decisions,
        "cuda_decision": cuda,
        "embedded_default": {
            "overrides": arm_overrides("<dtype>", a.steps, Path("<tmp>"), "<dtype>", a.threads),
            "arms": arms,
        },
    }
    if "auto" in arms and "float32" in arms:
        result["embedded_default"]["auto_over_float32_train_loop"] = round(
            arms["auto"]["train_loop_wall_s"] / arms["float32"]["train_loop_wall_s"], 3
        )
    if "bfloat16" in arms and "float32" in arms:
        result["embedded_default"]["bfloat16_over_float32_train_loop"] = round(
            arms["bfloat16"]["train_loop_wall_s"] / arms["float32"]["train_loop_wall_s"], 3
        )
    if a.vs_trl_json:
        result["vs_trl"] = {"file": a.vs_trl_json, **vs_trl_summary(json.loads(Path(a.vs_trl_json).read_text()))}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
