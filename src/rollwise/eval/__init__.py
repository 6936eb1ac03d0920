"""Held-out evaluation: ``pass_at_k`` (public unbiased estimator), ``maj_at_k``, ``evaluate``."""

from rollwise.eval.metrics import maj_at_k, pass_at_k

__all__ = ["pass_at_k", "maj_at_k"]
