"""CISPO objective: REINFORCE weighted by a clipped, stop-gradient importance weight.

Paper: MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning
Attention", arXiv 2506.13585 (CISPO section). Maximised::

    J = E[ (1 / sum_i |o_i|) sum_i sum_t sg(clip(r_it, 1-eps_low, 1+eps_high)) A_i log pi_theta(o_it) ]

Unlike PPO, no token loses its gradient: clipping bounds the weight, not the update. At
``r = 1`` the gradient is the plain policy gradient. The loss *value* is ``-w A log pi`` (not the
PPO surrogate), so only gradients, not values, compare with the clipped objectives.

CISPO is not in the project specs. The paper sets no lower bound on the weight and tunes only
``eps_high``. Defaults: ``eps_low = 1.0`` (weight >= 0, i.e. no lower bound, as the paper, TRL
and verl's ``clip_ratio_low`` = 1 setting) and ``eps_high = 4.0``, i.e. the weight is capped at 5:
TRL 1.16 documents ``epsilon_high = 5.0`` as the recommended CISPO cap (the ScaleRL paper's
``eps_max``, arXiv 2510.13786). Issue #19 resolved the former [RECON] value 0.28 (DAPO's PPO
clip-higher, far too tight for a weight cap) this way. Note TRL's ``epsilon_high`` *is* the cap
(``clamp(r, max=epsilon_high)``), so TRL's 5.0 is rollwise's 4.0; verl's ``cispo`` loss clamps to
``[1 - clip_ratio_low, 1 + clip_ratio_high]`` like rollwise. The paper's optional token mask
(recovering PPO's trust region) is not implemented. Aggregation default ``"token_mean"`` (the
paper's 1 / sum_i |o_i|).
"""

from __future__ import annotations

import torch
from pydantic import Field

from rollwise.objectives.common import (
    AGGREGATION_HELP,
    Aggregation,
    ObjectiveOptions,
    anchor_logprobs,
    finish,
    masked_sum,
    objective,
    safe_exp,
)
from rollwise.types import Batch, LossOut


class Options(ObjectiveOptions):
    aggregation: Aggregation = Field("token_mean", description=AGGREGATION_HELP)
    eps_low: float = Field(
        1.0, gt=0, le=1.0, description="Weight lower bound 1 - eps_low (1.0 = no lower bound, as in the paper)."
    )
    eps_high: float = Field(
        4.0,
        gt=0,
        description="Weight upper bound 1 + eps_high; 4.0 caps at 5 (TRL's recommended epsilon_high = 5.0, "
        "which TRL uses as the cap itself).",
    )


@objective(Options)
def loss(batch: Batch, new_logprobs: torch.Tensor, opts: Options, entropy: torch.Tensor | None = None) -> LossOut:
    """CISPO loss (minimise): ``-sg(clip(r)) * A * log pi_theta`` per token."""
    mask = batch.loss_mask.to(new_logprobs.dtype)
    ratio = safe_exp(new_logprobs - anchor_logprobs(batch).to(new_logprobs.dtype)).detach()
    lo, hi = 1.0 - opts.eps_low, 1.0 + opts.eps_high
    weight = ratio.clamp(lo, hi)
    adv = (
        batch.advantages[:, None] if batch.token_advantages is None else batch.token_advantages
    )  # per-token form: tree advantage
    per_token = -weight * adv.to(new_logprobs.dtype) * new_logprobs
    metrics = {"ratio_sum": masked_sum(ratio, mask), "clip_frac_sum": masked_sum((ratio < lo) | (ratio > hi), mask)}
    return finish(batch, new_logprobs, per_token, opts, entropy, metrics)
