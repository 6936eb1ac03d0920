"""``ettrl``: ETTRL's entropy-based advantage reshaping (EAR) on top of the GRPO advantage, for
test-time RL with majority-vote pseudo-rewards (``reward.ttrl``, :mod:`rollwise.reward.ttrl`).

Paper: "Balancing Exploration and Exploitation in LLM Test-Time Reinforcement Learning via
Entropy Mechanism" (ETTRL), Liu et al. (Kuaishou), arXiv 2508.11356; no code found. The formulas
come from paper notes [SEC]; docs/specs/guidance.md §5.2.2.

- ``mode = "res"`` (Adv-Res, the paper's main variant): ``H_i`` = mean token entropy of response
  i, ``H_bar`` = the group mean of ``H``; ``Y_i = 1 + (H_bar - H_i) / H_bar`` and ``A_i <- Y_i A_i``.
  Confident (low-entropy) responses are amplified, uncertain ones damped; ``mean_i Y_i = 1``.
- ``mode = "clip"`` (Adv-Clip): ``A_i <- clip(A_i, -beta, beta)``, ``beta = 2``.

Worked numbers: H = (0.5, 1.0, 1.5) -> Y = (1.5, 1.0, 0.5); H = (0.2, 0.2, 2.6) -> Y = (1.8, 1.8,
-0.6): the third advantage would flip sign.

Differences: ``Y_i < 0`` (a response with more than twice the group's mean entropy) flips the
advantage's sign in the formula as written [DERIVED]; ``clamp = true`` (default, the spec's
[RECON] recommendation) clamps ``Y_i >= 0``; the share of clamped rows is not logged (an estimator
returns advantages only). A group with ``H_bar = 0`` keeps ``Y = 1``. The entropy flavour is an
option (:mod:`rollwise.objectives.signals`); the paper's is the full-vocabulary entropy
(``"sampler"``, default). ETMR (entropy-fork tree rollouts, §5.2.1) is a sampler,
``sampling.etmr`` (``rollwise.generate.etmr``); its rows carry no sampler entropies, so with it this
advantage takes ``entropy = "surprisal"`` or ``"sampled_term"``.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from rollwise.objectives.advantages import GrpoOptions, grpo
from rollwise.objectives.groups import Groups
from rollwise.objectives.signals import ENTROPY_HELP, EntropyFlavour, row_mean, token_entropy
from rollwise.registry import Compat
from rollwise.types import Advantages


class EttrlOptions(GrpoOptions):
    mode: Literal["res", "clip"] = Field(
        "res", description="'res' = Adv-Res (entropy-relative scaling Y_i A_i); 'clip' = Adv-Clip."
    )
    beta: float = Field(2.0, gt=0.0, description="Adv-Clip bound: A is clipped to [-beta, beta] (paper: 2).")
    clamp: bool = Field(
        True, description="Adv-Res: clamp Y_i >= 0 so no advantage changes sign [RECON]; false = as written."
    )
    entropy: EntropyFlavour = Field("sampler", description=ENTROPY_HELP)


def entropy_scale(h: torch.Tensor, group_index: torch.Tensor, clamp: bool = True) -> torch.Tensor:
    """(B,) ``Y_i = 1 + (H_bar - H_i) / H_bar`` with the group mean ``H_bar`` (1 where H_bar = 0),
    clamped at 0 when ``clamp``. Example: H = (0.2, 0.2, 2.6) -> H_bar = 1.0 -> (1.8, 1.8, -0.6)
    -> clamped (1.8, 1.8, 0)."""
    h_bar = Groups.of(group_index).mean(h)
    y = torch.where(
        h_bar > 0, 1.0 + (h_bar - h) / torch.where(h_bar > 0, h_bar, torch.ones_like(h_bar)), torch.ones_like(h)
    )
    return y.clamp(min=0.0) if clamp else y


def ettrl(
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    opts: EttrlOptions | None = None,
    *,
    completion_logprobs=None,
    completion_entropies=None,
) -> Advantages:
    """GRPO advantages reshaped by EAR (module docstring)."""
    opts = opts or EttrlOptions()
    base = grpo(rewards, group_index, GrpoOptions(eps=opts.eps, std=opts.std))
    if opts.mode == "clip":
        return Advantages(base.values.clamp(-opts.beta, opts.beta), base.include)
    if completion_logprobs is None:
        raise ValueError("advantage 'ettrl' (mode 'res') needs completion_logprobs (advantage_inputs)")
    ent, mask = token_entropy(opts.entropy, completion_logprobs, completion_entropies)
    y = entropy_scale(row_mean(ent, mask).to(base.values.dtype), group_index, opts.clamp)
    return Advantages(base.values * y, base.include)


ettrl.Options = EttrlOptions  # type: ignore[attr-defined]
ettrl.inputs = ("completion_logprobs", "completion_entropies")  # type: ignore[attr-defined]
ettrl.compat = Compat(entropy_option="entropy")  # type: ignore[attr-defined]
