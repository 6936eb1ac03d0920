"""Code sandbox figures (issue #16): the hostile corpus and verifier throughput.

1. **Hostile corpus** (``rollwise.verify.hostile``, 40 cases) in every isolation mode that works
   here (``bwrap``, ``rlimit``): per case the verdict's reason, the seconds the call took, and
   whether it was contained (failed with an expected reason, nothing outside changed, no process
   left, next verification correct).
2. **Throughput**: verifier calls per second through ``LocalPool.finish_rollouts`` (the path a
   training step takes) with ``--workers 1`` and ``2``: ``--calls`` distinct pyfunc programs (half
   right, half wrong, no cache, so every call starts a sandbox), repeated ``--repeats`` times, the
   worker counts interleaved; the median is reported.

The machine may be shared: the JSON records the load average before and after.

    python benchmarks/code_sandbox.py            # -> benchmarks/results/code_sandbox.json
    python benchmarks/code_sandbox.py --quick    # a smoke run (4 cases, 8 calls), not written
    python benchmarks/code_sandbox.py --throughput-only --out PATH   # calls/s only (before/after a change)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchinfo  # noqa: E402

from rollwise.registry import UserError  # noqa: E402
from rollwise.verify.hostile import CASES, run_corpus  # noqa: E402
from rollwise.verify.sandbox import Limits, Sandbox  # noqa: E402


def modes() -> list[str]:
    out = []
    for iso in ("bwrap", "rlimit"):
        try:
            Sandbox(Limits(isolation=iso))
            out.append(iso)
        except UserError:
            pass
    return out


def throughput(iso: str, workers: int, calls: int) -> float:
    from rollwise.backends.scripted import ScriptedBackend
    from rollwise.distributed.local import LocalPool
    from rollwise.tasks.pyfunc import make
    from rollwise.tokens import Codec
    from rollwise.trainer.tiny import char_tokenizer
    from rollwise.types import Completion, Request, Sampling

    task = make(
        None, {"levels": [1, 2, 3], "n_heldout": 8, "cache": False, "workers": workers, "sandbox": {"isolation": iso}}
    )
    tok = char_tokenizer()
    pool = LocalPool(
        ScriptedBackend(lambda s, i: [], tok.eos_token_id),
        Codec(tok, use_chat=False),
        task.verify,
        Sampling(),
        verify_workers=workers,
    )
    ps = list(task.train_prompts())[:calls]
    items = []
    for i, p in enumerate(ps):
        text = p.answer if i % 2 == 0 else p.answer + " + 1"
        items.append((Request(p, 1), (), Completion(tuple(tok.encode(text)), (0.0,) * len(text), "stop")))
    t0 = time.perf_counter()
    out = pool.finish_rollouts(items, 0)
    dt = time.perf_counter() - t0
    got = [r.verdict.reason == "correct" for r in out]
    if got != [i % 2 == 0 for i in range(len(items))]:
        raise RuntimeError(f"unexpected verdicts: {[r.verdict.reason for r in out]}")
    return len(items) / dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--throughput-only", action="store_true", help="skip the hostile corpus")
    ap.add_argument("--modes", default="", help="comma-separated isolation modes (default: every one that works here)")
    ap.add_argument("--out", default="", help="where to write the JSON (default benchmarks/results/code_sandbox.json)")
    args = ap.parse_args()
    calls, repeats, cases = (8, 1, CASES[:4]) if args.quick else (args.calls, args.repeats, CASES)
    result = {
        "when": benchinfo.stamp(),
        "machine": benchinfo.machine(),
        "git": benchinfo.git(),
        "load_before": os.getloadavg(),
        "rollwise_src": str(Path(sys.modules[Sandbox.__module__].__file__).resolve().parent.parent),
    }
    result["modes"] = {}
    for iso in [m for m in args.modes.split(",") if m] or modes():
        sb = Sandbox(Limits(isolation=iso, wall_s=4.0, cpu_s=1))
        res = [] if args.throughput_only else run_corpus(sb, Path(tempfile.mkdtemp()) / "outside", cases)
        corpus = [
            {
                "case": r.name,
                "reason": r.reason,
                "seconds": r.seconds,
                "contained": r.contained,
                "problems": list(r.problems),
            }
            for r in res
        ]
        rates = {1: [], 2: []}
        for _ in range(repeats):
            for w in (1, 2):
                rates[w].append(throughput(iso, w, calls))
        result["modes"][iso] = {
            "describe": sb.describe(),
            "contained": sum(r.contained for r in res),
            "cases": len(res),
            "corpus": corpus,
            "calls_per_s": {f"workers_{w}": {"median": benchinfo.median(v), "runs": v} for w, v in rates.items()},
        }
        print(
            f"{iso}: contained {sum(r.contained for r in res)}/{len(res)}; calls/s 1 worker "
            f"{benchinfo.median(rates[1]):.1f}, 2 workers {benchinfo.median(rates[2]):.1f}",
            flush=True,
        )
    result["load_after"] = os.getloadavg()
    result["calls"], result["repeats"] = calls, repeats
    if not args.quick:
        out = Path(args.out) if args.out else benchinfo.RESULTS / "code_sandbox.json"
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
