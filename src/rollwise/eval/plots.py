"""Run plots: held-out pass@1 and training reward against generated tokens, and the timeline of
generation and training per worker (``plots/``)."""

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
    path = plot_timeline(run_dir, out_dir)
    if path is not None:
        made.append(path)
    return made


def timeline_spans(run_dir: Path) -> tuple[list[dict], bool]:
    """(spans, measured): ``timeline.jsonl`` (written by the async pool: one span per generation call
    and per Ray worker, and the trainer's time between plans), or for a synchronous run spans
    reconstructed from ``metrics.jsonl`` (each step: generation, then training, ending at the
    step's ``wall_s``; evaluation and checkpoints fall in the gaps)."""
    from rollwise.ledger import read_jsonl

    spans = read_jsonl(run_dir / "timeline.jsonl")
    if spans:
        return spans, True
    out = []
    for r in read_jsonl(run_dir / "metrics.jsonl"):
        end = r["wall_s"]
        train = r.get("time/train_s", 0.0) + r.get("time/weight_sync_s", 0.0)
        gen = r.get("time/generate_s", 0.0) + r.get("time/verify_s", 0.0)
        out.append({"lane": "trainer", "kind": "train", "step": r["step"], "start": end - train, "end": end})
        out.append({"lane": "generator", "kind": "generate", "step": r["step"], "start": end - train - gen, "end": end - train})
    return out, False


def plot_timeline(run_dir: Path, out_dir: Path, last: int = 12) -> Path | None:
    """``plots/timeline.png``: one row per worker (and the trainer), a bar per span, over the
    run's ``last`` steps; bars are labelled with the step they serve."""
    import matplotlib.pyplot as plt

    spans, measured = timeline_spans(run_dir)
    steps = sorted({s["step"] for s in spans if s["step"] is not None})
    if not steps:
        return None
    keep = set(steps[-last:])
    spans = [s for s in spans if s["step"] in keep or (s["step"] is None and s["start"] >= min(
        x["start"] for x in spans if x["step"] in keep))]
    lanes = sorted({s["lane"] for s in spans}, key=lambda n: (n == "trainer", n))
    colors = {"generate": "tab:blue", "train": "tab:orange", "evaluate": "tab:gray"}
    fig, ax = plt.subplots(figsize=(10, 1.0 + 0.6 * len(lanes)))
    for y, lane in enumerate(lanes):
        for s in (x for x in spans if x["lane"] == lane):
            ax.barh(y, s["end"] - s["start"], left=s["start"], height=0.6, color=colors.get(s["kind"], "tab:green"),
                    edgecolor="black", linewidth=0.4)
            if s["step"] is not None and s["end"] - s["start"] > 0:
                ax.text((s["start"] + s["end"]) / 2, y, str(s["step"]), ha="center", va="center", fontsize=7)
    ax.set_yticks(range(len(lanes)), lanes)
    ax.set_xlabel("seconds since the run started" + ("" if measured else " (reconstructed from metrics.jsonl)"))
    ax.set_title(f"{run_dir.name}: generation (blue) and training (orange) per worker; numbers = the step served")
    fig.tight_layout()
    path = out_dir / "timeline.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
