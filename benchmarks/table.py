"""Print a Markdown table of a ``rollwise compare`` result (for READMEs and notes):

python benchmarks/table.py benchmarks/results/arith_quick/compare.json
"""

from __future__ import annotations

import json
import sys


def _k(v: float | None) -> str:
    return "—" if v is None else f"{v / 1000:.0f}k"


def _ci(ci, fmt) -> str:
    if not ci:
        return ""
    lo, hi = ci
    return f" ({fmt(lo)}–{fmt(hi) if hi is not None else 'not reached'})"


def table(compare: dict) -> str:
    seeds = len(compare["sweep"]["seeds"])
    ks = [
        k
        for k in next(iter(compare["arms"].values()))["metrics"]
        if k.startswith("final_pass@") and k != "final_pass@1"
    ]
    head = [
        "arm",
        "tokens to target (95% CI)",
        "seeds reached",
        "ratio to baseline",
        "seconds to target",
        "final pass@1 (CI)",
        *[k.removeprefix("final_") for k in ks],
        "AUC",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, arm in compare["arms"].items():
        m, r = arm["metrics"], arm["ratios"]
        ttt, sec = m["tokens_to_target"], m["seconds_to_target"]
        ratio = r.get("tokens_to_target")
        f3 = lambda v: f"{v:.3f}"  # noqa: E731
        row = [
            name,
            _k(ttt["value"]) + (_ci(ttt.get("ci"), _k) if ttt["value"] is not None else ""),
            f"{ttt.get('seeds_reached', 0)}/{seeds}",
            "—" if ratio is None else f"{ratio:.2f}",
            ("—" if sec["value"] is None else f"{sec['value']:.0f} s")
            + (
                f" ({arm['confounded']['seconds_to_target']})"
                if arm.get("confounded", {}).get("seconds_to_target")
                else ""
            ),
            f3(m["final_pass@1"]["value"]) + _ci(m["final_pass@1"].get("ci"), f3),
            *[f3(m[k]["value"]) for k in ks],
            f3(m["auc"]["value"]),
        ]
        lines.append("| " + " | ".join(row) + " |")
    target = compare["target"]
    warnings = "".join(f"\n\nWarning: {w}" for w in compare.get("warnings", []))
    return "\n".join(lines) + f"\n\nTarget: held-out pass@1 {target['value']:.3f} ({target['source']})." + warnings


if __name__ == "__main__":
    for path in sys.argv[1:]:
        print(table(json.load(open(path))))
