"""``minpro``: GRPO's clipped surrogate with MinPRO's prefix-minimum ratio in place of the token ratio.

Paper: "A Step Back: Prefix Importance Ratio Stabilizes Policy Optimization" (MinPRO), Lei,
Cheng, Tao (ByteDance BandAI / NTU), arXiv 2601.22718; systems.md §13 [abstract; exact form
inferred]. The correct off-policy correction of a token-level objective is the *prefix* ratio
``prod_{j<=t} r_j``; its product explodes or vanishes. MinPRO replaces it with the minimum token
ratio seen so far::

    m_t = min_{j <= t} r_j,      r_j = pi_theta(y_j) / pi_old(y_j)   (over the row's loss tokens)

and uses ``m_t`` where PPO/GRPO use ``r_t``: here inside GRPO's clipped surrogate
``max(-A m_t, -A clip(m_t, 1 - eps, 1 + eps))`` (then :func:`rollwise.objectives.common.finish`:
aggregation, KL, entropy, behaviour weight as for every objective).

[RECON] choices (the spec lists them as unverified):

- the minimum includes position t (``j <= t``), so ``m_t <= r_t``;
- gradient (``gradient = "current"``, default): the surrogate uses ``m_t`` as its *value* but its
  gradient flows only through the current token, ``r~_t = r_t * sg(m_t / r_t)``: a low ratio early
  in the sequence damps (and, through the clip, can stop) the updates of all later tokens, as the
  prefix ratio would, without moving the earlier token's probability for them. ``gradient = "min"``
  uses ``m_t`` itself (the gradient goes to the token that attains the minimum);
- how it combines with clipping: the clip acts on ``m_t`` (as on ``r_t`` in GRPO).

"old" is the trainer's proximal recompute when present, else the sampler's log-probs (as in every
objective, :func:`rollwise.objectives.common.anchor_logprobs`).

Properties (systems.md §13): on-policy (all r = 1) MinPRO equals the ``grpo`` objective;
``m_t`` is non-increasing in t and ``m_t <= r_t``. Each row's minimum runs over that row only, so
micro-batches add up to the full batch as for every objective.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from rollwise.objectives.common import (
    LOG_RATIO_LIMIT,
    anchor_logprobs,
    clipped_surrogate,
    finish,
    masked_sum,
    objective,
    safe_exp,
)
from rollwise.objectives.grpo import Options as GrpoOptions
from rollwise.types import Batch, LossOut


class Options(GrpoOptions):
    gradient: Literal["current", "min"] = Field(
        "current",
        description="'current': value m_t, gradient through the current token only (r_t * sg(m_t / r_t)); "
        "'min': m_t itself (gradient to the token attaining the minimum). Both [RECON].",
    )


def prefix_min_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) -> (B, T): ``log m_t = min_{j <= t, mask_j != 0} log r_j`` along each row; positions
    before a row's first loss token get +LOG_RATIO_LIMIT (they are off-mask; any value is ignored).

    Example: log r = [0, -0.5, 0.2, -1.0] on four loss tokens -> [0, -0.5, -0.5, -1.0].
    """
    big = torch.full_like(log_ratio, LOG_RATIO_LIMIT)
    lr = torch.where(mask != 0, log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT), big)
    return torch.cummin(lr, dim=1).values


@objective(Options)
def loss(batch: Batch, new_logprobs: torch.Tensor, opts: Options, entropy: torch.Tensor | None = None) -> LossOut:
    """MinPRO loss (minimise): GRPO's clipped surrogate on the prefix-minimum ratio."""
    mask = batch.loss_mask.to(new_logprobs.dtype)
    log_r = new_logprobs - anchor_logprobs(batch).to(new_logprobs.dtype)
    log_m = prefix_min_log_ratio(log_r, mask)
    if opts.gradient == "current":
        ratio = safe_exp(log_r + (log_m - log_r).detach())
    else:
        ratio = safe_exp(log_m)
    adv = batch.advantages[:, None] if batch.token_advantages is None else batch.token_advantages
    per_token, clipped = clipped_surrogate(ratio, adv.to(new_logprobs.dtype), opts.clip_eps, opts.clip_eps)
    metrics = {
        "ratio_sum": masked_sum(ratio, mask),
        "clip_frac_sum": masked_sum(clipped, mask),
        "minpro_damped_frac_sum": masked_sum(log_m < log_r.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT), mask),
    }
    return finish(batch, new_logprobs, per_token, opts, entropy, metrics)
