"""The pass-rate predictor's figures over a sweep's runs (issue #31; docs/results.md "Predicting
before generating"), from the runs' ledgers, which ``compare.json`` does not carry: the held-out
Brier score and AUC of "this group will be zero-variance" at every evaluation, the same scores on
each step's own train prompts predicted before their groups were seen, the share of zero-variance
groups, the mean train reward, and the predictor's charged cost (prefill tokens, forward and
probe-fitting seconds). One JSON.

    rollwise compare --config benchmarks/regime_cot_value.toml
    rollwise compare --config benchmarks/regime_cot_value_mix.toml
    python benchmarks/value_ledger.py runs/compare/regime_cot_value \\
        benchmarks/results/regime_cot_value/value_ledger.json

Reads each run's ``metrics.jsonl`` (``groups/degenerate_frac``, ``reward/mean``,
``value/train_brier``, ``value/train_auc_degenerate``, ``value/forward_tokens``,
``time/value_forward_s``, ``time/value_fit_s``: per step) and ``eval.jsonl``
(``value/heldout_brier``, ``value/heldout_auc_degenerate``). Run names are ``<arm>-s<seed>``. Per
arm: means over seeds of the per-run means, the held-out scores averaged over seeds at each step
every seed evaluated and at each run's last evaluation, and the seed range (min, max) of the
per-run train-prompt scores and costs. An AUC is None where a step's groups were all degenerate or
none was (``rollwise.value.metrics``); those are left out of its means. Keys a run does not write
(an arm without the predictor) give None.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchinfo  # noqa: E402


def mean(values) -> float | None:
    """Mean of the values that are not None; None when none is left."""
    vs = [v for v in values if v is not None]
    return sum(vs) / len(vs) if vs else None


def seed_range(values) -> list[float] | None:
    """[min, max] of the values that are not None; None when none is left."""
    vs = [v for v in values if v is not None]
    return [min(vs), max(vs)] if vs else None


def run_figures(metrics: list[dict], evals: list[dict]) -> dict:
    """One run's figures from its ledger lines (``metrics``: one per training step; ``evals``: one
    per evaluation)."""

    def total(key):
        vs = [m[key] for m in metrics if key in m]
        return sum(vs) if vs else None

    heldout = [
        {"step": e["step"], "brier": e["value/heldout_brier"], "auc_degenerate": e.get("value/heldout_auc_degenerate")}
        for e in evals
        if e.get("value/heldout_brier") is not None
    ]
    return {
        "steps": len(metrics),
        "zero_variance_share": mean(m.get("groups/degenerate_frac") for m in metrics),
        "train_reward": mean(m.get("reward/mean") for m in metrics),
        "train_brier": mean(m.get("value/train_brier") for m in metrics),
        "train_auc_degenerate": mean(m.get("value/train_auc_degenerate") for m in metrics),
        "heldout": heldout,
        "forward_tokens": total("value/forward_tokens"),
        "forward_s": total("time/value_forward_s"),
        "fit_s": total("time/value_fit_s"),
    }


def arm_figures(runs: list[dict]) -> dict:
    """An arm's figures from its runs' ``run_figures``."""
    steps = [{h["step"] for h in r["heldout"]} for r in runs]
    common = sorted(set.intersection(*steps)) if steps else []
    at = [{h["step"]: h for h in r["heldout"]} for r in runs]
    curve = [
        {
            "step": s,
            "brier": mean(a[s]["brier"] for a in at),
            "auc_degenerate": mean(a[s]["auc_degenerate"] for a in at),
        }
        for s in common
    ]
    last = [r["heldout"][-1] for r in runs if r["heldout"]]
    return {
        "runs": len(runs),
        "steps": seed_range(r["steps"] for r in runs),
        "zero_variance_share": mean(r["zero_variance_share"] for r in runs),
        "train_reward": mean(r["train_reward"] for r in runs),
        "heldout_curve": curve,
        "heldout_final": {
            "brier": mean(h["brier"] for h in last),
            "auc_degenerate": mean(h["auc_degenerate"] for h in last),
        }
        if last
        else None,
        "train_brier": seed_range(r["train_brier"] for r in runs),
        "train_auc_degenerate": seed_range(r["train_auc_degenerate"] for r in runs),
        "forward_tokens": seed_range(r["forward_tokens"] for r in runs),
        "forward_s": seed_range(r["forward_s"] for r in runs),
        "fit_s": seed_range(r["fit_s"] for r in runs),
    }


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def summarise(sweep_dir: Path) -> dict:
    """``{"arms": {arm: arm_figures}, "runs": {run name: run_figures}}`` of the runs under ``sweep_dir``."""
    runs = {
        d.name: run_figures(read_lines(d / "metrics.jsonl"), read_lines(d / "eval.jsonl"))
        for d in sorted(Path(sweep_dir).iterdir())
        if (d / "metrics.jsonl").exists()
    }
    arms: dict[str, list[dict]] = {}
    for name, r in runs.items():
        arms.setdefault(name.rsplit("-s", 1)[0], []).append(r)
    return {"arms": {arm: arm_figures(rs) for arm, rs in arms.items()}, "runs": runs}


def main(sweep_dir: str, out: str) -> None:
    doc = {"sweep_dir": sweep_dir, **summarise(Path(sweep_dir)), "machine": benchinfo.machine()}
    doc["created"] = benchinfo.stamp()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(doc, indent=1) + "\n")
    for arm, s in doc["arms"].items():
        print(arm, {k: v for k, v in s.items() if k != "heldout_curve"})


if __name__ == "__main__":
    main(*sys.argv[1:3])
