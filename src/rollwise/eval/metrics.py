"""Held-out accuracy estimators.

``pass_at_k(n, c, k)``: the unbiased estimator of Chen et al. 2021 (arXiv 2107.03374, Codex):
the probability that at least one of k samples drawn without replacement from n samples, c of
them correct, is correct: ``1 - C(n-c, k) / C(n, k)``.

``maj_at_k(answers, correct, k)``: majority vote over the first k samples' extracted answers
(ties broken by first appearance); 1.0 when the winning answer is a correct one. Samples
that could not be verified do not vote.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import comb

from rollwise.outcomes import majority_answer


def pass_at_k(n: int, c: int, k: int) -> float:
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n} c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def maj_at_k(answers: Sequence[str | None], correct: Sequence[bool | None], k: int) -> float:
    votes = [(a, ok) for a, ok in zip(answers[:k], correct[:k]) if a is not None and ok is not None]
    if not votes:
        return 0.0
    winner = majority_answer([a for a, _ in votes])
    return 1.0 if any(ok for a, ok in votes if a == winner) else 0.0
