"""Draw docs/img/architecture.png: the stages in loop order, the assembler above them and the
ground floor below (docs/architecture.md §4). Run: python docs/draw_architecture.py"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

OUT = Path(__file__).resolve().parent / "img" / "architecture.png"

STAGES = [  # (title, folder, what) in loop order
    ("tasks / verify", "tasks/ verify/", "prompts,\nverifiers"),
    ("control", "control/ value/", "select, plan, rounds;\npass-rate predictor"),
    ("generate", "backends/ generate/", "hf, vllm; LATR,\nARRoL, APRIL, SPEC-RL"),
    ("distributed", "distributed/", "pools: local, Ray,\ndata-parallel, async"),
    ("filter", "filter/", "keep / drop\nwith reasons"),
    ("replay", "replay/", "on-policy, replay,\nSAPO"),
    ("reward", "reward/", "shaping, TTRL,\nFAPO's penalty"),
    ("batch", "batch/", "D3S\n(built by batches.py)"),
    ("objectives", "objectives/", "advantages,\nlosses"),
    ("trainer", "trainer/", "step, checkpoint,\nwarm start, FSDP"),
    ("ledger / eval", "ledger.py eval/", "cost, pass@k,\nplots"),
]
TOP = [
    ("cli.py", "command line"),
    ("loop.py", "table of contents"),
    ("session.py", "bookkeeping"),
    ("components.py", "the assembler"),
    ("batches.py", "groups -> batch"),
    ("compat.py", "compatibility table"),
    ("bench/", "compare, report"),
]
GROUND = [
    ("types.py", "records, contracts"),
    ("registry.py", "names, Compat"),
    ("config.py", "schema, sections/"),
    ("tokens.py", "codec"),
    ("storage.py", "atomic writes"),
    ("hardware/", "device, precision"),
    ("collate.py", "batch layout"),
    ("flaws.py", "flaw detectors"),
    ("outcomes.py", "majority, zero-var."),
]


def box(ax, x, y, w, h, title, sub, color):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08", fc=color, ec="0.35", lw=1))
    ax.text(x + w / 2, y + h * 0.68, title, ha="center", va="center", fontsize=8.5, weight="bold")
    ax.text(x + w / 2, y + h * 0.30, sub, ha="center", va="center", fontsize=6.5, color="0.25")


def arrow(ax, a, b, **kw):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=9, color=kw.pop("color", "0.3"), lw=1, **kw))


def main() -> Path:
    fig, ax = plt.subplots(figsize=(13, 5.6))
    ax.set_xlim(0, 13)
    ax.set_ylim(0, 5.6)
    ax.axis("off")
    # the assembler layer
    w = 13 / len(TOP)
    for i, (name, sub) in enumerate(TOP):
        box(ax, i * w + 0.1, 4.55, w - 0.2, 0.8, name, sub, "#e8eefc")
    ax.text(
        0.05,
        5.45,
        "assembler and bookkeeping (may import the stages; nothing below imports them)",
        fontsize=8,
        color="#2a4a9a",
    )
    # the stages, two rows in loop order
    first, second = STAGES[:6], STAGES[6:]
    sw = 13 / 6
    pos = []
    for row, items, y in ((0, first, 2.85), (1, second, 1.5)):
        for i, (title, folder, what) in enumerate(items):
            x = i * sw + 0.12 if row == 0 else (5 - i) * sw + 0.12  # the second row runs right to left
            box(ax, x, y, sw - 0.24, 1.05, f"{len(pos) + 1}. {title}", f"{folder}\n{what}", "#fff4e0")
            pos.append((x, y))
    for (x0, y0), (x1, y1) in zip(pos, pos[1:]):
        if y0 == y1:
            right, left = (x0 + sw - 0.24, x1) if x1 > x0 else (x0, x1 + sw - 0.24)  # from one box's side to the next's
            arrow(ax, (right, y0 + 0.52), (left, y1 + 0.52))
        else:
            arrow(ax, (x0 + (sw - 0.24) / 2, y0), (x1 + (sw - 0.24) / 2, y1 + 1.05))
    ax.text(
        0.05,
        4.05,
        "stages in loop order (a strategy imports the ground floor and its own stage's helpers)",
        fontsize=8,
        color="#8a5a00",
    )
    # the ground floor
    gw = 13 / len(GROUND)
    for i, (name, sub) in enumerate(GROUND):
        box(ax, i * gw + 0.06, 0.15, gw - 0.12, 0.75, name, sub, "#eaf5ea")
    ax.text(0.05, 1.0, "ground floor (imports no stage)", fontsize=8, color="#2d6a2d")
    # dependency direction: down only
    for x in (7.0, 9.4, 12.0):
        arrow(ax, (x, 4.5), (x, 3.95), color="#2a4a9a", linestyle="--")
        arrow(ax, (x + 0.4, 1.45), (x + 0.4, 0.95), color="#2d6a2d", linestyle="--")
    fig.tight_layout()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT, dpi=110)
    plt.close(fig)
    return OUT


if __name__ == "__main__":
    print(main())
