"""The skip lever's cap on a sweep's regime, measured through training (issue #43's goal: where the
physics of a regime caps the saving, measure the cap and how close the levers get to it).

A run of DAPO's dynamic sampling (``filter.names = ["zero_variance"]`` with
``control.dynamic_sampling`` refill; Yu et al. 2025, arXiv 2503.14476) drops every zero-variance
group after generating it and refills the step from the prompt stream until it holds the step's
groups. A perfect predictor of degeneracy with the same refill (GRESO's skip, the value prior's,
any skip lever with no errors) would train on exactly those batches: the same prompts from the same
stream, the same kept groups, so the same policy and the same held-out curve. Only its bill
differs: it would never have generated the dropped groups. So re-costing each of the DAPO arm's
evaluations at the tokens of the groups its steps trained on (``cost/trained_tokens``, the loss
tokens, cumulative in ``metrics.jsonl``; an evaluation at step s follows steps 0..s-1) gives the
tokens to target of that oracle, and its paired saving against the baseline is the most any skip
lever with refill can save on this regime, measured rather than read off step 0's statistics.

Assumptions, stated: a skipped prompt is replaced by the stream's next one (refill), as in the
measured skip arms; the oracle skips only zero-variance groups (what ``zero_variance`` drops), not
groups that are informative but teach little; a refill round asks only for the missing groups, so
no informative group is generated and then trimmed (``filter/surplus`` stays 0; the script reports
it). This is a bound for skipping alone: allocation, reuse and stopping change the batches and are
not in it.

Reads the sweep file (its runs directory, baseline, target rule and arms; every arm's runs must be
finished) and writes one JSON: the target (the sweep's rule over the baseline's mean curve, as
``rollwise compare`` computes it), and per arm, the oracle included as ``oracle:<arm>``, tokens to
target (mean curve, 95% CI, seeds reached), the paired saving against the baseline with its
interval, final pass@1, and each arm's paired saving as a share of the oracle's (``of_cap``:
log(saving) / log(oracle saving), 1 = the cap reached, 0 = no saving, below 0 a loss). Per DAPO run: steps,
generated and trained tokens and their ratio (the bill a perfect predictor avoids), generation rounds and
groups trained per step (refill stops at ``max_rounds``, so a step may train on fewer than its target),
and their means over the runs.

    rollwise compare --config benchmarks/regime_hard_mix_long.toml -j 2
    python benchmarks/skip_cap.py benchmarks/regime_hard_mix_long.toml --arm filter \\
        --out benchmarks/results/regime_hard_mix_long/skip_cap.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

X_TRAINED = "cost/trained_tokens"


def recost(evals: list[dict], metrics: list[dict]) -> list[dict]:
    """``evals`` with ``cost/generated_tokens`` replaced by the cumulative trained tokens of the steps
    before each evaluation (an evaluation at step s follows steps 0..s-1; step 0's is 0). Refused when a
    step the evaluation follows has no metrics line (a run cut short)."""
    from rollwise.bench.analysis import X_TOKENS

    trained = {int(m["step"]): float(m[X_TRAINED]) for m in metrics}
    out = []
    for e in evals:
        s = int(e["step"])
        if s > 0 and s - 1 not in trained:
            raise SystemExit(f"evaluation at step {s} follows step {s - 1}, which metrics.jsonl lacks")
        out.append({**e, X_TOKENS: trained[s - 1] if s > 0 else 0.0})
    return out


def of_cap(saving: float | None, cap: float | None) -> float | None:
    """An arm's paired saving as a share of the cap's on a log scale: log(saving) / log(cap); None
    when either is missing or the cap is no saving (<= 1)."""
    if saving is None or cap is None or cap <= 1.0 or saving <= 0.0:
        return None
    return math.log(saving) / math.log(cap)


def run_facts(metrics: list[dict]) -> dict:
    last = metrics[-1]
    gen, tr = float(last["cost/generated_tokens"]), float(last[X_TRAINED])
    return {
        "steps": len(metrics),
        "generated_tokens": gen,
        "trained_tokens": tr,
        "generated_per_trained": gen / tr if tr else None,
        "surplus_groups": sum(float(m.get("filter/surplus", 0)) for m in metrics),
        "rounds_mean": sum(float(m.get("control/rounds", 1)) for m in metrics) / len(metrics),
        # groups trained per step: those generated less every filter's drops (refill stops at max_rounds,
        # so a step can train on fewer than its target)
        "kept_groups_mean": sum(
            float(m.get("groups/count", 0)) - sum(float(v) for k, v in m.items() if k.startswith("filter/"))
            for m in metrics
        )
        / len(metrics),
    }


def figures(
    evals: dict[str, dict[int, list[dict]]],
    metrics: dict[int, list[dict]],
    baseline: str,
    arm: str,
    budget_tokens: float,
    target,
) -> dict:
    """The cap's figures from the runs' eval lines (``evals[arm][seed]``, as ``rollwise compare``
    collects them) and the DAPO arm's metrics lines (``metrics[seed]``): ``analysis.analyse`` over
    every arm plus ``oracle:<arm>`` (the DAPO runs re-costed by ``recost``), with the sweep's baseline,
    budget (the AUC's range) and target rule."""
    from rollwise.bench import analysis

    oracle = f"oracle:{arm}"
    evals = {**evals, oracle: {seed: recost(evals[arm][seed], metrics[seed]) for seed in sorted(evals[arm])}}
    res = analysis.analyse(evals, baseline, float(budget_tokens), [], target)
    cap_fig = res["arms"][oracle]["paired"]["tokens_to_target"]
    arms = {}
    for name, a in res["arms"].items():
        m = a["metrics"]
        paired = a["paired"].get("tokens_to_target", {})
        arms[name] = {
            "tokens_to_target": {k: m["tokens_to_target"].get(k) for k in ("value", "ci", "seeds_reached")},
            "final_pass@1": {k: m["final_pass@1"].get(k) for k in ("value", "ci")},
            "paired_saving": (
                {
                    "value": paired["value"],
                    "ci": paired["ci"],
                    "separation": paired["separation"],
                    "censored": paired["censored"],
                    "per_seed": {s: p["saving"] for s, p in paired["per_seed"].items()},
                }
                if paired
                else None
            ),
            "of_cap": of_cap(paired.get("value"), cap_fig.get("value")) if paired and name != oracle else None,
        }
    facts = {str(seed): run_facts(metrics[seed]) for seed in sorted(metrics)}
    keys = ("steps", "generated_per_trained", "rounds_mean", "kept_groups_mean")
    runs = list(facts.values())
    mean = {k: sum(r[k] for r in runs) / len(runs) if all(r[k] is not None for r in runs) else None for k in keys}
    return {
        "baseline": baseline,
        "dapo_arm": arm,
        "oracle": oracle,
        "reading": "oracle:<arm> is the DAPO arm's held-out curve re-costed at the tokens of the groups it "
        "trained on: what a perfect degeneracy predictor with refill would have spent (module docstring)",
        "target": res["target"],
        "warnings": res["warnings"],
        "arms": arms,
        "dapo_runs": facts,
        "dapo_mean_over_runs": mean,
    }


def cap(sweep_path: Path, arm: str) -> dict:
    """``figures`` of a sweep file whose runs are all finished, with the machine."""
    from rollwise.bench.runner import collect, machine_info, status
    from rollwise.bench.sweep import load_sweep, plan
    from rollwise.ledger import read_jsonl

    sweep = load_sweep(sweep_path)
    runs_dir = sweep.default_out_dir()
    specs = plan(sweep, runs_dir)
    names = [a.name for a in sweep.arms]
    if arm not in names:
        raise SystemExit(f"--arm {arm!r} is not an arm of {sweep_path} (arms: {', '.join(names)})")
    if sweep.budget.generated_tokens is None:
        raise SystemExit("the sweep's budget must be generated_tokens (the oracle is re-costed in tokens)")
    unfinished = [s.name for s in specs if status(s) != "done"]
    if unfinished:
        raise SystemExit(f"runs not finished (run rollwise compare first): {', '.join(unfinished)}")
    metrics = {s.seed: read_jsonl(s.dir / "metrics.jsonl") for s in specs if s.arm == arm}
    out = figures(collect(specs), metrics, sweep.baseline_arm, arm, sweep.budget.generated_tokens, sweep.target)
    return {
        "sweep": Path(sweep_path).as_posix(),
        "runs_dir": runs_dir.as_posix(),
        **out,
        "machine": machine_info(),
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep", type=Path, help="the sweep file whose runs are finished")
    ap.add_argument("--arm", required=True, help="the sweep's DAPO dynamic-sampling arm")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    out = cap(args.sweep, args.arm)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    for name, a in out["arms"].items():
        ps = a["paired_saving"]
        print(f"{name:>16}: paired saving {ps and ps['value']} {ps and ps['ci']}, of the cap {a['of_cap']}")


if __name__ == "__main__":
    main()
