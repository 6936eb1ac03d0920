"""Behaviour check for restructurings: a dozen short runs' ledgers, with the wall-clock fields left
out, so that two commits can be compared line by line (issue #41: behaviour unchanged).

    python benchmarks/ledger_fingerprint.py --out A.json            # at the commit before
    python benchmarks/ledger_fingerprint.py --out B.json            # at the commit after
    python benchmarks/ledger_fingerprint.py --compare A.json B.json # 'equal' or the first differences

Each configuration is the tiny model on a small task for 2 steps (evaluation at the end), on one
thread so the float sums are the same from run to run. What is compared: every ``metrics.jsonl``
and ``eval.jsonl`` value except times, rates and memory (``time/*``, ``*_s``, ``*per_s``,
``wall*``, ``device/*``, ``precision/*measured*``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

BASE = {
    "run.progress": False,
    "run.checkpoint_every": 0,
    "model.name": "tiny-s",
    "model.warm_start.steps": 20,
    "model.warm_start.batch_size": 16,
    "model.compute_dtype": "float32",
    "task.options": {"n_train": 200, "n_heldout": 20},
    "train.steps": 2,
    "control.prompts_per_step": 4,
    "control.rollouts_per_prompt": 4,
    "eval.n_prompts": 8,
    "eval.samples": 2,
    "eval.k": [2],
    "eval.every": 2,
}

CONFIGS: dict[str, dict] = {
    "grpo": {},
    "dapo_zero_variance": {"objective.name": "dapo", "filter.names": ["zero_variance"], "train.epochs": 2},
    "gspo_rloo": {"objective.name": "gspo", "advantage.name": "rloo"},
    "dars": {"control.name": "dars"},
    "xrpo": {"control.name": "xrpo"},
    "greso": {"control.name": "greso"},
    "rollout_replay": {"replay.name": "rollout_replay"},
    "d3s": {"batch.d3s.enabled": True},
    "kl_in_reward": {"reward.kl.coef": 0.01},
    "overlong": {"reward.overlong_penalty.enabled": True},
    "gdro": {"control.name": "gdro"},
    "guess_gigpo": {"task.name": "guess_number", "advantage.name": "gigpo", "task.options": {}},
    "calculator": {"task.name": "calculator", "task.options": {}},
    "pyfunc": {"task.name": "pyfunc", "task.options": {"levels": [1], "n_heldout": 4}, "sampling.max_new_tokens": 12},
}

DROP_PREFIX = ("time/", "device/", "wall")
DROP_SUFFIX = ("_s", "per_s", "_seconds")


def _keep(key: str) -> bool:
    last = key.rsplit("/", 1)[-1]
    return not (key.startswith(DROP_PREFIX) or last.endswith(DROP_SUFFIX) or "measured" in key or "wall" in last)


def _sets(overrides: dict) -> list[str]:
    out = []
    for k, v in overrides.items():
        if isinstance(v, dict):
            v = "{" + ", ".join(f"{a} = {json.dumps(b)}" for a, b in v.items()) + "}"
        else:
            v = json.dumps(v)
        out.append(f"{k}={v}")
    return out


def run_all(names: list[str]) -> dict:
    import torch

    from rollwise.config import load_config
    from rollwise.loop import train

    torch.set_num_threads(1)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            o = {**BASE, "run.dir": tmp, "run.name": name, **CONFIGS[name]}
            res = train(load_config(overrides=_sets(o)), log=lambda m: None)
            lines = []
            for f in ("metrics.jsonl", "eval.jsonl"):
                for raw in (res.run_dir / f).read_text().splitlines():
                    line = json.loads(raw)
                    lines.append({f"{f}:{k}": v for k, v in sorted(line.items()) if _keep(k)})
            out[name] = lines
            print(f"{name}: {len(lines)} lines", flush=True)
    return out


def compare(a: dict, b: dict) -> list[str]:
    diffs = []
    for name in sorted(set(a) | set(b)):
        la, lb = a.get(name), b.get(name)
        if la is None or lb is None:
            diffs.append(f"{name}: only in {'B' if la is None else 'A'}")
            continue
        if len(la) != len(lb):
            diffs.append(f"{name}: {len(la)} lines against {len(lb)}")
        for i, (x, y) in enumerate(zip(la, lb)):
            for k in sorted(set(x) | set(y)):
                if x.get(k) != y.get(k):
                    diffs.append(f"{name} line {i} {k}: {x.get(k)!r} != {y.get(k)!r}")
    return diffs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--only", default="", help="comma-separated configuration names (default: all)")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"))
    args = ap.parse_args(argv)
    if args.compare:
        diffs = compare(*(json.loads(p.read_text()) for p in args.compare))
        print("equal" if not diffs else "\n".join(diffs[:60]))
        return 1 if diffs else 0
    names = [n for n in args.only.split(",") if n] or list(CONFIGS)
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        ap.error(f"unknown configuration(s) {unknown}; known: {sorted(CONFIGS)}")
    data = run_all(names)
    if args.out:
        args.out.write_text(json.dumps(data, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
