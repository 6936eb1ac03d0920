"""GSPO objective: sequence-level, length-normalised importance ratio and sequence-level clip.

Paper: Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv 2507.18071
(allocation.md §14.3). Maximised::

    s_i = (pi_theta(y_i|x) / pi_old(y_i|x))^(1/|y_i|) = exp(mean_t (log pi_theta - log pi_old))
    J   = E[ (1/G) sum_i min(s_i A_i, clip(s_i, 1-eps_low, 1+eps_high) A_i) ]

Defaults from the paper (v2 §5.1): ``eps_low = 3e-4``, ``eps_high = 4e-4``, no KL; aggregation
``"seq_mean_token_mean"``, which for a per-sequence loss broadcast over its tokens is exactly the
paper's (1/G) sum_i, with G the step's global number of sequences. The gradient flows through
``s_i`` into every token's log-prob (not detached). With one-token sequences ``s_i`` is the token
ratio and GSPO equals GRPO with the same clip bounds.

Differences from the paper: ``|y_i|`` is the row's number of loss tokens (its ``loss_mask`` sum);
the GSPO-token variant (per-token advantages) is not implemented because advantages here are
per sequence, where the paper shows both variants are equal. ``clip_frac_sum`` and ``ratio_sum``
count the sequence's value once per loss token, following the token-sum metric convention.
``kl_bias_correction`` multiplies the KL by the sequence ratio ``s_i`` (TRL with
``importance_sampling_level="sequence"``).

Peers (issue #19): verl's ``gspo`` loss clamps the log of ``s_i`` only from above, at 10, before
``exp`` (and uses ``seq-mean-token-mean``); TRL's is ``loss_type`` "grpo"/"dapo" with
``importance_sampling_level="sequence"``; both match this loss exactly within that range (rollwise
clamps the log-ratio to [-20, 20]).
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
    aggregation: Aggregation = Field("seq_mean_token_mean", description=AGGREGATION_HELP)
    eps_low: float = Field(3e-4, gt=0, description="Lower clip range of the sequence ratio (paper: 3e-4).")
    eps_high: float = Field(4e-4, gt=0, description="Upper clip range of the sequence ratio (paper: 4e-4).")


@objective(Options)
def loss(batch: Batch, new_logprobs: torch.Tensor, opts: Options, entropy: torch.Tensor | None = None) -> LossOut:
    """GSPO loss (minimise): clipped surrogate on the length-normalised sequence ratio."""
    if batch.token_advantages is not None:
        raise ValueError(
            "gspo is sequence-level and cannot use per-token advantages (tree advantage: set per_token = false)"
        )
    mask = batch.loss_mask.to(new_logprobs.dtype)
    log_s = sequence_mean(new_logprobs - anchor_logprobs(batch).to(new_logprobs.dtype), mask)  # (B,)
    s = safe_exp(log_s)
    per_seq, clipped = clipped_surrogate(s, batch.advantages.to(new_logprobs.dtype), opts.eps_low, opts.eps_high)
    per_token = per_seq[:, None].expand_as(new_logprobs)
    metrics = {
        "ratio_sum": masked_sum(s[:, None].expand_as(mask), mask),
        "clip_frac_sum": masked_sum(clipped[:, None].expand_as(mask), mask),
    }
    return finish(batch, new_logprobs, per_token, opts, entropy, metrics, ratio=s[:, None].expand_as(new_logprobs))
