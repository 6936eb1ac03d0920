"""The comparison's plot and self-contained HTML report (from ``compare.json``'s dict).

``plot`` draws held-out pass@1 against training generated tokens: per arm the mean curve over
seeds and a min–max band, the target as a dashed line and the budget as a dotted one.
``html`` renders the tables (per arm: to-target tokens and seconds, AUC, final pass@k, each with
its CI and ratio to the baseline; paired by seed: each arm's saving in tokens to target against
the baseline seed by seed, with its paired interval; per run: steps, stop reason, cost), the plot
embedded as a
base64 ``data:`` URI, and every arm's resolved config in a ``<pre>``: no external resources, so
the file opens from disk anywhere.
"""

from __future__ import annotations

import base64
import html as H
import json
from pathlib import Path

from rollwise.bench.analysis import CONFOUNDED

PLOT = "pass_at_1_vs_tokens.png"
REPORT = "report.html"

LOWER_IS_BETTER = {"tokens_to_target", "seconds_to_target"}


def plot(compare: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for i, (name, arm) in enumerate(compare["arms"].items()):
        c = arm["curve"]
        color = f"C{i % 10}"
        n = len(arm["runs"])
        ax.plot(c["x"], c["mean"], color=color, lw=2, label=f"{name} (mean of {n} seed{'s' * (n != 1)})")
        ax.fill_between(c["x"], c["lo"], c["hi"], color=color, alpha=0.18, lw=0)
    t = compare["target"]["value"]
    ax.axhline(t, color="0.3", ls="--", lw=1, label=f"target {t:.3f}")
    budget = compare["sweep"]["budget"]
    if "generated_tokens" in budget:
        ax.axvline(budget["generated_tokens"], color="0.5", ls=":", lw=1, label="budget")
    ax.set_xlabel("generated tokens (training)")
    ax.set_ylabel("held-out pass@1")
    ax.set_title(f"{compare['sweep']['name']}: held-out pass@1 (band: min-max over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _num(v, digits=3) -> str:
    if v is None:
        return "—"
    if isinstance(v, float) and abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else H.escape(str(v))


def _fig(fig: dict, digits=3) -> str:
    """value [lo, hi]; a missing to-target value says 'not reached'."""
    if fig["value"] is None:
        return "not reached"
    lo, hi = ("not reached" if b is None else _num(b, digits) for b in fig["ci"])
    return f"{_num(fig['value'], digits)} <span class=ci>[{lo}, {hi}]</span>"


def _ratio(name: str, r, sep: int | None, confounded: str | None = None) -> str:
    """The ratio to the baseline; coloured and called better or worse only when the arm's interval
    and the baseline's do not overlap (``sep``, analysis.separation), else said to overlap; a
    wall-clock figure of runs that shared the machine (``confounded``) says so, uncoloured."""
    if confounded:
        return f"<span class=same>{H.escape(confounded)}</span>"
    if r is None:
        return "—"
    if not sep:
        return f"<span class=same>×{r:.2f} (intervals overlap)</span>"
    better = sep < 0 if name in LOWER_IS_BETTER else sep > 0
    return f"<span class={'better' if better else 'worse'}>×{r:.2f}, {'better' if better else 'worse'}</span>"


BOUND = {"exact": "", "at most": "≤", "at least": "≥", "unknown": "?"}


def _saving(v) -> str:
    return "not reached" if v is None else f"×{v:.2f}"


def _seed_saving(p: dict) -> str:
    """One seed's saving: '×2.00', '≤×0.67' (the arm never reached the target), '≥×4.00' (the
    baseline never did) or '?' (neither did)."""
    return "?" if p["saving"] is None else f"{BOUND[p['bound']]}×{p['saving']:.2f}"


def paired_rows(compare: dict) -> str:
    """The paired table's rows (analysis.paired_saving); '' for a compare.json written before it."""
    rows = []
    for arm, a in compare["arms"].items():
        fig = (a.get("paired") or {}).get("tokens_to_target")
        if not fig:
            continue
        lo, hi = fig["ci"]
        sep = fig["separation"]
        verdict = (
            "<span class=better>separated: fewer tokens</span>"
            if sep > 0
            else "<span class=worse>separated: more tokens</span>"
            if sep < 0
            else "<span class=same>not separated (the interval contains ×1)</span>"
        )
        seeds = ", ".join(f"s{seed} {_seed_saving(p)}" for seed, p in fig["per_seed"].items())
        rows.append(
            f"<tr><th class=arm>{H.escape(arm)}</th><td>{_saving(fig['value'])} <span class=ci>[{_num(lo, 2)}, "
            f"{'open' if hi is None else _num(hi, 2)}]</span><br>{verdict}</td><td>{fig['censored']}</td>"
            f"<td>{H.escape(seeds)}</td></tr>"
        )
    return "".join(rows)


def html(compare: dict, png: bytes, configs: dict[str, str]) -> str:
    sw, arms = compare["sweep"], compare["arms"]
    names = list(next(iter(arms.values()))["metrics"])
    labels = {
        "tokens_to_target": "tokens to target",
        "seconds_to_target": "train seconds to target",
        "auc": "AUC (mean pass@1 over budget)",
    }
    head = "".join(f"<th>{H.escape(labels.get(n, n.replace('_', ' ')))}</th>" for n in names)
    at_start = compare["target"].get("reached_at_start_by_every_arm")

    def cell(a: dict, n: str) -> str:
        if at_start and n in ("tokens_to_target", "seconds_to_target"):
            return "<td class=same>target reached at step 0 by every arm: choose a higher target</td>"
        ratio = a["ratios"][n]
        if "separation" not in a:  # a compare.json older than the separation test: the ratio alone
            shown = "—" if ratio is None else f"<span class=same>×{ratio:.2f}</span>"
        else:
            shown = _ratio(n, ratio, a["separation"].get(n), a.get("confounded", {}).get(n))
        return (
            f"<td>{_fig(a['metrics'][n], 0 if n == 'tokens_to_target' else 1 if n == 'seconds_to_target' else 3)}"
            f"<br>{shown}</td>"
        )

    rows = []
    for arm, a in arms.items():
        base = " <span class=tag>baseline</span>" if arm == sw["baseline"] else ""
        cells = "".join(cell(a, n) for n in names)
        reached = a["metrics"]["tokens_to_target"]["seeds_reached"]
        rows.append(
            f"<tr><th class=arm>{H.escape(arm)}{base}<div class=desc>{H.escape(a.get('description') or '')}</div>"
            f"<div class=desc>seeds reaching target on their own: {reached}/{len(a['runs'])}</div></th>{cells}</tr>"
        )
    run_rows = []
    for arm, a in arms.items():
        for seed, r in a["runs"].items():
            warn = " class=warn" if r["stopped_by"] != "budget" else ""
            run_rows.append(
                f"<tr><td>{H.escape(arm)}</td><td>{H.escape(seed)}</td><td>{_num(r['steps'])}</td>"
                f"<td{warn}>{H.escape(r['stopped_by'])}</td><td>{_num(r['generated_tokens'])}</td>"
                f"<td>{_num(r['rollouts'])}</td><td>{_num(r['train_s'], 1)}</td>"
                f"<td>{_num(r['wall_s'], 1)}</td><td>{_num(r['final_pass@1'])}</td>"
                f"<td><code>{H.escape(r['dir'])}</code></td></tr>"
            )
    cfgs = "".join(
        f"<details><summary>{H.escape(arm)} <code>{H.escape(json.dumps(arms[arm]['set']))}</code></summary>"
        f"<pre>{H.escape(text)}</pre></details>"
        for arm, text in configs.items()
    )
    m, g = compare["machine"], compare.get("git") or {}
    machine = (
        f"{m.get('cpu')}, {m.get('cores')} cores, torch {m.get('torch')} (threads: {m.get('torch_threads')})"
        + (f", GPU {m['gpu']}" if m.get("gpu") else "")
        + f"; {m.get('platform')}"
    )
    ci = compare["ci"]
    budget = ", ".join(f"{v:,} {k.replace('_', ' ')}" for k, v in sw["budget"].items())
    img = base64.b64encode(png).decode("ascii")
    short = any(r["stopped_by"] != "budget" for a in arms.values() for r in a["runs"].values())
    warnings = "".join(
        f"<p class=warn><strong>warning:</strong> {H.escape(w)}</p>" for w in compare.get("warnings", [])
    )
    steps_note = (
        "<p class=warn>Some runs stopped at train.steps before spending the budget: their arms did not get an equal "
        "budget (raise train.steps).</p>"
        if short
        else ""
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>rollwise compare: {H.escape(sw["name"])}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 75em; padding: 0 1em; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; font-size: 0.92em; }}
th, td {{ border: 1px solid #ccc; padding: 0.35em 0.6em; text-align: right; vertical-align: top; }}
th.arm, td:first-child {{ text-align: left; }}
thead th {{ background: #f3f3f3; }}
.ci {{ color: #777; font-size: 0.85em; white-space: nowrap; }} \
.desc {{ color: #666; font-weight: normal; font-size: 0.8em; }}
.better {{ color: #17803d; }} .worse {{ color: #b42318; }} .same {{ color: #555; }}
.tag {{ background: #e8eefc; color: #2a4a9a; border-radius: 3px; padding: 0 0.3em; font-size: 0.75em; \
font-weight: normal; }}
.warn {{ color: #b54708; }} pre {{ background: #f7f7f7; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }}
img {{ max-width: 100%; border: 1px solid #ddd; }} \
dl {{ display: grid; grid-template-columns: max-content auto; gap: 0.2em 1em; }}
dt {{ font-weight: 600; }} dd {{ margin: 0; }}
</style></head><body>
<h1>rollwise compare: {H.escape(sw["name"])}</h1>
{warnings}
<dl>
<dt>arms</dt><dd>{", ".join(H.escape(a) for a in arms)} (baseline: {H.escape(sw["baseline"])})</dd>
<dt>seeds</dt><dd>{", ".join(str(s) for s in sw["seeds"])}</dd>
<dt>budget per run</dt><dd>{budget}</dd>
<dt>target pass@1</dt><dd>{_target(compare["target"])}</dd>
<dt>AUC range</dt><dd>0 – {compare["auc_tokens"]:,.0f} generated tokens</dd>
<dt>intervals</dt><dd>{int(ci["level"] * 100)}% {H.escape(ci["method"])}, {ci["resamples"]} resamples, \
RNG seed {ci["rng_seed"]}</dd>
<dt>machine</dt><dd>{H.escape(machine)}</dd>
<dt>git</dt><dd>{H.escape(g.get("commit") or "unknown")}{" (with uncommitted changes)" if g.get("dirty") else ""}</dd>
<dt>created</dt><dd>{H.escape(compare["created"])}</dd>
</dl>
<h2>Held-out pass@1 against generated tokens</h2>
<img alt="held-out pass@1 against training generated tokens, per arm" src="data:image/png;base64,{img}">
<h2>Per arm</h2>
<p>Value with its interval in brackets, and the ratio to the baseline below: green “better” or red “worse” only where
the arm's interval and the baseline's do not overlap; where they overlap the data do not tell the two apart. \
To-target figures are where
the arm's mean curve first reaches the target (linear between eval points); “not reached” means within this budget.
Seconds are compared only between runs that had the machine to themselves: where runs ran at the same time they are
marked “{H.escape(CONFOUNDED)}”.</p>
<table><thead><tr><th class=arm>arm</th>{head}</tr></thead><tbody>
{"".join(rows)}
</tbody></table>
{_paired_section(compare)}
<h2>Runs</h2>{steps_note}
<table><thead><tr><th>arm</th><th>seed</th><th>steps</th><th>stopped by</th><th>generated tokens</th><th>rollouts</th>
<th>train s</th><th>wall s</th><th>final pass@1</th><th>directory</th></tr></thead><tbody>
{"".join(run_rows)}
</tbody></table>
<h2>Resolved configs</h2>
<p>Seed {sw["seeds"][0]} of each arm; other seeds differ only in run.seed and run.name.</p>
{cfgs}
</body></html>
"""


def _target(t: dict) -> str:
    """The target's number, the rule that fixed it and how many baseline seeds reach it (a
    compare.json written before issue #43 has the number and its source only)."""
    text = f"{t['value']:.4f}"
    if t.get("rule"):
        text += f" (rule {H.escape(t['rule'])}: {H.escape(t['source'])})"
    else:
        text += f" ({H.escape(t['source'])})"
    if t.get("baseline_seeds_reached"):
        text += f"; baseline seeds reaching it: {H.escape(t['baseline_seeds_reached'])}"
    return text


def _paired_section(compare: dict) -> str:
    rows = paired_rows(compare)
    if not rows:
        return ""
    p = compare.get("paired") or {}
    return f"""<h2>Paired by seed: tokens to target</h2>
<p>Arms that share a seed share its warm start, held-out set and prompt stream, so each seed gives a ratio: the
<b>saving</b> = the baseline's tokens to target ÷ the arm's, each from that seed's own curve (×2.00: the arm needs
half the tokens). The arm's figure is the geometric mean over seeds, with a {int(compare["ci"]["level"] * 100)}%
{H.escape(p.get("method", "percentile bootstrap over seeds resampled jointly"))}. {H.escape(p.get("censoring", ""))}.
Per seed, ≤ marks a seed the arm never reached (an upper bound), ≥ one the baseline never reached (a lower bound), ? one
neither reached.</p>
<table><thead><tr><th class=arm>arm</th><th>saving against {H.escape(compare["sweep"]["baseline"])} [interval]</th>
<th>censored seeds</th><th>per seed</th></tr></thead><tbody>
{rows}
</tbody></table>"""


def run_configs(out_dir: Path, compare: dict) -> dict[str, str]:
    """Each arm's resolved config, read back from its first seed's run directory (the directory
    compare.json names, else the one of that name under ``out_dir``); a run directory that is not
    here (committed results keep compare.json only) gives a line saying so."""
    seed = str(compare["sweep"]["seeds"][0])
    out = {}
    for arm, a in compare["arms"].items():
        run_dir = Path(a["runs"][seed]["dir"])
        found = [
            d / "config.resolved.toml"
            for d in (run_dir, Path(out_dir) / run_dir.name)
            if (d / "config.resolved.toml").is_file()
        ]
        missing = f"(not shown: {run_dir.as_posix()}/config.resolved.toml is not here)"
        out[arm] = found[0].read_text() if found else missing
    return out


def redraw(out_dir: Path) -> list[Path]:
    """``rollwise report DIR``: the plot and ``report.html`` again from ``DIR/compare.json`` (no run
    is trained or read besides its resolved config); returns the paths written."""
    from rollwise.registry import UserError

    out_dir = Path(out_dir)
    path = out_dir / "compare.json"
    if not path.is_file():
        raise UserError(f"{path} not found (rollwise compare writes it)")
    compare = json.loads(path.read_text())
    return write(out_dir, compare, run_configs(out_dir, compare))


def write(out_dir: Path, compare: dict, configs: dict[str, str]) -> list[Path]:
    out_dir = Path(out_dir)
    png = plot(compare, out_dir / PLOT)
    page = out_dir / REPORT
    page.write_text(html(compare, png.read_bytes(), configs), encoding="utf-8")
    return [png, page]
