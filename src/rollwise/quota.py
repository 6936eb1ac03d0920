"""Largest-remainder apportionment: whole counts in given proportions that sum exactly to a total
(the step budget's scaled plans, CURES' rollout quotas, ``task.train_mix``'s prompt counts)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def proportional_quota(total: int, weights: Sequence[float]) -> list[int]:
    """Integers ``m_i`` with ``Sum m_i = total`` and ``m_i ≈ total * w_i / Sum w`` (largest
    remainders; earlier entries win ties); all 0 when ``Sum w = 0``. A weight 0 gets 0.

    Example: total 16, w = [0.5, 0.433, 0] -> exact 8.57, 7.43, 0 -> floors 8, 7 -> the one
    left goes to the larger remainder 0.57 -> [9, 7, 0].
    """
    s = sum(weights)
    if total <= 0 or s <= 0:
        return [0] * len(weights)
    exact = [total * w / s for w in weights]
    out = [math.floor(x) for x in exact]
    left = total - sum(out)
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in order[:left]:
        out[i] += 1
    return out
