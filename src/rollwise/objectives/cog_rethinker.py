"""``cog_rethinker``: the advantage half of Cog-Rethinker (arXiv 2510.15979; allocation.md §13; a
withdrawn submission, weak evidence: :mod:`rollwise.control.cog_rethinker` says what is known).

The controller adds each zero-accuracy prompt's correct decomposition / refinement outputs to the
batch as rows of the *plain* prompt marked ``Verdict.details["sft"]`` (the ``sft_rows`` input), with
behaviour log-probs re-scored by the current policy under that prompt. This estimator:

1. gives the other rows (the direct rollouts) GRPO's group advantage over those rows only, so SFT
   rows never enter a group's mean or std (``grpo`` options);
2. gives every SFT row the constant advantage ``sft_weight`` (lambda).

Why a constant advantage is the auxiliary NLL term: an SFT row's ratio ``pi_theta / mu`` is 1 at the
update (``mu`` is the current policy), so a ratio objective's per-token loss ``-A r`` (GRPO, DAPO;
clipping is inactive at r = 1) has gradient ``-A grad log pi_theta = lambda grad NLL``. The step's
loss is so ``L_RL + lambda L_SFT`` [PAPER: ``L_DAPO + lambda L_SFT``], both on the objective's
token denominator; lambda's value was not recovered [RECON: 0.1-1.0; default 0.5].

Properties: SFT rows do not move the direct rows' advantages; lambda = 0 with no SFT rows is GRPO;
doubling lambda doubles the SFT rows' gradient.
"""

from __future__ import annotations

import torch
from pydantic import Field

from rollwise.objectives.advantages import GrpoOptions, grpo
from rollwise.objectives.groups import Groups
from rollwise.registry import Compat
from rollwise.types import Advantages


class CogRethinkerOptions(GrpoOptions):
    sft_weight: float = Field(
        0.5, ge=0.0, description="lambda: the SFT rows' advantage, i.e. the weight of the auxiliary NLL term [RECON]."
    )


def cog_rethinker(
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    opts: CogRethinkerOptions | None = None,
    *,
    sft_rows: torch.Tensor | None = None,
) -> Advantages:
    """GRPO on the direct rows, ``sft_weight`` on the SFT rows. Example: one group, direct rewards
    [1, 0] and one SFT row, lambda 0.5 -> A = [0.707, -0.707, 0.5] (GRPO of [1, 0], unbiased std)."""
    opts = opts or CogRethinkerOptions()
    if sft_rows is None or sft_rows.shape != rewards.shape:
        raise ValueError("advantage 'cog_rethinker' needs sft_rows (B,) bool (rollwise.objectives.inputs)")
    sft = sft_rows.bool()
    sub = Groups.of(group_index).inverse * 2 + sft.long()  # SFT rows form their own subgroup
    grpo_opts = GrpoOptions(**{k: getattr(opts, k) for k in GrpoOptions.model_fields})
    base = grpo(rewards, sub, grpo_opts)
    values = torch.where(sft, torch.full_like(base.values, opts.sft_weight), base.values)
    return Advantages(values, base.include)


cog_rethinker.Options = CogRethinkerOptions  # type: ignore[attr-defined]
cog_rethinker.inputs = ("sft_rows",)  # type: ignore[attr-defined]
cog_rethinker.compat = Compat(pairs_with=("control", "cog_rethinker"))  # type: ignore[attr-defined]  # it marks the SFT rows
