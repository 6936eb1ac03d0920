"""Decoupled PPO (AReaL): clipped PPO around the proximal policy, times a capped behaviour weight.

Paper: Fu et al. 2025, "AReaL: A Large-Scale Asynchronous Reinforcement Learning System for
Language Reasoning", arXiv 2505.24298, eq. 4-5 (systems.md §2). Maximised::

    J = E_{a ~ pi_behav}[ sum_t  sg(pi_prox / pi_behav) * min(u_t A, clip(u_t, 1-eps, 1+eps) A) ],
    u_t = pi_theta / pi_prox

- ``pi_behav`` is ``batch.old_logprobs`` (what the engine reported when sampling; possibly mixed
  versions within a trajectory); ``pi_prox`` is ``batch.prox_logprobs`` (trainer recompute with
  the pre-update weights), which this objective requires; the trainer fills it because
  ``Options.needs_prox`` is always true here.
- The behaviour weight is the shared off-policy weight of
  :mod:`rollwise.objectives.common` (``tis_*`` options); the defaults follow AReaL's current
  code: token level, ``mask`` tokens whose weight exceeds ``tis_cap = 5.0`` (``rejection_sampling``
  upper 5.0, action mask); masked tokens keep their place in the denominator. The old ``realhf``
  cap (``behav_imp_weight_cap``, default off) is ``tis_cap=None``.
- With ``pi_behav == pi_prox`` the weight is 1 and this is exactly ``grpo`` with the same options.

Differences from the paper / code: the paper's "cap" and the code's ``rejection_sampling``
(ratio metric) are covered; its KL-metric variants (``kl_k1/k2/k3``) and the A-3PO log-linear
proximal approximation are not implemented. Aggregation default ``"token_mean"`` (AReaL's
masked token mean).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from rollwise.objectives import grpo
from rollwise.objectives.common import AGGREGATION_HELP, Aggregation, objective
from rollwise.types import Batch, LossOut


class Options(grpo.Options):
    aggregation: Aggregation = Field("token_mean", description=AGGREGATION_HELP)
    tis_level: Literal["token", "sequence", "geometric"] = Field(
        "token",
        description="Level of the behaviour weight pi_prox/pi_behav: 'token', 'sequence' (product) or 'geometric'.",
    )
    tis_cap: float | None = Field(
        5.0, gt=0, description="Cap on the behaviour weight (AReaL rejection_sampling.upper = 5.0); None = uncapped."
    )
    tis_action: Literal["truncate", "mask"] = Field(
        "mask",
        description="'mask' drops tokens whose weight is outside [tis_low, tis_cap] (AReaL); 'truncate' clamps it.",
    )


@objective(Options)
def loss(batch: Batch, new_logprobs: torch.Tensor, opts: Options, entropy: torch.Tensor | None = None) -> LossOut:
    """Decoupled PPO loss (minimise); needs ``batch.prox_logprobs``."""
    if batch.prox_logprobs is None:
        raise ValueError(
            "decoupled_ppo needs batch.prox_logprobs (the trainer's recompute with the pre-update weights)"
        )
    return grpo.clipped_loss(batch, new_logprobs, opts, entropy, opts.clip_eps, opts.clip_eps)
