"""``mssr``: single-rollout advantages against a persistent per-prompt value baseline, batch
normalised, with MSSR's entropy-based advantage shaping.

Paper: "Stable and Efficient Single-Rollout RL for Multimodal Reasoning" (MSSR), Liu et al.
(Tencent AI Lab / UMD), arXiv 2512.18215 (CVPR 2026); code ruiiu/MSSR @ 3dd0f13
(``compute_mvsr_advantage``, ``compute_entropy_advantage_shaping``); docs/specs/guidance.md §2. The
paper's equations come from notes [SEC]; the code was read [CODE].

The baseline ``v_hat(x) = alpha / (alpha + beta)`` is the prompt's Beta posterior mean *before*
this step's update, kept by the ``mssr`` controller (:mod:`rollwise.control.mssr`, the Beta tracker
with KL-adaptive forgetting) and handed over as the ``prompt_baseline`` input. Then:

1. raw advantage ``a = r - v_hat(x)``;
2. global batch normalisation ``A = (a - mean_batch a) / sqrt(max(var_pop(a), 1e-6))``;
3. entropy shaping per token (MSSR; ``entropy_coef = 0`` gives MVSR, the unshaped baseline):
   ``psi_t = min(lambda sg(H_t), |A| / kappa)``, ``A_t = A + psi_t`` (psi >= 0 for both signs of A;
   for A < 0 it softens the penalty but never flips the sign: ``A_t <= A / 2 < 0`` with kappa = 2).

Worked numbers (lambda 0.4, kappa 2, sampled-token proxy): p = 0.5 -> H = 0.3466, lambda H =
0.1386; A = 1.2 -> 1.3386; A = -0.1 -> psi = min(0.1386, 0.05) -> -0.05; A = -1.2 -> -1.0614.

Entropy flavour: ``"sampled_term"`` (default) is the code's ``-p log p`` of the sampled token with
``p = mu(y_t)`` (bounded by 1/e, so psi <= 0.147); the paper defines the full-vocabulary entropy
(``"sampler"``) [RECON: both exposed]. The code's p is the trainer's recomputed old log-prob; here
it is the sampler's (the same policy).

Differences: per-token advantages (``Advantages.token_values``) are produced whenever
``entropy_coef > 0``, so a sequence-level objective (gspo) is refused. Padding tokens get nothing.
"""

from __future__ import annotations

import torch
from pydantic import Field

from rollwise.objectives.advantages import _Options
from rollwise.objectives.signals import ENTROPY_HELP, EntropyFlavour, token_entropy
from rollwise.registry import Compat
from rollwise.types import Advantages


class MssrOptions(_Options):
    entropy_coef: float = Field(
        0.4,
        ge=0.0,
        description="lambda of psi = min(lambda H, |A|/kappa) (code entropy_alpha 0.4); 0 = MVSR (no shaping).",
    )
    kappa: float = Field(2.0, gt=0.0, description="kappa (code entropy_kappa 2.0): psi <= |A|/kappa.")
    var_eps: float = Field(1e-6, gt=0.0, description="Floor of the batch variance in the normalisation (code 1e-6).")
    entropy: EntropyFlavour = Field("sampled_term", description=ENTROPY_HELP + " MSSR's code: 'sampled_term'.")

    @property
    def per_token(self) -> bool:  # shaped advantages are per token
        return self.entropy_coef > 0


def normalise_batch(a: torch.Tensor, var_eps: float) -> torch.Tensor:
    """``(a - mean) / sqrt(max(var_pop, var_eps))`` over the whole batch."""
    if a.numel() == 0:
        return a
    var = a.var(unbiased=False) if a.numel() > 1 else torch.zeros(())
    return (a - a.mean()) / torch.clamp(var, min=var_eps).sqrt()


def entropy_bonus(adv: torch.Tensor, h: torch.Tensor, mask: torch.Tensor, lam: float, kappa: float) -> torch.Tensor:
    """(B, L) ``A + min(lam H, |A| / kappa)`` on real tokens, 0 on padding; H is detached."""
    psi = torch.minimum(lam * h.detach(), adv.abs()[:, None] / kappa)
    return torch.where(mask, adv[:, None] + psi, torch.zeros_like(psi))


def mssr(
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    opts: MssrOptions | None = None,
    *,
    prompt_baseline: torch.Tensor | None = None,
    completion_logprobs=None,
    completion_entropies=None,
) -> Advantages:
    """Baseline-subtracted, batch-normalised advantages, plus entropy shaping (module docstring)."""
    opts = opts or MssrOptions()
    if prompt_baseline is None or prompt_baseline.shape != rewards.shape:
        raise ValueError(
            "advantage 'mssr' needs prompt_baseline (B,) from the 'mssr' controller (control.name = 'mssr')"
        )
    a = normalise_batch(rewards.float() - prompt_baseline.float(), opts.var_eps)
    include = torch.ones_like(a, dtype=torch.bool)
    if not opts.entropy_coef:
        return Advantages(a, include)
    if completion_logprobs is None:
        raise ValueError("advantage 'mssr' with entropy_coef > 0 needs completion_logprobs (advantage_inputs)")
    h, mask = token_entropy(opts.entropy, completion_logprobs, completion_entropies)
    return Advantages(a, include, token_values=entropy_bonus(a, h, mask, opts.entropy_coef, opts.kappa))


mssr.Options = MssrOptions  # type: ignore[attr-defined]
mssr.inputs = ("prompt_baseline", "completion_logprobs", "completion_entropies")  # type: ignore[attr-defined]
mssr.compat = Compat(batch_statistics=True, entropy_option="entropy")  # type: ignore[attr-defined]  # batch normalisation
