"""``aepo``: AEPO's entropy-balanced clipped update (issue #44).

Paper: Dong et al., "Agentic Entropy-Balanced Policy Optimization", arXiv 2510.14545 (code:
RUC-NLPIR/ARPO); the working specification is the AEPO entry of the project's agentic specifications
(issue #44). Its update half; the rollout half (entropy pre-monitoring, branching at tool calls) is
``sampling.branching.mode = "aepo"`` (``rollwise.generate.aepo``). Two changes to GRPO's clipped loss
(``objectives/grpo.py``), for the tokens where the policy is uncertain:

1. **Stop-gradient clipping of high-entropy tokens.** PPO's clip gives a token whose ratio ``r`` left
   ``[1 - eps, 1 + eps]`` in the direction of its advantage a gradient of 0, and the tokens where the
   policy explores (high entropy) are the ones that leave it most. For a high-entropy token where the
   clip is active, the loss term is ``-A * sg(clip(r) / r) * r``: its value is the clipped term's, its
   gradient ``-A * clip(r) * grad log pi``, the policy gradient rescaled to the clip bound instead of 0.
   Every other token keeps GRPO's clipped term (``clipped_surrogate``).
2. **Entropy-aware advantage.** ``A_t * (1 + alpha * clamp((H_t - mean H) / mean H, -1, 1))``, ``H``
   the token's entropy under the current policy and ``mean H`` its row's mean over loss tokens, both
   without gradient: uncertain tokens weigh more (``alpha = 0``, the default, is off).

A token is **high-entropy** when its entropy is at or above the ``entropy_quantile`` quantile of its
row's loss tokens (the trainer always passes the current policy's per-token entropy). Reading the
row, not the batch, keeps the loss independent of how rows are split into micro-batches.

**Reconstructions** [RECON] (the specification gives no formula): the per-row quantile as the line of
"high entropy" (default 0.8, the top 20% of each row's tokens); the rescaled term on both sides of the
clip; the clamped, row-relative form of the entropy-aware advantage and its ``alpha``.
"""

from __future__ import annotations

import torch
from pydantic import Field

from rollwise.objectives.common import (
    AGGREGATION_HELP,
    Aggregation,
    ObjectiveOptions,
    anchor_logprobs,
    clipped_surrogate,
    finish,
    masked_sum,
    objective,
    safe_exp,
    sequence_mean,
)
from rollwise.types import Batch, LossOut


class Options(ObjectiveOptions):
    aggregation: Aggregation = Field("token_mean", description=AGGREGATION_HELP)
    clip_eps: float = Field(0.2, gt=0, description="Symmetric clip range [1 - clip_eps, 1 + clip_eps] (as grpo).")
    entropy_quantile: float = Field(
        0.8,
        ge=0.0,
        le=1.0,
        description="A token is high-entropy at or above this quantile of its row's token entropies; there a "
        "clipped token passes the gradient rescaled to the clip bound [reconstructed].",
    )
    alpha: float = Field(
        0.0,
        ge=0.0,
        description="Entropy-aware advantage: A * (1 + alpha * clamp((H - row mean) / row mean, -1, 1)) "
        "(0 = off) [reconstructed].",
    )


def high_entropy(entropy: torch.Tensor, mask: torch.Tensor, q: float) -> torch.Tensor:
    """(B, T) bool: loss tokens at or above the ``q`` quantile of their row's entropies."""
    out = torch.zeros_like(mask, dtype=torch.bool)
    for i in range(mask.shape[0]):
        on = mask[i] > 0
        if bool(on.any()):
            line = torch.quantile(entropy[i][on].double(), q)
            out[i] = on & (entropy[i].double() >= line)
    return out


def entropy_weight(entropy: torch.Tensor, mask: torch.Tensor, alpha: float) -> torch.Tensor:
    """(B, T) ``1 + alpha * clamp((H - row mean) / row mean, -1, 1)`` (module docstring, 2.)."""
    mean = sequence_mean(entropy, mask).unsqueeze(1)
    rel = ((entropy - mean) / mean.clamp_min(1e-8)).clamp(-1.0, 1.0)
    return 1.0 + alpha * rel


@objective(Options)
def loss(batch: Batch, new_logprobs: torch.Tensor, opts: Options, entropy: torch.Tensor | None = None) -> LossOut:
    """AEPO loss (minimise): GRPO's clip, with the rescaled gradient on clipped high-entropy tokens."""
    if entropy is None:
        raise ValueError("objective 'aepo' reads the per-token entropy (the trainer passes it)")
    mask = batch.loss_mask.to(new_logprobs.dtype)
    ent = entropy.detach().to(new_logprobs.dtype)
    ratio = safe_exp(new_logprobs - anchor_logprobs(batch).to(new_logprobs.dtype))
    adv = batch.advantages[:, None] if batch.token_advantages is None else batch.token_advantages
    adv = adv.to(new_logprobs.dtype).expand_as(ratio)
    if opts.alpha:
        adv = adv * entropy_weight(ent, mask, opts.alpha)
    per_token, clipped = clipped_surrogate(ratio, adv, opts.clip_eps, opts.clip_eps)
    hot = high_entropy(ent, mask, opts.entropy_quantile)
    bound = ratio.detach().clamp(1.0 - opts.clip_eps, 1.0 + opts.clip_eps)
    rescaled = -adv * (bound / ratio.detach()) * ratio
    passed = hot & clipped
    per_token = torch.where(passed, rescaled, per_token)
    metrics = {
        "ratio_sum": masked_sum(ratio, mask),
        "clip_frac_sum": masked_sum(clipped & ~passed, mask),
        "aepo_passed_sum": masked_sum(passed, mask),
    }
    return finish(batch, new_logprobs, per_token, opts, entropy, metrics)
