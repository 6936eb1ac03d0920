"""How good a pass-rate prediction is: Brier score, AUC and a calibration curve.

- Brier score: ``mean((p_hat - p_obs)^2)`` over prompts, with ``p_obs`` the observed group pass rate
  (0 is perfect; always predicting 0.5 on 0/1 outcomes scores 0.25).
- AUC of "this group will be zero-variance": the score is the predicted probability that ``n``
  Bernoulli(``p_hat``) rollouts all agree, ``p^n + (1 - p)^n`` (``rollwise.outcomes.degenerate_prob``); the label is
  whether the observed group's rewards were all equal. AUC is the Mann-Whitney probability that a
  degenerate group scores above a mixed one (ties count one half); undefined (None) when either
  class is empty.
- Calibration: prompts binned by prediction; each bin's mean prediction against its mean observed
  pass rate (:func:`calibration`), drawn by :func:`plot_calibration`.
"""

from __future__ import annotations

from collections.abc import Sequence

from rollwise.outcomes import degenerate_prob


def brier(pred: Sequence[float], observed: Sequence[float]) -> float:
    """Mean squared error of predicted vs observed pass rates.
    Example: pred (0.5, 1.0), observed (1.0, 1.0) -> (0.25 + 0) / 2 = 0.125."""
    if len(pred) != len(observed) or not pred:
        raise ValueError(f"brier needs two equal, non-empty sequences, got {len(pred)} and {len(observed)}")
    return sum((p - o) ** 2 for p, o in zip(pred, observed)) / len(pred)


def auc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """Mann-Whitney AUC: P(score of a positive > score of a negative), ties 1/2; None without both classes.
    Example: scores (0.9, 0.2, 0.6), labels (T, F, F) -> positives beat both negatives -> 1.0."""
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    if not pos or not neg:
        return None
    wins = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in pos for b in neg)
    return wins / (len(pos) * len(neg))


def calibration(pred: Sequence[float], observed: Sequence[float], bins: int = 10) -> list[dict]:
    """Equal-width bins of the prediction in [0, 1]: ``{"lo", "hi", "count", "pred_mean", "obs_mean"}``
    for every non-empty bin (a prediction of exactly 1.0 goes in the last bin)."""
    out = []
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        idx = [i for i, p in enumerate(pred) if lo <= p < hi or (b == bins - 1 and p == 1.0)]
        if idx:
            out.append(
                {
                    "lo": lo,
                    "hi": hi,
                    "count": len(idx),
                    "pred_mean": sum(pred[i] for i in idx) / len(idx),
                    "obs_mean": sum(observed[i] for i in idx) / len(idx),
                }
            )
    return out


def summary(pred: Sequence[float], observed: Sequence[float], degenerate: Sequence[bool], sizes: Sequence[int]) -> dict:
    """``value/brier``, ``value/auc_degenerate`` (None without both classes), ``value/pred_mean``,
    ``value/obs_mean``, ``value/prompts`` for one evaluation of the predictor."""
    scores = [degenerate_prob(p, n) for p, n in zip(pred, sizes)]
    return {
        "value/brier": brier(pred, observed),
        "value/auc_degenerate": auc(scores, degenerate),
        "value/pred_mean": sum(pred) / len(pred),
        "value/obs_mean": sum(observed) / len(observed),
        "value/prompts": len(pred),
    }


def plot_calibration(curves: dict[str, list[dict]], path) -> None:
    """Predicted vs observed pass rate, one line per label (e.g. the evaluation step), with the
    diagonal; written to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    ax.plot([0, 1], [0, 1], color="0.7", lw=1, ls="--", label="perfect")
    for label, bins in curves.items():
        ax.plot([b["pred_mean"] for b in bins], [b["obs_mean"] for b in bins], marker="o", ms=3, label=label)
    ax.set(
        xlim=(0, 1),
        ylim=(0, 1),
        xlabel="predicted pass rate",
        ylabel="observed pass rate",
        title="pass-rate predictor calibration (held-out)",
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
