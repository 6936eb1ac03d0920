"""Run plots: held-out pass@1 and training reward against generated tokens (``plots/``)."""

from __future__ import annotations

from pathlib import Path


def plot_run(run_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rollwise.ledger import read_jsonl

    run_dir = Path(run_dir)
    out_dir = run_dir / "plots"
    out_dir.mkdir(exist_ok=True)
    made = []
    for name, rows, key, label in (
        ("pass_at_1", read_jsonl(run_dir / "eval.jsonl"), "eval/pass@1", "held-out pass@1"),
        ("reward", read_jsonl(run_dir / "metrics.jsonl"), "reward/mean", "training reward (mean)"),
    ):
        pts = [(r["cost/generated_tokens"], r[key]) for r in rows if key in r]
        if not pts:
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o" if name == "pass_at_1" else None)
        ax.set_xlabel("generated tokens (training)")
        ax.set_ylabel(label)
        ax.set_title(f"{run_dir.name}: {label}")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out_dir / f"{name}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        made.append(path)
    return made
