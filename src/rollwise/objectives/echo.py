"""ECHO's entropy-confidence hybrid advantage (``advantage.name = "echo"``) and its
confidence-adaptive clipping, CA-Clip (``objective.name = "echo"``), for test-time RL with
majority-vote pseudo-rewards (``reward.ttrl``, :mod:`rollwise.reward.ttrl`).

Paper: "ECHO: Entropy-Confidence Hybrid Optimization for Test-Time Reinforcement Learning",
Zhao et al., arXiv 2602.02150 (ICML 2026); code user683/ECHO @ 6f7b311 (a verl fork);
docs/specs/guidance.md §5.3. The paper's formulas come from notes [SEC]; the code was read [CODE].

**Hybrid advantage** (code ``apply_hybrid_advantage_shaping``): ``A_grp`` is the GRPO advantage;
over all valid tokens of the batch both signals are z-scored (unbiased std, as
``masked_whiten``), ``S = alpha z(H) + beta z(1 - C)`` is clamped to ``[-s_max, s_max]`` and
``A_t = A_grp (1 + a S_t)``. With ``a = 0.1`` and ``s_max = 2`` the multiplier lies in [0.8, 1.2],
so the sign of ``A`` never flips (``1 + a S > 0`` for ``a s_max < 1``, checked at load).
Per-token advantages (``Advantages.token_values``), so it needs a token-level objective.

**CA-Clip** (code ``dp_actor``): for response i, ``C_tail`` = mean confidence over its last
``tail`` (16) loss tokens, clamped to [0, 1]; ``eps_i = eps_min + (eps_max - eps_min)
sigmoid(kappa (1 - C_tail))`` with (0.05, 0.2, 4.0), used as both the lower and the upper clip of
every token of the response: confident responses get a narrower trust region. C_tail = 1 ->
0.125, 0.9 -> 0.1398, 0.5 -> 0.1821, 0.2 -> 0.1941, 0 -> 0.1973.

Signals: confidence is the probability of the sampled token under the sampler, ``exp(log mu)``
(the code's remove-padding path, which every released script takes; the paper's mean top-k
probability is not available from the backends). Entropy: ``"sampler"`` (full vocabulary,
default) or a proxy (:mod:`rollwise.objectives.signals`).

Differences: the entropy-confidence tree rollout (EC-Tree, §5.3.3; disabled in every released script
and unable to fire with the shipped thresholds, §5.3.6) is a separate sampler, ``sampling.ec_tree``
(``rollwise.generate.ec_tree``, recalibrated), whose rows carry no sampler entropies; the additive
``add_coeff`` term (0 in the code) is not built. Effective released ECHO = TTRL + hybrid
multiplier + CA-Clip, which is what these two pieces give with ``reward.ttrl.enabled = true``.
"""

from __future__ import annotations

import torch
from pydantic import Field, model_validator

from rollwise.objectives.advantages import GrpoOptions, grpo
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
)
from rollwise.objectives.signals import ENTROPY_HELP, EntropyFlavour, sampled_prob, token_entropy
from rollwise.registry import Compat
from rollwise.types import Advantages, Batch, LossOut

# ---------------------------------------------------------------------------- hybrid advantage


class EchoAdvantageOptions(GrpoOptions):
    a: float = Field(0.1, gt=0.0, description="mult_coeff a: A_t = A_grp (1 + a S_t) (code 0.1).")
    alpha: float = Field(1.0, ge=0.0, description="Weight of the z-scored entropy in S (code 1.0).")
    beta: float = Field(1.0, ge=0.0, description="Weight of the z-scored (1 - confidence) in S (code 1.0).")
    s_max: float = Field(2.0, gt=0.0, description="S is clamped to [-s_max, s_max] (code 2.0).")
    entropy: EntropyFlavour = Field("sampler", description=ENTROPY_HELP)

    @property
    def per_token(self) -> bool:  # per-token advantages: a sequence-level objective (gspo) cannot use them
        return True

    @model_validator(mode="after")
    def _no_sign_flip(self):
        if self.a * self.s_max >= 1.0:
            raise ValueError(f"a * s_max must be < 1 so that 1 + a S > 0 (got a={self.a}, s_max={self.s_max})")
        return self


def zscore(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(x - mean) / std`` over the masked entries (unbiased std, as verl's ``masked_whiten``; 0 where
    std is 0, fewer than two entries, or off-mask)."""
    n = mask.sum()
    if n < 2:
        return torch.zeros_like(x)
    mean = (x * mask).sum() / n
    var = (((x - mean) * mask) ** 2).sum() / (n - 1)
    std = var.sqrt()
    z = (x - mean) / std if float(std) > 0 else torch.zeros_like(x)
    return torch.where(mask, z, torch.zeros_like(x))


def hybrid_multiplier(
    h: torch.Tensor, conf: torch.Tensor, mask: torch.Tensor, opts: EchoAdvantageOptions
) -> torch.Tensor:
    """(B, L) ``1 + a clamp(alpha z(H) + beta z(1 - C), -s_max, s_max)`` (1 off-mask)."""
    s = (opts.alpha * zscore(h, mask) + opts.beta * zscore(1.0 - conf, mask)).clamp(-opts.s_max, opts.s_max)
    return torch.where(mask, 1.0 + opts.a * s, torch.ones_like(s))


def echo_advantage(
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    opts: EchoAdvantageOptions | None = None,
    *,
    completion_logprobs=None,
    completion_entropies=None,
) -> Advantages:
    """GRPO advantage times ECHO's per-token hybrid multiplier (module docstring)."""
    opts = opts or EchoAdvantageOptions()
    if completion_logprobs is None:
        raise ValueError("advantage 'echo' needs completion_logprobs (advantage_inputs)")
    base = grpo(rewards, group_index, GrpoOptions(eps=opts.eps, std=opts.std))
    h, mask = token_entropy(opts.entropy, completion_logprobs, completion_entropies)
    conf, _ = sampled_prob(completion_logprobs)
    tok = base.values[:, None] * hybrid_multiplier(h, conf, mask, opts)
    return Advantages(base.values, base.include, token_values=torch.where(mask, tok, torch.zeros_like(tok)))


echo_advantage.Options = EchoAdvantageOptions  # type: ignore[attr-defined]
echo_advantage.inputs = ("completion_logprobs", "completion_entropies")  # type: ignore[attr-defined]
echo_advantage.compat = Compat(batch_statistics=True, entropy_option="entropy")  # type: ignore[attr-defined]  # z-scored over the batch

# ---------------------------------------------------------------------------- CA-Clip objective


class Options(ObjectiveOptions):
    aggregation: Aggregation = Field("token_mean", description=AGGREGATION_HELP)
    eps_min: float = Field(
        0.05, gt=0.0, description="Clip range of a fully unconfident response's limit side (code 0.05)."
    )
    eps_max: float = Field(0.2, gt=0.0, description="Upper end of the clip range (code 0.2).")
    kappa: float = Field(4.0, ge=0.0, description="Sigmoid slope on (1 - C_tail) (code 4.0).")
    tail: int = Field(
        16, ge=1, description="C_tail = mean confidence over the response's last `tail` loss tokens (code 16)."
    )

    @model_validator(mode="after")
    def _range(self):
        if self.eps_min > self.eps_max:
            raise ValueError(f"eps_min ({self.eps_min}) exceeds eps_max ({self.eps_max})")
        return self


def tail_confidence(confidence: torch.Tensor, mask: torch.Tensor, tail: int) -> torch.Tensor:
    """(B,) mean of ``confidence`` over each row's last ``tail`` loss tokens, clamped to [0, 1]
    (1 for a row without loss tokens, i.e. the narrowest range; it has no loss anyway)."""
    on = mask != 0
    from_end = on.flip(1).long().cumsum(1).flip(1)  # 1 on the last loss token, 2 on the one before, ...
    last = on & (from_end <= tail)
    n = last.sum(dim=1)
    mean = torch.where(last, confidence, torch.zeros_like(confidence)).sum(dim=1) / n.clamp(min=1)
    return torch.where(n > 0, mean, torch.ones_like(mean)).clamp(0.0, 1.0)


def ca_clip_eps(c_tail: torch.Tensor, eps_min: float, eps_max: float, kappa: float) -> torch.Tensor:
    """``eps_min + (eps_max - eps_min) sigmoid(kappa (1 - C_tail))``; C_tail = 0.5 -> 0.1821."""
    return eps_min + (eps_max - eps_min) * torch.sigmoid(kappa * (1.0 - c_tail))


@objective(Options)
def loss(batch: Batch, new_logprobs: torch.Tensor, opts: Options, entropy: torch.Tensor | None = None) -> LossOut:
    """Clipped surrogate with a per-response clip range ``eps_i`` from the sampler's tail
    confidence (CA-Clip); per-token advantages when the batch has them (the ``echo`` advantage)."""
    mask = batch.loss_mask.to(new_logprobs.dtype)
    conf = torch.where(batch.loss_mask != 0, batch.old_logprobs.exp(), torch.zeros_like(batch.old_logprobs))
    eps = ca_clip_eps(tail_confidence(conf, batch.loss_mask, opts.tail), opts.eps_min, opts.eps_max, opts.kappa)
    eps = eps.to(new_logprobs.dtype)[:, None]
    ratio = safe_exp(new_logprobs - anchor_logprobs(batch).to(new_logprobs.dtype))
    adv = (batch.advantages[:, None] if batch.token_advantages is None else batch.token_advantages).to(
        new_logprobs.dtype
    )
    per_token, active = clipped_surrogate(ratio, adv, eps, eps)  # (B, 1) bounds broadcast over each row's tokens
    metrics = {
        "ratio_sum": masked_sum(ratio, mask),
        "clip_frac_sum": masked_sum(active, mask),
        "ca_clip_eps_sum": masked_sum(eps.expand_as(mask), mask),
    }
    return finish(batch, new_logprobs, per_token, opts, entropy, metrics)
