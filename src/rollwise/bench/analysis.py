"""The numbers of ``compare.json``: pure functions of eval curves (no files, no models).

A run's curve is its ``eval.jsonl`` points (x, pass@1), x being cumulative training generated
tokens (or training wall seconds), read as piecewise linear between points and flat after the
last one (the run's final model is what it has once it stops). Conventions:

- **to target** (``crossing``): the first x where the piecewise-linear curve reaches the target,
  interpolated linearly between the two eval points around the crossing; ``None`` if it never
  does (reported as such, never as a number).
- **AUC** (``auc``): trapezoid area under pass@1 over [0, x_max], divided by x_max (the budget),
  so it is the mean held-out pass@1 over the budget, in [0, 1]; a curve past x_max is cut there
  (interpolated), one that ends before is extended flat.
- **mean curve** (``mean_curve``): the seeds' curves on a common grid (the union of their x
  values), averaged; because every seed is piecewise linear on that grid, the mean curve is
  exactly the mean of the seeds' curves. Its band is the min and max over seeds.
- **target** (``target_rule``, ``resolve_target``): fixed in the sweep file before anything
  runs, as an absolute held-out pass@1 (``target = 0.4``) or as a fraction of the baseline's
  gain (``target = "gain:0.75"``: start + 0.75 × (final − start) of the baseline arm's mean
  curve). The default is ``gain:0.75`` (issue #43): the old default, the baseline's final mean
  pass@1 (``gain:1``), sits at the very end of the baseline's own curve, which it reaches in some
  seeds and not in others, so the baseline's to-target interval was open at the top by
  construction. compare.json records the rule, its inputs and the resulting number, and warns
  when the baseline reaches the target in fewer than all of its seeds.
- **arm value and CI**: to-target figures are the crossing of the arm's mean curve; AUC and
  final pass@k are seed means. Confidence intervals are percentile bootstraps over seeds (the
  same statistic on seeds resampled with replacement) with a fixed ``numpy`` RNG seed, so they
  are deterministic; a resample whose mean curve never reaches the target counts as infinitely
  many tokens, and an infinite bound is reported as ``None``.
- **paired by seed** (``paired_saving``): arms that share a seed share its warm start, held-out
  set and prompt stream (``bench.sweep.plan`` refuses arms that differ in what fixes them), so
  each seed gives a ratio, the **saving** s = baseline's tokens to target ÷ the arm's (> 1: the
  arm needs fewer tokens), from each seed's own curve. The arm's figure is the geometric mean
  of the seeds' savings (the mean of ratios that treats 2× and 1/2× alike), with a percentile
  bootstrap that resamples seeds jointly (the same draws for the arm and the baseline; same RNG
  as the unpaired intervals). A seed that never reaches the target is **censored**: its tokens
  to target are at least the tokens it spent (its curve's last x). The point value takes a
  censored count at that lower bound (so that seed's saving is an upper bound when the arm is
  censored, a lower bound when the baseline is, and unknown when both are); the interval takes
  every censored count at its worst for the arm for the lower end (the arm's at +inf, saving
  0; the baseline's at the tokens it spent) and at its best for the upper end (the arm's at the
  tokens it spent; the baseline's at +inf), so it contains the interval of the uncensored data
  whatever those would have been; a bound at +inf is reported as None.
- **separation**: an arm differs from the baseline on a figure only when their intervals do not
  overlap (``separation``: +1 wholly above, -1 wholly below, 0 overlapping); the report colours a
  ratio and calls it better or worse only then.
- **wall clock shared**: seconds are comparable only between runs that had the machine to
  themselves. ``shared_machine`` finds runs whose recorded wall-clock intervals overlap (or that
  were trained several at a time, ``jobs`` > 1); then every wall-clock figure is ``confounded``:
  no ratio, no separation, never called faster or slower.
- **warnings**: every warning about the comparison is made here, once, in ``warnings``; the
  terminal, ``compare.json`` and ``report.html`` show that list.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

X_TOKENS = "cost/generated_tokens"
PASS1 = "eval/pass@1"
WALL_CLOCK = ("seconds_to_target",)  # figures measured in wall-clock seconds
CONFOUNDED = "confounded (runs shared the machine)"
EPS = 1e-9  # crossing tolerance: a mean of seeds' finals equals the default target up to rounding

BOOTSTRAP = {"method": "percentile bootstrap over seeds", "resamples": 2000, "level": 0.95, "rng_seed": 0}
DEFAULT_TARGET = "gain:0.75"  # see the module docstring: a target the baseline reaches inside its curve
PAIRED = {
    "statistic": "geometric mean over seeds of the saving: baseline's tokens to target / the arm's",
    "method": "percentile bootstrap over seeds resampled jointly for the arm and the baseline",
    "censoring": "a seed that never reaches the target needs at least the tokens it spent: the value takes that "
    "bound, the interval's lower end every censored count at its worst for the arm, its upper end at its best",
}


# ---------------------------------------------------------------- curves of one run


def curve(evals: Sequence[dict], y_key: str = PASS1, x: str = "tokens") -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of a run's eval lines, ordered by step; ``x='tokens'`` (training generated tokens)
    or ``'seconds'`` (``train_seconds``). Repeated x values keep the last point."""
    lines = sorted(evals, key=lambda e: e["step"])
    xs = [float(e[X_TOKENS]) for e in lines] if x == "tokens" else train_seconds(lines)
    pts: dict[float, float] = {}
    for xv, e in zip(xs, lines):
        pts[xv] = float(e[y_key])
    order = sorted(pts)
    return np.array(order, dtype=float), np.array([pts[k] for k in order], dtype=float)


def train_seconds(evals: Sequence[dict]) -> list[float]:
    """Training wall seconds at each eval line (ordered by step): its cumulative ``wall_s`` minus
    the time of this and every earlier evaluation (``time/eval_s``; older runs: ``eval/time_s``),
    so evaluation is not charged, and minus the set-up time before a step-0 evaluation, so the
    curve starts at 0 s like the tokens (the warm start is not in ``wall_s`` either)."""
    out, spent = [], 0.0
    for e in evals:
        spent += float(e.get("time/eval_s", e.get("eval/time_s", 0.0)))
        out.append(float(e["wall_s"]) - spent)
    start = out[0] if evals and evals[0]["step"] == 0 else 0.0
    return [max(0.0, v - start) for v in out]


def crossing(x: np.ndarray, y: np.ndarray, target: float) -> float | None:
    """First x where the piecewise-linear curve reaches ``target``, else None.

    (0, 0.2), (100, 0.6), target 0.5: 0 + (0.5 - 0.2) / (0.6 - 0.2) * 100 = 75.0."""
    for i in range(len(x)):
        if y[i] >= target - EPS:
            if i == 0 or y[i] - y[i - 1] <= 0:
                return float(x[i])
            frac = min(1.0, max(0.0, (target - y[i - 1]) / (y[i] - y[i - 1])))
            return float(x[i - 1] + frac * (x[i] - x[i - 1]))
    return None


def auc(x: np.ndarray, y: np.ndarray, x_max: float) -> float:
    """Mean of the curve over [0, x_max] (trapezoid area / x_max); see the module docstring."""
    if x_max <= 0:
        raise ValueError(f"x_max must be > 0, got {x_max}")
    if len(x) == 0:
        raise ValueError("empty curve")
    grid = np.unique(np.concatenate([x[x < x_max], [x_max]]))
    if grid[0] > 0:  # no point at 0: the first value holds from 0 (plan() requires an eval at step 0)
        grid = np.concatenate([[0.0], grid])
    vals = np.interp(grid, x, y)  # flat outside [x[0], x[-1]]
    area = float(np.sum((grid[1:] - grid[:-1]) * (vals[1:] + vals[:-1]) / 2.0))
    return area / x_max


# ---------------------------------------------------------------- several seeds


def on_grid(curves: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """(grid, values[seed, grid]) with grid the union of the curves' x values."""
    grid = np.unique(np.concatenate([c[0] for c in curves]))
    return grid, np.stack([np.interp(grid, cx, cy) for cx, cy in curves])


def mean_curve(curves: Sequence[tuple[np.ndarray, np.ndarray]]) -> dict[str, list[float]]:
    grid, vals = on_grid(curves)
    return {
        "x": grid.tolist(),
        "mean": vals.mean(axis=0).tolist(),
        "lo": vals.min(axis=0).tolist(),
        "hi": vals.max(axis=0).tolist(),
    }


def bootstrap_ci(
    n: int,
    stat: Callable[[np.ndarray], float | None],
    resamples: int = BOOTSTRAP["resamples"],
    level: float = BOOTSTRAP["level"],
    seed: int = BOOTSTRAP["rng_seed"],
) -> list[float | None]:
    """[lo, hi] percentile interval of ``stat(indices)`` over ``resamples`` draws of n seed indices
    with replacement (``numpy.random.default_rng(seed)``). ``stat`` returning None counts as +inf;
    an infinite bound comes back as None. Order statistics, no interpolation:
    lo = sorted[floor(a/2 * (B-1))], hi = sorted[ceil((1-a/2) * (B-1))] with a = 1 - level."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n, size=(resamples, n))
    vals = [stat(row) for row in draws]
    s = np.sort(np.array([math.inf if v is None else float(v) for v in vals]))
    a = 1.0 - level
    lo, hi = s[math.floor(a / 2 * (resamples - 1))], s[math.ceil((1 - a / 2) * (resamples - 1))]
    return [None if math.isinf(v) else float(v) for v in (lo, hi)]


def mean_stat(values: Sequence[float]) -> dict:
    """A seed-mean figure: value, per-seed values (aligned with the seeds given by the caller) and CI."""
    arr = np.array(values, dtype=float)
    return {
        "value": float(arr.mean()),
        "per_seed": [float(v) for v in arr],
        "ci": bootstrap_ci(len(arr), lambda idx: float(arr[idx].mean())),
    }


def to_target_stat(curves: Sequence[tuple[np.ndarray, np.ndarray]], target: float) -> dict:
    """To-target figure: crossing of the mean curve, each seed's own crossing, bootstrap CI."""
    grid, vals = on_grid(curves)
    per_seed = [crossing(cx, cy, target) for cx, cy in curves]
    return {
        "value": crossing(grid, vals.mean(axis=0), target),
        "per_seed": per_seed,
        "seeds_reached": sum(v is not None for v in per_seed),
        "ci": bootstrap_ci(len(curves), lambda idx: crossing(grid, vals[idx].mean(axis=0), target)),
    }


# ---------------------------------------------------------------- the target, fixed in advance


def target_rule(value) -> tuple[str, float]:
    """``("absolute", v)`` for a held-out pass@1 in [0, 1], ``("gain", f)`` for ``"gain:f"`` with
    0 < f <= 1; anything else raises ValueError saying what is accepted (the sweep file's ``target``
    is read through this, so a bad value is refused when the sweep loads)."""
    if isinstance(value, bool):
        raise ValueError("target must be a pass@1 in [0, 1] or 'gain:F' with 0 < F <= 1")
    if isinstance(value, (int, float)):
        if not 0.0 <= float(value) <= 1.0:
            raise ValueError("an absolute target is a held-out pass@1 in [0, 1]")
        return "absolute", float(value)
    if isinstance(value, str) and value.strip().startswith("gain:"):
        text = value.strip()[len("gain:") :]
        try:
            f = float(text)
        except ValueError:
            f = math.nan
        if not 0.0 < f <= 1.0:  # nan fails too
            raise ValueError("'gain:F' takes a fraction 0 < F <= 1 of the baseline's gain (e.g. 'gain:0.75')")
        return "gain", f
    raise ValueError(
        "target must be a held-out pass@1 in [0, 1] (e.g. 0.4) or 'gain:F', a fraction 0 < F <= 1 of the "
        "baseline's gain (e.g. 'gain:0.75')"
    )


def resolve_target(value, baseline_curves: Sequence[tuple[np.ndarray, np.ndarray]], baseline: str) -> dict:
    """The target's number and how it was obtained: {"value", "rule", "source"} and, for a gain
    rule, "fraction", "baseline_start" and "baseline_final" (the baseline's mean curve at its
    first and last point): value = start + fraction × (final − start).

    Baseline mean curve 0.60 → 0.70, "gain:0.75": 0.60 + 0.75 × 0.10 = 0.675."""
    kind, number = target_rule(value)
    if kind == "absolute":
        return {"value": number, "rule": f"absolute {number:g}", "source": "sweep file (absolute)"}
    mean = mean_curve(baseline_curves)["mean"]
    start, final = mean[0], mean[-1]
    return {
        "value": float(start + number * (final - start)),
        "rule": f"gain:{number:g}",
        "source": f"start + {number:g} x (final - start) of the mean curve of baseline arm {baseline!r} "
        f"({start:.4f} + {number:g} x ({final:.4f} - {start:.4f}))",
        "fraction": number,
        "baseline_start": float(start),
        "baseline_final": float(final),
    }


# ---------------------------------------------------------------- paired seeds


def geometric_mean(values: Sequence[float]) -> float:
    """exp(mean(log v)); 0 if any value is 0, +inf if any is +inf (never both: see paired_saving)."""
    arr = np.asarray(values, dtype=float)
    if (arr == 0).any():
        return 0.0
    if np.isinf(arr).any():
        return math.inf
    return float(np.exp(np.log(arr).mean()))


def paired_saving(
    arm: Sequence[float | None],
    base: Sequence[float | None],
    arm_spent: Sequence[float],
    base_spent: Sequence[float],
) -> dict:
    """The paired figure of one arm against the baseline from each seed's tokens to target (None:
    never reached; ``*_spent``: the tokens that seed's run spent, the lower bound of a None), seeds
    aligned. Returns {"value", "per_seed": [{"saving", "bound"}], "censored", "ci"} where bound is
    "exact", "at most" (the arm never reached the target), "at least" (the baseline never did) or
    "unknown" (neither did; saving None). See the module docstring for the censoring rule.

    Baseline 100, 200, 300 and arm 50, 100, 100 tokens: savings 2, 2, 3, value (2·2·3)^(1/3) = 2.289."""
    if not (len(arm) == len(base) == len(arm_spent) == len(base_spent)) or not arm:
        raise ValueError("paired_saving needs the same seeds, at least one, for the arm and the baseline")
    point, worst, best, per_seed = [], [], [], []
    for a, b, sa, sb in zip(arm, base, arm_spent, base_spent):
        a_lo = float(sa) if a is None else float(a)  # the fewest tokens the arm can need
        b_lo = float(sb) if b is None else float(b)
        a_hi = math.inf if a is None else float(a)  # the most
        b_hi = math.inf if b is None else float(b)
        bound = {(False, False): "exact", (True, False): "at most", (False, True): "at least"}.get(
            (a is None, b is None), "unknown"
        )
        value = _saving(b_lo, a_lo)
        point.append(value)
        worst.append(0.0 if math.isinf(a_hi) else _saving(b_lo, a_hi))
        best.append(math.inf if math.isinf(b_hi) else _saving(b_hi, a_lo))
        per_seed.append({"saving": None if bound == "unknown" else value, "bound": bound})
    w, bst = np.array(worst), np.array(best)
    lo = bootstrap_ci(len(w), lambda idx: geometric_mean(w[idx]))[0]
    hi = bootstrap_ci(len(bst), lambda idx: _finite_or_none(geometric_mean(bst[idx])))[1]
    v = geometric_mean(point)
    return {
        "value": _finite_or_none(v),
        "per_seed": per_seed,
        "censored": sum(p["bound"] != "exact" for p in per_seed),
        "ci": [lo, hi],
    }


def _saving(base: float, arm: float) -> float:
    """base / arm tokens; an arm at the target from the start (0 tokens) saves everything (+inf),
    unless the baseline is there too (1: the same)."""
    if arm > 0:
        return base / arm
    return 1.0 if base == 0 else math.inf


def _finite_or_none(v: float) -> float | None:
    return None if math.isinf(v) else float(v)


def paired_separation(fig: dict) -> int:
    """+1 when the paired saving's interval lies wholly above 1 (the arm needs fewer tokens than the
    baseline in the seeds' joint resamples), -1 wholly below 1, else 0. A None upper bound is +inf."""
    lo, hi = fig["ci"]
    hi = math.inf if hi is None else hi
    return 1 if lo is not None and lo > 1.0 else -1 if hi < 1.0 else 0


def separation(a: dict, b: dict) -> int:
    """Whether figure ``a``'s interval lies wholly above (+1) or below (-1) figure ``b``'s, else 0
    (they overlap: the data do not say which is larger). A ``None`` bound is +inf (a to-target
    resample that never reaches the target)."""
    (alo, ahi), (blo, bhi) = ([math.inf if v is None else v for v in f["ci"]] for f in (a, b))
    return 1 if alo > bhi else -1 if ahi < blo else 0


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing or b is 0."""
    if a is None or b is None or b == 0:
        return None
    return float(a) / float(b)


def _paired(arm: dict, base: dict) -> dict:
    """``paired_saving`` of one arm's seeds against the baseline's same seeds (the seeds both ran)."""
    a_fig, b_fig = arm["metrics"]["tokens_to_target"], base["metrics"]["tokens_to_target"]
    seeds = [s for s in a_fig["per_seed"] if s in b_fig["per_seed"]]
    a, b = [a_fig["per_seed"][s] for s in seeds], [b_fig["per_seed"][s] for s in seeds]
    fig = paired_saving(a, b, [arm["spent"][s] for s in seeds], [base["spent"][s] for s in seeds])
    fig["per_seed"] = {
        s: {**p, "arm": ta, "baseline": tb, "arm_spent": arm["spent"][s], "baseline_spent": base["spent"][s]}
        for s, p, ta, tb in zip(seeds, fig["per_seed"], a, b)
    }
    fig["separation"] = paired_separation(fig)
    return fig


# ---------------------------------------------------------------- runs sharing the machine


def shared_machine(sessions: dict[str, dict]) -> str | None:
    """Why the runs' wall-clock seconds are not comparable, or None if no two runs shared the machine.

    ``sessions[run] = {"start", "end"}`` (unix seconds of the training session that finished the
    run; None where unknown) and optionally ``"jobs"`` (how many runs its compare trained at once).
    Two runs share the machine when their intervals overlap, or when one was trained with other
    runs at once (jobs > 1). Runs whose interval is unknown are not checked."""
    names = sorted(sessions)
    multi = [n for n in names if (sessions[n].get("jobs") or 1) > 1]
    if multi:
        return (
            f"{len(multi)} run{'s' * (len(multi) != 1)} trained several at a time (jobs > 1): {', '.join(multi[:4])}"
            + (", ..." if len(multi) > 4 else "")
        )
    known = sorted(
        (sessions[n]["start"], sessions[n]["end"], n)
        for n in names
        if sessions[n].get("start") is not None and sessions[n].get("end") is not None
    )
    for (_s0, e0, a), (s1, _e1, b) in zip(known, known[1:]):
        if s1 < e0:  # sorted by start: if runs i < j overlap, so do i and i + 1 (s[i+1] <= s[j] < e[i])
            return f"runs {a} and {b} ran at the same time"
    return None


# ---------------------------------------------------------------- the whole comparison


def analyse(
    evals: dict[str, dict[int, list[dict]]],
    baseline: str,
    auc_x_max: float,
    ks: Sequence[int],
    target: float | str = DEFAULT_TARGET,
    shared: str | None = None,
) -> dict:
    """Per-arm figures of a sweep from each run's eval lines (``evals[arm][seed]``).

    ``target``: the sweep file's rule (``target_rule``: a pass@1, or ``"gain:F"`` of the baseline's
    mean curve). Returns {"target": {"value", "rule", "source", ("fraction", "baseline_start",
    "baseline_final" for a gain rule), "baseline_seeds_reached", "reached_at_start_by_every_arm"},
    "auc_tokens": auc_x_max,
    "wall_clock": {"confounded", "reason"}, "warnings": [str], "arms": {arm: {"seeds",
    "metrics": {name: {"value", "per_seed", "ci", ...}}, "ratios": {name: arm / baseline},
    "separation": {name: +1 / -1 / 0} (``separation`` of the arm's and the baseline's intervals),
    "confounded": {name: CONFOUNDED} (wall-clock figures when ``shared``: their ratio and separation
    are None), "paired": {"tokens_to_target": ``paired_saving``'s figure with "per_seed" keyed by seed
    ({"saving", "bound", "arm", "baseline"}: the two tokens to target) and "separation"
    (``paired_separation``); {} for the baseline itself}, "curve": {"x", "mean", "lo", "hi"}}}} with
    metric names ``tokens_to_target``,
    ``seconds_to_target``, ``auc``, ``final_pass@1`` and ``final_pass@<k>`` for each k.
    ``shared`` is ``shared_machine``'s answer for the runs (None: each run had the machine to itself).
    """
    tok = {arm: [curve(runs[s]) for s in sorted(runs)] for arm, runs in evals.items()}
    sec = {arm: [curve(runs[s], x="seconds") for s in sorted(runs)] for arm, runs in evals.items()}
    rule = resolve_target(target, tok[baseline], baseline)
    target = rule["value"]
    arms: dict[str, dict] = {}
    for arm, runs in evals.items():
        seeds = sorted(runs)
        finals = [sorted(runs[s], key=lambda e: e["step"])[-1] for s in seeds]
        m = {
            "tokens_to_target": to_target_stat(tok[arm], target),
            "seconds_to_target": to_target_stat(sec[arm], target),
            "auc": mean_stat([auc(cx, cy, auc_x_max) for cx, cy in tok[arm]]),
        }
        for k in sorted({1, *ks}):
            m[f"final_pass@{k}"] = mean_stat([f[f"eval/pass@{k}"] for f in finals])
        for fig in m.values():
            fig["per_seed"] = {str(s): v for s, v in zip(seeds, fig["per_seed"])}
        spent = {str(s): float(cx[-1]) for s, (cx, _cy) in zip(seeds, tok[arm])}  # a censored count's lower bound
        arms[arm] = {"seeds": seeds, "metrics": m, "curve": mean_curve(tok[arm]), "spent": spent}
    for a in arms.values():
        base = arms[baseline]["metrics"]
        a["ratios"] = {name: ratio(fig["value"], base[name]["value"]) for name, fig in a["metrics"].items()}
        a["separation"] = {name: separation(fig, base[name]) for name, fig in a["metrics"].items()}
        a["confounded"] = {}
        a["paired"] = {} if a is arms[baseline] else {"tokens_to_target": _paired(a, arms[baseline])}
        if shared:
            for name in WALL_CLOCK:
                a["ratios"][name] = a["separation"][name] = None
                a["confounded"][name] = CONFOUNDED
    warnings = []
    at_start = all(a["metrics"]["tokens_to_target"]["value"] == 0 for a in arms.values())
    if at_start:
        warnings.append(
            f"target reached at step 0 by every arm: choose a higher target (every arm's first evaluation, "
            f"before training, already has pass@1 >= {target:.3f}, so tokens to target compares nothing)"
        )
    elif arms[baseline]["metrics"]["tokens_to_target"]["value"] == 0:
        warnings.append(
            f"the baseline {baseline!r} reaches the target pass@1 {target:.3f} at 0 generated tokens (at its "
            "first evaluation, before training): nothing was learned, so tokens to target compares nothing; "
            "raise the budget or set a higher target"
        )
    base_fig = arms[baseline]["metrics"]["tokens_to_target"]
    n_base = len(base_fig["per_seed"])
    if base_fig["seeds_reached"] < n_base:
        warnings.append(
            f"the baseline {baseline!r} reaches the target {target:.3f} in {base_fig['seeds_reached']} of {n_base} "
            "seeds (each seed's own curve): the seeds that do not reach it give censored paired savings (bounds, "
            "not values) and can leave tokens-to-target intervals open at the top; a target the baseline reaches "
            "in every seed (a smaller gain fraction, or a larger budget) compares more"
        )
    if shared:
        warnings.append(
            f"wall-clock figures are {CONFOUNDED}: {shared}; seconds are compared only between runs that had "
            "the machine to themselves (train with jobs = 1 and nothing else running)"
        )
    return {
        "target": {
            **rule,
            "value": float(target),
            "baseline_seeds_reached": f"{base_fig['seeds_reached']}/{n_base}",
            "reached_at_start_by_every_arm": at_start,
        },
        "auc_tokens": float(auc_x_max),
        "wall_clock": {"confounded": bool(shared), "reason": shared},
        "warnings": warnings,
        "arms": arms,
    }
