"""The trainer's batch of a step's groups: the filter chain (``apply_filters``), then rows, shaped
rewards, the advantage context (inputs that need the trainer or the controller, Prompt-GDRO's row
weights), the estimator (a pure function of rewards, group ids, options and that context) and the
padded tensors (``make_batch``). The loop and periodic asynchrony's per-group batches
(``rollwise.trainer.streaming``) both build batches here.
"""

from __future__ import annotations

from collections import Counter

import torch

from rollwise.batch.collate import collate, flatten
from rollwise.objectives.inputs import advantage_context, advantage_inputs
from rollwise.types import Advantages


def make_batch(run, groups):
    """The trainer's batch of ``groups``: their rows, rewards shaped (overlong penalty, KL in the
    reward), the advantage context (``objectives.inputs.advantage_context``), the estimator's
    advantages times the context's row weights (Prompt-GDRO) and the padded tensors; returns
    ``(rows, batch, shaping metrics, advantages)``, ``advantages`` the estimator's before the weights.
    ``run``: the session (``rollwise.session.Run``: its ``parts``, ``services``, ``shape_rewards``)."""
    parts = run.parts
    rows, rewards, gidx = flatten(groups)
    rewards, shaping = run.shape_rewards(rows, rewards)
    context = advantage_context(parts.advantage, rows, run.services, parts.controller, gidx)
    advs = parts.advantage(rewards, gidx, parts.advantage_options, **advantage_inputs(parts.advantage, rows, context))
    batch = collate(rows, rewards, gidx, apply_row_weights(advs, context.weights), run.services.codec.pad_id)
    return rows, batch, shaping, advs


def apply_row_weights(advs: Advantages, weights: torch.Tensor | None) -> Advantages:
    """``advs`` with each row's advantage (and its per-token advantages) multiplied by ``weights``
    (B,); ``advs`` itself when ``weights`` is None."""
    if weights is None:
        return advs
    wt = weights.to(advs.values.dtype)
    tok = None if advs.token_values is None else advs.token_values * wt[:, None].to(advs.token_values.dtype)
    return Advantages(advs.values * wt, advs.include, token_values=tok, token_include=advs.token_include)


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
