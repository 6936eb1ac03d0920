"""What a group's outcomes say, written once on the ground floor (docs/architecture.md §4) for the
stages that read them: the majority answer (evaluation's maj@k, TTRL's pseudo-label) and the chance
that a group's rollouts all agree (the controllers that skip zero-variance prompts, the value
predictor's calibration)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence


def majority_answer(answers: Sequence[str | None]) -> str | None:
    """The most frequent non-None answer, ties broken by first appearance; None if there is none
    (maj@k, ``rollwise.eval.metrics``; TTRL's pseudo-label, ``rollwise.reward.ttrl``). ["5", "3", "3", "5"] -> "5"."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    best = max(counts.values())
    return next(a for a in answers if a is not None and counts[a] == best)


def degenerate_prob(p: float, n: int) -> float:
    """Probability that ``n`` Bernoulli(``p``) rollouts all agree: ``p^n + (1-p)^n``
    (p 0.5, n 4 -> 0.125; p 0.9, n 2 -> 0.82): the chance that a group is zero-variance
    (GRESO's and WISE2's skip probabilities, ``control/greso.py``, ``control/wise2.py``; the value
    predictor's AUC, ``rollwise.value.metrics``)."""
    return p**n + (1.0 - p) ** n
