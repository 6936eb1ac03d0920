"""Held-out pass@1 of one policy under each episode schedule (issue #44 item 5): does the schedule change
what is measured, or only when episodes run?

    python benchmarks/schedule_probe.py   # -> benchmarks/results/episodes_dart/schedule_probe.json

The policy is episodes_dart.toml's step-0 policy (tiny-s, the calculator's 250-step warm start, cached);
it is evaluated on ``--prompts`` held-out prompts x ``--samples`` samples with two evaluation seeds,
with all episodes of a call in one backend call (the default pool), with one row per call
(``model.max_batch = 1``), and through 8 environment slots in lockstep waves and rollout-wise
(``rollwise.generate.rollout_wise``). Tools are not slowed (latency 0), so seconds are the decoder's.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import benchinfo

from rollwise.components import build_backend, build_policy, engine_pool
from rollwise.config import load_config
from rollwise.eval.evaluate import evaluate
from rollwise.tasks import build as build_task
from rollwise.types import Sampling

VARIANTS = {
    "one_call": [],
    "one_row_per_call": ["model.max_batch=1"],
    "slots_lockstep": ["task.env_slots=8"],
    "slots_rollout_wise": ["task.env_slots=8", "task.episode_schedule=rollout_wise"],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--warm-steps", type=int, default=250)
    ap.add_argument("--out", type=Path, default=benchinfo.RESULTS / "episodes_dart" / "schedule_probe.json")
    args = ap.parse_args()
    base = [
        "task.name=calculator",
        "model.name=tiny-s",
        "task.max_turns=3",
        "sampling.max_new_tokens=32",
        f"model.warm_start.steps={args.warm_steps}",
        "model.warm_start.batch_size=32",
        "run.progress=false",
        f"eval.n_prompts={args.prompts}",
        f"eval.samples={args.samples}",
        "eval.k=[1]",
    ]
    cfg0 = load_config(overrides=base)
    task = build_task(cfg0)
    model, codec = build_policy(cfg0, task, log=lambda m: None)
    model.eval()
    rows = []
    for name, extra in VARIANTS.items():
        cfg = load_config(overrides=base + extra)
        smp = Sampling(cfg.sampling.temperature, cfg.sampling.top_p, cfg.sampling.max_new_tokens)
        pool = engine_pool(cfg, build_backend(cfg, model, codec, seed=0), codec, task, smp)
        t0 = time.perf_counter()
        try:
            got = [evaluate(pool, task.heldout_prompts(), cfg.eval, smp, seed, 0, 0)["eval/pass@1"] for seed in (0, 1)]
        finally:
            pool.close()
        rows.append({"variant": name, "set": extra, "pass@1_eval_seeds_0_1": got, "seconds": time.perf_counter() - t0})
        print(json.dumps(rows[-1]), flush=True)
    out = {
        "what": "held-out pass@1 of one policy under each episode schedule (rollwise.generate.rollout_wise)",
        "prompts": args.prompts,
        "samples": args.samples,
        "warm_start": f"{args.warm_steps} x 32 calculator demonstrations, tiny-s",
        "rows": rows,
        "machine": benchinfo.machine(),
        "git": benchinfo.git(),
        "created": benchinfo.stamp(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
