"""GRPO objective: PPO's clipped surrogate on group-relative advantages.

Paper: DeepSeekMath, Shao et al. 2024, arXiv 2402.03300 (allocation.md §0.3). Maximised::

    J = E[ (1/G) sum_i (1/|y_i|) sum_t min(r_it A_i, clip(r_it, 1-eps, 1+eps) A_i) ] - beta KL(pi_theta || pi_ref)

with ``r_it = pi_theta / pi_old`` per token. Here the *loss* ``-J`` is returned per
:mod:`rollwise.objectives.common` (global denominators, metric sums, off-policy options).

Defaults and differences from the paper:

- ``clip_eps = 0.2`` (paper). ``kl_coef = 0.0`` (the paper uses beta = 0.04; most RLVR recipes
  since DAPO / Dr. GRPO drop the KL term), estimator ``k3`` (the paper's estimator).
- ``aggregation = "token_mean"``: token-level, divided by the global loss-token count of the
  optimizer step (as DAPO, TRL's default ``loss_type="dapo"`` and the rollwise foundation issue
  ask), so long and short responses weigh per token. **Differs from the paper**, whose
  ``1/G sum_i 1/|y_i| sum_t`` is ``aggregation = "seq_mean_token_mean"`` (G = global sequences).
- The KL term is added per token and aggregated with the same mode as the policy loss (as in
  the paper's per-token formulation; TRL and verl do the same).
- ``entropy_coef`` (default 0) and the TIS / decoupled behaviour weight are options the paper
  does not have; so is ``dual_clip`` (off; verl's ``clip_ratio_c`` = 3 is on by default there).

This module also holds :func:`clipped_loss`, the clipped-PPO loss with separate lower and upper
clip bounds, which ``dapo`` (clip-higher) and ``decoupled_ppo`` (AReaL) reuse.
"""

from __future__ import annotations

import torch
from pydantic import Field

from rollwise.objectives.common import (
    AGGREGATION_HELP,
    DUAL_CLIP_HELP,
    Aggregation,
    ObjectiveOptions,
    anchor_logprobs,
    clipped_surrogate,
    finish,
    masked_sum,
    objective,
    safe_exp,
)
from rollwise.types import Batch, LossOut


class Options(ObjectiveOptions):
    aggregation: Aggregation = Field("token_mean", description=AGGREGATION_HELP)
    clip_eps: float = Field(
        0.2, gt=0, description="Symmetric clip range: the ratio is clipped to [1 - clip_eps, 1 + clip_eps]."
    )
    dual_clip: float | None = Field(None, gt=1, description=DUAL_CLIP_HELP)


def clipped_loss(
    batch: Batch,
    new_logprobs: torch.Tensor,
    opts: ObjectiveOptions,
    entropy: torch.Tensor | None,
    eps_low: float,
    eps_high: float,
) -> LossOut:
    """Token-level clipped PPO loss with ratio ``exp(new - old)`` clipped to [1-eps_low, 1+eps_high]
    (and the dual clip ``opts.dual_clip`` for negative advantages, when set)."""
    mask = batch.loss_mask.to(new_logprobs.dtype)
    ratio = safe_exp(new_logprobs - anchor_logprobs(batch).to(new_logprobs.dtype))
    adv = (
        batch.advantages[:, None] if batch.token_advantages is None else batch.token_advantages
    )  # per-token form: tree advantage
    advantages = adv.to(new_logprobs.dtype)
    per_token, clipped = clipped_surrogate(ratio, advantages, eps_low, eps_high, getattr(opts, "dual_clip", None))
    metrics = {"ratio_sum": masked_sum(ratio, mask), "clip_frac_sum": masked_sum(clipped, mask)}
    return finish(batch, new_logprobs, per_token, opts, entropy, metrics)


@objective(Options)
def loss(batch: Batch, new_logprobs: torch.Tensor, opts: Options, entropy: torch.Tensor | None = None) -> LossOut:
    """GRPO loss (minimise): symmetric clip ``clip_eps``, optional KL / entropy / behaviour weight."""
    return clipped_loss(batch, new_logprobs, opts, entropy, opts.clip_eps, opts.clip_eps)
