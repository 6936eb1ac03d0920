"""The filter chain of a step: every filter in order, each drop with its reason (``filter/<reason>``)."""

from __future__ import annotations

from collections import Counter


def apply_filters(filters, groups, keep_at_most=None, controller=None):
    """Run each filter in order; return kept groups and a Counter of drop reasons. With
    ``keep_at_most`` (dynamic sampling's target, control/rounds.py) the first that many kept
    groups in generation order stay and the rest are dropped as ``surplus``. A ``controller``
    then turns the kept groups into the training groups (``Controller.finish_batch``: the kept
    groups unchanged, or e.g. dynamic sampling 'replace''s copies of kept groups over dropped ones)."""
    dropped: Counter[str] = Counter()
    kept = []
    for g in groups:
        for _, f in filters:
            d = f(g)
            if not d.keep:
                dropped[d.reason] += 1
                break
        else:
            kept.append(g)
    if keep_at_most is not None and len(kept) > keep_at_most:
        dropped["surplus"] += len(kept) - keep_at_most
        kept = kept[:keep_at_most]
    if controller is not None:
        kept = controller.finish_batch(groups, kept, dropped)
    return kept, dropped
