"""Per-arm sampler/trainer gap of a ``rollwise compare`` sweep (FP8 rollouts, issue #45):

    python benchmarks/mismatch_summary.py runs/compare/seedmeth benchmarks/results/seedmeth/mismatch.json

reads every run's ``metrics.jsonl`` (``<arm>-s<seed>/``) and writes, per arm, the mean over its
steps and seeds of ``mismatch/abs_mean`` (mean |log pi_trainer - log mu| over loss tokens) and
``mismatch/k3_kl``, with the per-seed means (``rollwise.trainer.mismatch``); also in millionths. Runs of
Sol-RL's pool (``sampling.sol_rl``) also give ``sol_rl/fp8_gap_abs_mean`` (mean |log mu_fp8 - log pi|
over the kept tokens before their re-score), runs of FAPO (``reward.fapo``) the shares of checked rollouts
its detector called flawed and could not decide (``fapo/flawed_frac``, ``fapo/undecided_frac``, issue #45
item 3), and every arm its steps per seed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

KEYS = (
    "mismatch/abs_mean",
    "mismatch/k3_kl",
    "sol_rl/fp8_gap_abs_mean",
    "fapo/flawed_frac",
    "fapo/undecided_frac",
)


def summary(runs: Path) -> dict:
    arms: dict[str, dict] = {}
    for metrics in sorted(runs.glob("*-s*/metrics.jsonl")):
        arm, seed = metrics.parent.name.rsplit("-s", 1)
        rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
        per_seed = {
            k: sum(r[k] for r in rows if k in r) / sum(k in r for r in rows) for k in KEYS if any(k in r for r in rows)
        }
        per_seed["steps"] = len(rows)
        arms.setdefault(arm, {"seeds": {}})["seeds"][seed] = per_seed
    for arm in arms.values():
        seeds = arm["seeds"].values()
        keys = [k for k in KEYS if all(k in s for s in seeds)]
        arm.update({k: sum(s[k] for s in seeds) / len(seeds) for k in keys})
        # the same in millionths, rounded (the unit docs/results.md writes them in)
        arm.update({k + " x1e6": round(arm[k] * 1e6, 3) for k in keys})
    return arms


if __name__ == "__main__":
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.write_text(json.dumps(summary(src), indent=2, sort_keys=True) + "\n")
    print(f"wrote {out}")
