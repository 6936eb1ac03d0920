"""Run plots: held-out pass@1 and training reward against generated tokens, and the timeline of
generation and training per worker (``plots/``)."""

from __future__ import annotations

from pathlib import Path


def plot_run(run_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rollwise.storage import read_jsonl

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
    from rollwise.storage import read_jsonl

    spans = read_jsonl(run_dir / "timeline.jsonl")
    if spans:
        return spans, True
    out = []
    for r in read_jsonl(run_dir / "metrics.jsonl"):
        end = r["wall_s"]
        train = r.get("time/train_s", 0.0) + r.get("time/weight_sync_s", 0.0)
        gen = r.get("time/generate_s", 0.0) + r.get("time/verify_s", 0.0)
        out.append({"lane": "trainer", "kind": "train", "step": r["step"], "start": end - train, "end": end})
        out.append(
            {"lane": "generator", "kind": "generate", "step": r["step"], "start": end - train - gen, "end": end - train}
        )
    return out, False


def plot_timeline(run_dir: Path, out_dir: Path) -> Path | None:
    """``plots/timeline.png`` (:func:`timeline_figure`), or None when there are no spans."""
    import matplotlib.pyplot as plt

    fig = timeline_figure(run_dir)
    if fig is None:
        return None
    path = out_dir / "timeline.png"
    fig.savefig(path, dpi=fig.dpi)
    plt.close(fig)
    return path


def timeline_figure(run_dir: Path):
    """The timeline of the whole run: one row per worker (and the trainer), a bar per span,
    coloured by kind (legend). A bar carries the step it serves when the number fits inside it
    without touching its neighbour's; the title is wrapped to the figure's width; the figure
    widens with the number of steps (up to 30 inches)."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    run_dir = Path(run_dir)
    spans, measured = timeline_spans(run_dir)
    steps = {s["step"] for s in spans if s["step"] is not None}
    if not steps:
        return None
    lanes = sorted({s["lane"] for s in spans}, key=lambda n: (n == "trainer", n))
    colors = {"generate": "tab:blue", "train": "tab:orange", "evaluate": "tab:gray"}
    fig, ax = plt.subplots(figsize=(min(30.0, max(10.0, 0.25 * len(steps))), 1.6 + 0.6 * len(lanes)), dpi=90)
    labels = []  # (text, lane, bar start, bar end)
    for y, lane in enumerate(lanes):
        for s in (x for x in spans if x["lane"] == lane):
            ax.barh(
                y,
                s["end"] - s["start"],
                left=s["start"],
                height=0.6,
                color=colors.get(s["kind"], "tab:green"),
                edgecolor="black",
                linewidth=0.4,
            )
            if s["step"] is not None and s["end"] > s["start"]:
                labels.append(
                    (
                        ax.text((s["start"] + s["end"]) / 2, y, str(s["step"]), ha="center", va="center", fontsize=7),
                        lane,
                        s["start"],
                        s["end"],
                    )
                )
    ax.set_yticks(range(len(lanes)), lanes)
    ax.set_xlabel(
        "seconds since the run started"
        + ("" if measured else " (reconstructed from metrics.jsonl)")
        + "; numbers: the step a span serves"
    )
    kinds = sorted({s["kind"] for s in spans}, key=lambda k: (list(colors).index(k) if k in colors else len(colors), k))
    ax.legend(
        handles=[Patch(color=colors.get(k, "tab:green"), label=k) for k in kinds],
        fontsize=8,
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        frameon=False,
    )
    title = ax.set_title(f"{run_dir.name}: generation and training per worker, steps {min(steps)}-{max(steps)}")
    fig.tight_layout()
    renderer = fig.canvas.get_renderer()
    width = title.get_window_extent(renderer).width
    room = fig.bbox.width * 0.95
    if width > room:  # a long run name: wrap the title rather than clip it
        title.set_text(textwrap.fill(title.get_text(), max(20, int(len(title.get_text()) * room / width))))
        fig.tight_layout()
    fig.canvas.draw()
    last_end: dict[str, float] = {}
    for text, lane, a, b in sorted(labels, key=lambda t: (t[1], t[2])):
        box = text.get_window_extent(renderer)
        x0, x1 = ax.transData.transform([(a, 0), (b, 0)])[:, 0]
        if box.width + 2 > x1 - x0 or box.x0 < last_end.get(lane, -float("inf")) + 2:
            text.remove()  # too narrow a bar, or it would touch the previous number
        else:
            last_end[lane] = box.x1
    return fig
