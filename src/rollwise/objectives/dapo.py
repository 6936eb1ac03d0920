"""DAPO objective (clip-higher, token-level loss) and its overlong soft punishment.

Paper: Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
arXiv 2503.14476 (allocation.md §14.1). Maximised::

    J = E[ (1 / sum_i |o_i|) sum_i sum_t min(r_it A_i, clip(r_it, 1-eps_low, 1+eps_high) A_i) ]

Defaults: ``eps_low = 0.2``, ``eps_high = 0.28``, ``aggregation = "token_mean"`` (the paper's
1 / sum_i |o_i|, over the step's global loss tokens), no KL (``kl_coef = 0``).

What lives elsewhere: dynamic sampling (dropping all-equal groups) is a filter
(``filter/``), the advantage is ``advantages.grpo``. The overlong soft punishment is the pure
reward-shaping function :func:`overlong_penalty` below, added to the correctness reward by
:mod:`rollwise.reward` (``reward.overlong_penalty``); refilling the batch after the filter is
``control.dynamic_sampling`` (:mod:`rollwise.control.rounds`). Differences from the paper: none intended; the KL,
entropy and TIS options of :class:`~rollwise.objectives.common.ObjectiveOptions` are extras (off by default).
"""

from __future__ import annotations

import torch
from pydantic import Field

from rollwise.objectives.common import AGGREGATION_HELP, DUAL_CLIP_HELP, Aggregation, ObjectiveOptions, objective
from rollwise.objectives.grpo import clipped_loss
from rollwise.types import Batch, LossOut


class Options(ObjectiveOptions):
    aggregation: Aggregation = Field("token_mean", description=AGGREGATION_HELP)
    eps_low: float = Field(0.2, gt=0, description="Lower clip range: the ratio is clipped from below at 1 - eps_low.")
    eps_high: float = Field(
        0.28, gt=0, description="Upper clip range (clip-higher): the ratio is clipped from above at 1 + eps_high."
    )
    dual_clip: float | None = Field(None, gt=1, description=DUAL_CLIP_HELP)


@objective(Options)
def loss(batch: Batch, new_logprobs: torch.Tensor, opts: Options, entropy: torch.Tensor | None = None) -> LossOut:
    """DAPO loss (minimise): clipped PPO with decoupled bounds [1-eps_low, 1+eps_high], token mean."""
    return clipped_loss(batch, new_logprobs, opts, entropy, opts.eps_low, opts.eps_high)


def overlong_penalty(length: int, max_len: int, cache_len: int) -> float:
    """DAPO's soft overlong punishment ``R_len`` for a response of ``length`` tokens, to be added to
    the correctness reward (paper: ``L_max = 20480``, ``L_cache = 4096``)::

        0                                      if length <= max_len - cache_len
        ((max_len - cache_len) - length) / cache_len   if max_len - cache_len < length <= max_len
        -1                                     if length > max_len

    Example: max_len 10, cache_len 4 -> lengths 6, 8, 10, 11 give 0, -0.5, -1, -1.
    """
    if cache_len <= 0 or cache_len > max_len:
        raise ValueError(f"need 0 < cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}")
    free = max_len - cache_len
    if length <= free:
        return 0.0
    if length <= max_len:
        return (free - length) / cache_len
    return -1.0
