"""Verifier throughput before and after a change, interleaved (issue #28 item 3).

On a shared machine the load drifts by a factor of two within minutes, so two separate runs of
``code_sandbox.py --throughput-only`` do not compare. This script alternates the two source trees
(``--before``, ``--after``: directories put first on PYTHONPATH) measurement by measurement:
for each round, isolation mode and worker count it runs ``code_sandbox.throughput`` once per
tree, in a fresh interpreter, in alternating order. Reports the median calls/s of each and the
ratio after/before.

    python benchmarks/code_sandbox_ab.py --before /path/to/old/src --after src
        # -> benchmarks/results/code_sandbox_ab.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchinfo  # noqa: E402

HERE = Path(__file__).resolve().parent
ONE = (
    "import sys; sys.path.insert(0, {here!r}); import code_sandbox; "
    "print(code_sandbox.throughput({iso!r}, {workers}, {calls}))"
)


def measure(src: str, iso: str, workers: int, calls: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(Path(src).resolve())}
    code = ONE.format(here=str(HERE), iso=iso, workers=workers, calls=calls)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", required=True)
    ap.add_argument("--modes", default="bwrap,rlimit")
    ap.add_argument("--calls", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(benchinfo.RESULTS / "code_sandbox_ab.json"))
    args = ap.parse_args()
    trees = {"before": args.before, "after": args.after}
    result = {
        "when": benchinfo.stamp(),
        "machine": benchinfo.machine(),
        "git": benchinfo.git(),
        "load_before": os.getloadavg(),
        "trees": trees,
        "calls": args.calls,
        "rounds": args.rounds,
        "modes": {},
    }
    runs = {iso: {w: {"before": [], "after": []} for w in (1, 2)} for iso in args.modes.split(",")}
    for r in range(args.rounds):
        for iso in runs:
            for w in (1, 2):
                order = ("before", "after") if (r + w) % 2 == 0 else ("after", "before")
                for name in order:
                    v = measure(trees[name], iso, w, args.calls)
                    runs[iso][w][name].append(v)
                    print(f"round {r} {iso} workers {w} {name}: {v:.2f} calls/s", flush=True)
    for iso, by_w in runs.items():
        result["modes"][iso] = {}
        for w, d in by_w.items():
            b, a = benchinfo.median(d["before"]), benchinfo.median(d["after"])
            result["modes"][iso][f"workers_{w}"] = {
                "before": {"median": b, "runs": d["before"]},
                "after": {"median": a, "runs": d["after"]},
                "ratio": a / b,
            }
            print(f"{iso} workers {w}: before {b:.2f}, after {a:.2f} calls/s, ratio {a / b:.2f}", flush=True)
    result["load_after"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
