"""Rollout-stage throughput with and without APRIL partial rollouts (issue "Generate less, reuse
more", item 1; rollwise.generate.april, docs/specs/systems.md §1).

What is measured, in one process:

1. **Model and task.** The built-in tiny model, warm-started (``--warm-steps`` supervised steps,
   not cached) on chain-of-thought arithmetic (``task.options.cot``, levels 1-4): the trace length
   grows with the number of digits, and at temperature 1 a partly trained model sometimes runs on
   to the budget, so response lengths are long-tailed (the JSON records their quantiles).
2. **Arms**, on the same prompt stream (a seeded uniform controller each) and the same weights (no
   training between steps: this isolates the rollout stage): ``sync`` = the local pool, N groups of
   n rollouts per step, every row decoded until the longest finishes; ``april`` = the same pool
   wrapped by ``PartialRollouts(over_provision)``: N' = ceil(factor N) groups pulled (buffer first),
   generation stops once N groups are complete, unfinished rows resume at the next step. Both use
   the HF backend (KV cache, fp32) with every pulled row in one decode batch.
3. **Timing.** One untimed warm-up step per arm (APRIL's first step has no buffer), then
   ``--steps`` timed steps, the arms alternating step by step so machine noise hits both alike.
   A step's time is the wall time of ``pool.generate`` (decode + verification). Reported per arm:
   generated tokens / s (every sampled token, including unfinished rows' tokens), complete groups
   / s (groups handed to the trainer), and the mean decode-batch occupancy is implied by both.

The machine is shared (other processes run beside it), so figures are noisy; the arms are
interleaved to keep the ratio fair.

Final measurement::

    OMP_NUM_THREADS=1 python benchmarks/april_throughput.py   # -> benchmarks/results/april_throughput.json

Smoke test::

    OMP_NUM_THREADS=1 python benchmarks/april_throughput.py --warm-steps 5 --steps 1 --groups 2 --out /tmp/april.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchinfo  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3, 4])
    p.add_argument("--warm-steps", type=int, default=120, help="supervised warm-start steps on CoT traces")
    p.add_argument("--groups", type=int, default=16, help="N: complete groups per step")
    p.add_argument("--n", type=int, default=8, help="rollouts per prompt")
    p.add_argument("--factor", type=float, default=2.0, help="APRIL over-provisioning N'/N")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--steps", type=int, default=6, help="timed steps per arm")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--compare-compaction",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run both arms with finished rows kept in the decode batch (HFBackend.compact = False)",
    )
    p.add_argument("--out", default=str(benchinfo.RESULTS / "april_throughput.json"))
    return p.parse_args(argv)


def quantiles(xs: list[int]) -> dict:
    s = sorted(xs)
    if not s:
        return {}
    q = lambda f: s[min(len(s) - 1, int(f * len(s)))]  # noqa: E731
    return {"mean": round(sum(s) / len(s), 2), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": s[-1]}


def main(argv=None) -> int:
    a = parse_args(argv)
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    if a.threads:
        torch.set_num_threads(a.threads)
    from rollwise.backends.hf import HFBackend
    from rollwise.config import load_config
    from rollwise.control.uniform import Uniform
    from rollwise.distributed.local import LocalPool
    from rollwise.generate.april import PartialRollouts
    from rollwise.tasks.arithmetic import make
    from rollwise.tokens import Codec
    from rollwise.trainer.tiny import build_tiny
    from rollwise.trainer.warm_start import warm_start
    from rollwise.types import RunState, Sampling

    t_start = time.perf_counter()
    cfg = load_config(
        overrides=[
            f"model.warm_start.steps={a.warm_steps}",
            "model.warm_start.cache=false",
            f"control.prompts_per_step={a.groups}",
            f"control.rollouts_per_prompt={a.n}",
        ]
    )
    task = make(None, {"levels": a.levels, "cot": True, "n_train": 2000})
    model, tok = build_tiny(a.model, seed=a.seed)
    codec = Codec(tok, use_chat=False)
    t0 = time.perf_counter()
    warm_start(model, codec, task, cfg.model.warm_start, a.seed, {"bench": "april"}, log=lambda m: None, episodes=False)
    warm_s = time.perf_counter() - t0
    print(f"warm start: {a.warm_steps} steps in {warm_s:.1f} s", flush=True)
    sampling = Sampling(a.temperature, 1.0, a.max_new_tokens)
    width = int(a.factor * a.groups + 0.999999) * a.n

    def pool(compact=True):
        backend = HFBackend(model, codec.eos_ids, codec.pad_id, max_batch=max(width, a.groups * a.n), seed=a.seed)
        backend.compact = compact  # False: finished rows stay in the decode batch (before issue #13)
        return LocalPool(backend, codec, task.verify, sampling, max_batch=max(width, a.groups * a.n))

    arms = {}
    for suffix, compact in [("", True)] + ([("_nocompact", False)] if a.compare_compaction else []):
        sync_ctrl = Uniform(task.train_prompts(), cfg.control, None, a.seed)
        april_ctrl = Uniform(task.train_prompts(), cfg.control, None, a.seed)
        sync_pool, april_inner = pool(compact), pool(compact)
        buf = PartialRollouts(None, PartialRollouts.Options(over_provision=a.factor), a.seed)
        april_pool = buf.wrap_pool(april_inner, april_ctrl, lambda: RunState())
        arms["sync" + suffix] = (sync_ctrl, sync_pool, sync_pool)
        arms["april" + suffix] = (april_ctrl, april_pool, april_inner)
    stats = {
        k: {
            "seconds": 0.0,
            "generated_tokens": 0,
            "groups": 0,
            "rollouts": 0,
            "lengths": [],
            "steps": [],
            "offpolicy_token_frac": [],
            "partial_rollouts": 0,
        }
        for k in arms
    }
    for step in range(a.steps + 1):
        for name, (ctrl, p, inner) in arms.items():
            plan = ctrl.plan(ctrl.select(RunState(step=step)), RunState(step=step))
            t0 = time.perf_counter()
            groups = p.generate(plan, [], step)
            dt = time.perf_counter() - t0
            cost = inner.take_cost()
            if step == 0:  # warm-up step
                continue
            s = stats[name]
            s["seconds"] += dt
            s["generated_tokens"] += cost.generated_tokens
            s["groups"] += len(groups)
            s["rollouts"] += sum(g.size for g in groups)
            s["lengths"] += [len(r.completion_ids) for g in groups for r in g.rollouts]
            s["offpolicy_token_frac"].append(cost.metrics.get("april/offpolicy_token_frac", 0.0))
            s["partial_rollouts"] += cost.metrics.get("april/partial_rollouts", 0)
            s["steps"].append(
                {"seconds": round(dt, 3), "generated_tokens": cost.generated_tokens, "groups": len(groups)}
            )
            print(f"step {step} {name}: {dt:.2f} s, {cost.generated_tokens} tokens, {len(groups)} groups", flush=True)
    arms_out = {}
    for name, s in stats.items():
        arms_out[name] = {
            "generated_tokens_per_s": round(s["generated_tokens"] / s["seconds"], 1),
            "groups_per_s": round(s["groups"] / s["seconds"], 3),
            "seconds": round(s["seconds"], 2),
            "generated_tokens": s["generated_tokens"],
            "groups": s["groups"],
            "rollouts": s["rollouts"],
            "trained_response_length": quantiles(s["lengths"]),
            "partial_rollouts": s["partial_rollouts"],
            "offpolicy_token_frac_mean": round(sum(s["offpolicy_token_frac"]) / len(s["offpolicy_token_frac"]), 3),
            "per_step": s["steps"],
        }
    sync, april = arms_out["sync"], arms_out["april"]
    result = {
        "benchmark": "april_throughput",
        "created": benchinfo.stamp(),
        "git": benchinfo.git(),
        "machine": benchinfo.machine(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "settings": {
            "model": a.model,
            "task": f"arithmetic cot=true levels={a.levels}",
            "warm_start_steps": a.warm_steps,
            "groups_per_step": a.groups,
            "rollouts_per_prompt": a.n,
            "over_provision": a.factor,
            "max_new_tokens": a.max_new_tokens,
            "temperature": a.temperature,
            "timed_steps": a.steps,
            "torch_threads": torch.get_num_threads(),
            "backend": "rollwise hf (KV cache), fp32, all pulled rows in one decode batch; finished rows leave it "
            "(KV cache compacted) except in the *_nocompact arms",
            "note": "arms interleaved step by step on the same weights; compare the speedup ratio only (machine load "
            "at start: machine.load_avg_1min_at_start)",
        },
        "arms": arms_out,
        "speedup": {
            "generated_tokens_per_s": round(april["generated_tokens_per_s"] / sync["generated_tokens_per_s"], 3),
            "groups_per_s": round(april["groups_per_s"] / sync["groups_per_s"], 3),
        },
        **(
            {
                "speedup_nocompact": {  # the same ratio with finished rows kept in the batch (before issue #13)
                    "groups_per_s": round(
                        arms_out["april_nocompact"]["groups_per_s"] / arms_out["sync_nocompact"]["groups_per_s"], 3
                    )
                },
                "compaction_speedup_groups_per_s": {  # compacting / not compacting, per arm
                    k: round(arms_out[k]["groups_per_s"] / arms_out[k + "_nocompact"]["groups_per_s"], 3)
                    for k in ("sync", "april")
                },
            }
            if "sync_nocompact" in arms_out
            else {}
        ),
        "load_avg_at_end": os.getloadavg(),
        "warm_start_s": round(warm_s, 1),
        "total_wall_s": round(time.perf_counter() - t_start, 1),
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(
        json.dumps(result["speedup"]),
        {
            k: (v["generated_tokens_per_s"], v["groups_per_s"], v["trained_response_length"])
            for k, v in arms_out.items()
        },
    )
    print(f"wrote {out} ({result['total_wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
