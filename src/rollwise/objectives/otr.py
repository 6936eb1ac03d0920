"""OTR — One-Token Rollout: supervised fine-tuning as one-token policy gradient.

Paper: "One-Token Rollout: Guiding Supervised Fine-Tuning of LLMs with Policy Gradient" (OTR);
systems.md §12 [abstract + summaries; details recalled/inferred]. At every position t of a
reference completion (teacher forcing on the gold prefix ``y*_<t``), K candidate tokens are
sampled from the current policy ``pi(.|x, y*_<t)`` (temperature ``temperature``), each rewarded
``1`` if it equals the gold token ``y*_t`` and ``negative`` otherwise, and the one-step REINFORCE
loss is ``-(1/K) sum_k r(a_k) log pi(a_k)``, averaged over the reference tokens.

Used by the supervised warm start (``model.warm_start.objective = "otr"``,
:mod:`rollwise.trainer.warm_start`) in place of cross-entropy; RL after the warm start is unchanged.

[RECON] (the spec marks them unverified): ``K = 8``, ``negative = 0`` (wrong candidates are
ignored; the summaries say "penalised with a small negative or zero reward"), sampling temperature
1. ``samples = "exact"`` (ours) replaces the K samples by the expectation over the whole vocabulary,
``-sum_a sg(pi(a)) r(a) log pi(a)``, the K -> infinity limit with no sampling noise.

Properties (systems.md §12): with a policy one-hot on the gold token the gradient vanishes; with
``negative = 0`` the expected gradient is ``pi(y*) grad log pi(y*)``, i.e. SFT's gradient scaled
by ``pi(y*)`` (and plain SFT is the case where the gold token is the only action sampled).
"""

from __future__ import annotations

import torch

from rollwise.sections.model import OtrOptions  # noqa: F401 (the schema lives in its section)


def otr_loss(
    logits: torch.Tensor,
    gold: torch.Tensor,
    mask: torch.Tensor,
    opts: OtrOptions,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Scalar OTR loss. ``logits`` (B, T, V) predict ``gold`` (B, T) at the same positions; ``mask``
    (B, T) selects reference tokens; the mean is over selected positions.

    Example (exact, negative 0): one position, pi = softmax([0, 0]) = [0.5, 0.5], gold 0
    -> loss = -0.5 * log 0.5 = 0.3466; d loss / d logit_0 = -0.5 * (1 - 0.5) = -0.25.
    """
    logp = torch.log_softmax(logits.float(), dim=-1)
    m = mask.to(logp.dtype)
    if opts.mode == "exact":
        probs = torch.softmax(logits.detach().float() / opts.temperature, dim=-1)
        reward = torch.full_like(probs, opts.negative)
        reward.scatter_(-1, gold.unsqueeze(-1), 1.0)
        per_pos = -(probs * reward * logp).sum(-1)
    else:
        probs = torch.softmax(logits.detach().float() / opts.temperature, dim=-1)
        flat = probs.reshape(-1, probs.shape[-1])
        draws = torch.multinomial(flat, opts.samples, replacement=True, generator=generator).reshape(
            *probs.shape[:-1], opts.samples
        )
        reward = torch.where(
            draws == gold.unsqueeze(-1),
            torch.ones_like(draws, dtype=logp.dtype),
            torch.full_like(draws, opts.negative, dtype=logp.dtype),
        )
        per_pos = -(reward * logp.gather(-1, draws)).mean(-1)
    return (per_pos * m).sum() / m.sum().clamp(min=1.0)
