"""Per-run summary of an episode sweep (issue #30): held-out pass@1 curve, steps, policy and observation
tokens, episodes, turns, tool calls and their outcomes, tool-error rate, wall seconds, the gradient
norm of each step, how episodes ended, and, for runs with ``task.turn_budget``, its ``turn_budget/*``
fields, for runs with ``task.cleaner`` or ``task.semi_online`` their ``cleaner/*`` fields and
``episodes/patched``, for runs with ``sampling.branching`` its ``branching/*`` counts, for runs with
``task.env_slots`` the schedule's utilisation (DART: environment seconds over slot seconds, decode
seconds over the calls' wall seconds, rows per backend call, all over the whole run) with
``replay/injected`` and ``entropy_turns/*`` summed (issue #44): one JSON.

    python benchmarks/episode_runs.py runs/compare/episodes_calc benchmarks/results/episodes_calc/runs.json

Reads each run's metrics.jsonl and eval.jsonl (the ledger's episodes/* lines); the tool-error rate is
every outcome but ``tool_ok`` over the tool calls that ran (not UI-S1's replayed ones; None when none ran).
Per arm (run names ``<arm>-s<seed>``) it gives the mean of the per-run tool-error rates and of the step
counts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchinfo  # noqa: E402


def run_summary(d: Path) -> dict:
    ev = [json.loads(line) for line in open(d / "eval.jsonl")]
    m = [json.loads(line) for line in open(d / "metrics.jsonl")]
    outcomes: dict[str, float] = {}
    for line in m:
        for k, v in line.items():
            if k.startswith("episodes/tool_") and k not in ("episodes/tool_s", "episodes/tool_calls"):
                outcomes[k] = outcomes.get(k, 0) + v
    calls = sum(x["episodes/tool_calls"] for x in m)
    ran = calls - outcomes.get("episodes/tool_replayed", 0)
    ends: dict[str, float] = {}  # episodes/end_<reason> summed over the run
    budget: dict[str, float] = {}  # turn_budget/* summed over the run (its cap per step is listed apart)
    repairs: dict[str, float] = {}  # cleaner/* and episodes/patched (UI-S1) summed over the run
    trees: dict[str, float] = {}  # branching/* summed over the run
    dart: dict[str, float] = {}  # entropy_turns/* and replay/injected summed over the run
    for line in m:
        for k, v in line.items():
            if k.startswith("episodes/end_"):
                ends[k] = ends.get(k, 0) + v
            elif k.startswith("turn_budget/") and k != "turn_budget/cap":
                budget[k] = budget.get(k, 0) + v
            elif k.startswith("cleaner/") or k == "episodes/patched":
                repairs[k] = repairs.get(k, 0) + v
            elif k.startswith("branching/"):
                trees[k] = trees.get(k, 0) + v
            elif k.startswith("entropy_turns/") or k == "replay/injected":
                dart[k] = dart.get(k, 0) + v
    return {
        "curve": [(e["step"], e["eval/pass@1"]) for e in ev],
        "steps": len(m),
        "generated_tokens": m[-1]["cost/generated_tokens"],
        "observation_tokens": sum(x["episodes/observation_tokens"] for x in m),
        "episodes": sum(x["episodes/count"] for x in m),
        "turns": sum(x["episodes/turns"] for x in m),
        "tool_calls": calls,
        "tool_outcomes": outcomes,
        # over the calls that ran: UI-S1's replayed calls (episodes/tool_replayed) ran no tool
        "tool_error_rate": round(1 - outcomes.get("episodes/tool_ok", 0) / ran, 4) if ran else None,
        "wall_s": m[-1]["wall_s"],
        "grad_norm": [round(x["train/grad_norm"], 3) for x in m if "train/grad_norm" in x],  # per step
        "ends": ends,
        **({"turn_budget": budget, "turn_budget_caps": [x["turn_budget/cap"] for x in m]} if budget else {}),
        **({"repairs": repairs} if repairs else {}),
        **({"branching": trees} if trees else {}),
        **({"schedule": schedule(m)} if "episodes/slot_s" in m[0] else {}),
        **({"curation": dart} if dart else {}),
    }


def schedule(m: list[dict]) -> dict:
    """A slotted run's utilisation over all its training calls (``rollwise.generate.rollout_wise``): the
    sums of environment, slot, decode and wall seconds and of backend calls and rows, and their ratios."""
    tot = {k: sum(x[f"episodes/{k}"] for x in m) for k in ("env_s", "slot_s", "wall_s", "backend_calls")}
    gen = sum(x["time/generate_s"] for x in m)
    rows = sum(x["episodes/turns"] for x in m)  # a turn is one row of one backend call
    return {
        **{k: round(v, 3) for k, v in tot.items()},
        "generate_s": round(gen, 3),
        "env_utilisation": round(tot["env_s"] / tot["slot_s"], 4) if tot["slot_s"] else None,
        "sampler_utilisation": round(gen / tot["wall_s"], 4) if tot["wall_s"] else None,
        "rows_per_call": round(rows / tot["backend_calls"], 2) if tot["backend_calls"] else None,
    }


def main(sweep_dir: str, out: str) -> None:
    runs = {d.name: run_summary(d) for d in sorted(Path(sweep_dir).iterdir()) if (d / "metrics.jsonl").exists()}
    arms: dict[str, list[dict]] = {}
    for name, r in runs.items():
        arms.setdefault(name.rsplit("-s", 1)[0], []).append(r)
    summary = {
        arm: {
            "runs": len(rs),
            "mean_steps": sum(r["steps"] for r in rs) / len(rs),
            "mean_tool_error_rate": (
                sum(r["tool_error_rate"] for r in rs) / len(rs)
                if all(r["tool_error_rate"] is not None for r in rs)
                else None
            ),
            "pass@1_first_last": [(r["curve"][0][1], r["curve"][-1][1]) for r in rs],
        }
        for arm, rs in arms.items()
    }
    doc = {"sweep_dir": sweep_dir, "arms": summary, "runs": runs, "machine": benchinfo.machine()}
    doc["created"] = benchinfo.stamp()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(doc, indent=1) + "\n")
    for arm, s in summary.items():
        print(arm, s)


if __name__ == "__main__":
    main(*sys.argv[1:3])
