"""Shared pieces of every objective: options base, aggregation, KL, off-policy weight, finishing.

Objective contract (docs/architecture.md §3)::

    loss(batch: Batch, new_logprobs: Tensor (B, T), opts: loss.Options | None = None,
         entropy: Tensor (B, T) | None = None) -> LossOut

- ``new_logprobs[i, t]`` is ``log pi_theta(input_ids[i, t] | input_ids[i, :t])``, aligned with
  ``batch.old_logprobs`` (sampler / behaviour mu), ``batch.prox_logprobs`` (trainer recompute with
  the pre-update weights, optional) and ``batch.ref_logprobs`` (frozen reference, optional).
- ``batch.loss_mask`` (B, T) selects (weights) loss tokens; ``batch.advantages`` (B,) is broadcast
  over a row's tokens. Rows excluded by an estimator (MC-GRPO's pivot) must already be out of the
  batch or have a zero ``loss_mask``.
- The returned ``loss`` is to be **minimised** and is already divided by the **global**
  denominator of the optimizer step (``batch.num_loss_tokens`` or ``batch.num_sequences``, which
  ``Batch.rows()`` keeps). Summing ``.loss`` over the micro-batches of a step gives the full-batch
  loss and gradient exactly; no caller rescales.

Metrics convention: ``LossOut.metrics`` holds plain floats that are **sums over the
micro-batch's loss tokens** (each token weighted by its ``loss_mask``), keyed ``<name>_sum``, plus
``token_count`` (the micro-batch's ``loss_mask`` sum). The trainer adds each key across
micro-batches (and ranks) and divides by the step's global ``num_loss_tokens`` to get a token
mean. Keys:

- ``ratio_sum``: policy ratio (token ratio ``pi_theta / pi_old``; GSPO: the sequence ratio
  ``s_i`` counted once per token); ``clip_frac_sum``: tokens where clipping was active.
- ``kl_sum``: the chosen KL estimator to the reference, whenever ``batch.ref_logprobs`` is given.
- ``entropy_sum``: whenever an ``entropy`` tensor is passed.
- ``tis_weight_sum`` and ``tis_clip_frac_sum``: the off-policy behaviour weight after its
  transform, and tokens whose raw weight lay outside ``[tis_low, tis_cap]`` (only when on).

Off-policy correction (systems.md §2 AReaL decoupled PPO, §11 TIS / MIS), usable by every
objective through :class:`ObjectiveOptions`:

- The trainer fills ``batch.prox_logprobs`` only when ``opts.needs_prox`` (any ``tis_level`` other
  than "off", hence always for ``decoupled_ppo``), so the other settings keep the bypass mode.
- The "old" policy in every ratio is ``batch.prox_logprobs`` when present (standard PPO with a
  trainer recompute), else ``batch.old_logprobs`` (slime's "bypass": sampler log-probs as old).
- With ``tis_level != "off"`` the per-token policy loss is multiplied by the detached behaviour
  weight ``w = pi_prox / mu = exp(prox_logprobs - old_logprobs)``: per token, per sequence
  (product over the sequence's loss tokens) or geometric (``exp`` of the mean log weight), then
  truncated to ``[tis_low, tis_cap]`` (TIS) or zeroed outside it (MIS / AReaL's mask). Masked
  tokens keep their place in the denominator, as in slime and AReaL. The KL and entropy terms are
  not weighted. Deviation: verl/slime also offer a "veto" and batch-normalised weights; not here.

Numerical guard (ours): every exponentiated policy or behaviour log-ratio is clamped to
``[-20, 20]`` first (verl does the same for the PPO ratio), so a padded or wildly off-policy token
cannot produce inf/NaN. The k3 KL estimator has its own guard (:func:`kl_penalty`): it is exact
up to ``l = 40`` (less for float16) and continues along its tangent beyond, so its value keeps
growing and its gradient keeps pulling ``pi_theta`` towards the reference (issue #19: clamping
only the exponential at 20 made k3 *fall* beyond ``l = 20``, with gradient +1 instead of
``1 - e^l``).

Peer conventions (issue #19; comparison table in ``docs/objectives.md``): ``kl_cap`` reproduces
verl's clamp of ``low_var_kl`` at 10, ``kl_bias_correction`` TRL's ``use_bias_correction_kl``
(KL times the policy ratio) and ``count_empty_rows`` TRL's ``loss_type="grpo"`` mean over all
rows (``loss_type="dr_grpo"``: all rows too), empty ones included. All are off by default.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollwise.types import Batch, LossOut

Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
KlEstimator = Literal["k1", "k2", "k3"]
LOG_RATIO_LIMIT = 20.0
KL_EXP_LIMIT = 40.0  # k3 is exact for l <= 40 (e^40 = 2.4e17, finite in float32 and bfloat16), tangent beyond

DUAL_CLIP_HELP = (
    "Dual-clip PPO bound c > 1 for negative advantages: the per-token loss is at most -A c (Ye et al. 2020; "
    "verl's clip_ratio_c, default 3 there); None = off."
)

AGGREGATION_HELP = (
    "How per-token losses become one number: 'token_mean' (sum / global loss tokens; DAPO), "
    "'seq_mean_token_mean' (each sequence's token mean, summed / global sequences; GRPO paper), "
    "'seq_mean_token_sum_norm' (token sums / (global sequences * norm_constant); Dr. GRPO)."
)


class ObjectiveOptions(BaseModel):
    """Fields every objective accepts; each objective's ``Options`` extends this model and may
    override a default (e.g. its aggregation)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    aggregation: Aggregation = Field("token_mean", description=AGGREGATION_HELP)
    norm_constant: float | None = Field(
        None,
        gt=0,
        description="Constant divisor of 'seq_mean_token_sum_norm' (Dr. GRPO: the generation budget, "
        "e.g. max_new_tokens); required by that mode, ignored by the others.",
    )
    kl_coef: float = Field(
        0.0, ge=0, description="Weight of the per-token KL to the frozen reference (needs batch.ref_logprobs)."
    )
    kl_estimator: KlEstimator = Field(
        "k3",
        description="KL estimator with l = ref - new: 'k1' = -l, 'k2' = l^2/2, 'k3' = exp(l) - 1 - l (Schulman 2020).",
    )
    kl_cap: float | None = Field(
        None,
        gt=0,
        description="Clamp the per-token k3 value to [-kl_cap, kl_cap] (verl's low_var_kl uses 10; its gradient is 0 "
        "where the clamp is active); None = no cap. Only with kl_estimator 'k3'.",
    )
    kl_bias_correction: bool = Field(
        False,
        description="Multiply the per-token KL by the policy ratio pi_theta/pi_old (the objective's ratio, not "
        "detached; GSPO: the sequence ratio), as TRL's use_bias_correction_kl does. The kl_sum metric stays the "
        "plain estimator.",
    )
    count_empty_rows: bool = Field(
        False,
        description="With the 'seq_mean_*' aggregations: divide by all rows of the step (batch.num_rows), rows without "
        "loss tokens included, as TRL's loss_type 'grpo' and 'dr_grpo' do; False divides by rows with >= 1 loss "
        "token (verl).",
    )
    entropy_coef: float = Field(
        0.0, ge=0, description="Weight of the entropy bonus (subtracted from the loss; needs an entropy tensor)."
    )
    tis_level: Literal["off", "token", "sequence", "geometric"] = Field(
        "off",
        description="Off-policy behaviour weight pi_prox/mu (needs batch.prox_logprobs): 'off', per 'token', "
        "per 'sequence' (product), or 'geometric' (exp of the mean log weight).",
    )
    tis_low: float = Field(0.0, ge=0, description="Lower bound of the behaviour weight (0 = none).")
    tis_cap: float | None = Field(2.0, gt=0, description="Upper bound (cap) of the behaviour weight; None = uncapped.")
    tis_action: Literal["truncate", "mask"] = Field(
        "truncate",
        description="'truncate' clamps the weight into [tis_low, tis_cap] (TIS); 'mask' zeroes tokens outside it "
        "(MIS).",
    )

    @property
    def needs_prox(self) -> bool:
        """True when the objective reads ``batch.prox_logprobs``; the trainer then fills them with
        the pre-update policy's log-probs. Every behaviour weight needs them, so ``decoupled_ppo``
        (whose ``tis_level`` cannot be "off") always does."""
        return self.tis_level != "off"

    @model_validator(mode="after")
    def _consistent(self) -> ObjectiveOptions:
        if self.aggregation == "seq_mean_token_sum_norm" and self.norm_constant is None:
            raise ValueError(
                "aggregation 'seq_mean_token_sum_norm' needs norm_constant (e.g. the generation budget max_new_tokens)"
            )
        if self.tis_cap is not None and self.tis_low > self.tis_cap:
            raise ValueError(f"tis_low ({self.tis_low}) exceeds tis_cap ({self.tis_cap})")
        if self.kl_cap is not None and self.kl_estimator != "k3":
            raise ValueError(f"kl_cap applies to kl_estimator 'k3' only (verl's low_var_kl), got {self.kl_estimator!r}")
        if self.count_empty_rows and self.aggregation == "token_mean":
            raise ValueError("count_empty_rows applies to the 'seq_mean_*' aggregations, not 'token_mean'")
        return self


# ---------------------------------------------------------------------------- small pure pieces


def safe_exp(log_ratio: torch.Tensor) -> torch.Tensor:
    """``exp`` of a log-ratio clamped to ``[-20, 20]`` (numerical guard, see module docstring)."""
    return torch.exp(log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))


def masked_sum(x: torch.Tensor, mask: torch.Tensor) -> float:
    """Metric helper: ``sum(x * mask)`` over loss tokens as a float (no gradient)."""
    x = x.detach().to(mask.dtype)
    return float(torch.where(mask != 0, x * mask, torch.zeros_like(x)).sum().item())


def sequence_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) -> (B,): mean of ``x`` over each row's loss tokens; 0 for a row without any."""
    count = mask.sum(dim=1)
    total = torch.where(mask != 0, x * mask, torch.zeros_like(x)).sum(dim=1)
    return torch.where(count > 0, total / count.clamp(min=torch.finfo(mask.dtype).tiny), torch.zeros_like(total))


def anchor_logprobs(batch: Batch) -> torch.Tensor:
    """The "old" policy of the ratio: the trainer's proximal recompute if present, else the sampler's."""
    return batch.prox_logprobs if batch.prox_logprobs is not None else batch.old_logprobs


def clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, eps_low: float, eps_high: float, dual_clip: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's pessimistic clipped surrogate as a loss: ``max(-A r, -A clip(r, 1-eps_low, 1+eps_high))``.

    Returns the loss (same shape as ``ratio``) and a bool tensor that is True where the clipped
    term was strictly larger (clipping active, zero gradient). At ``r = 1`` the gradient is the
    plain policy gradient ``-A``.

    ``dual_clip = c`` (> 1; Ye et al. 2020, arXiv 1912.09729, verl's ``clip_ratio_c``): where
    ``A < 0`` the loss is further bounded by ``-A c``, i.e. ``min(max(...), -A c)``, so a ratio far
    above 1 on a negative-advantage token stops growing the loss (zero gradient, counted as clipped).
    """
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss, active = torch.maximum(unclipped, clipped), clipped > unclipped
    if dual_clip is not None:
        bound = -advantages * dual_clip
        lower = (advantages < 0) & (bound < loss)
        loss, active = torch.where(lower, bound, loss), active | lower
    return loss, active


def kl_penalty(
    new_logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KlEstimator, cap: float | None = None
) -> torch.Tensor:
    """Per-token estimate of ``KL(pi_theta || pi_ref)`` from samples of pi_theta (Schulman 2020,
    "Approximating KL divergence"), with ``l = log pi_ref - log pi_theta``:
    k1 = -l (unbiased, can be negative), k2 = l^2 / 2, k3 = exp(l) - 1 - l (unbiased, >= 0).
    All three are 0 where new == ref.

    k3 guard: exact for ``l <= KL_EXP_LIMIT`` (40; ``log(max)/2`` for float16), beyond it the
    tangent at the limit, ``k3(L) + (e^L - 1)(l - L)``: finite, increasing and convex, gradient
    ``-(e^L - 1)`` with respect to log pi_theta (never the wrong sign). ``cap`` clamps the k3
    value to ``[-cap, cap]`` (verl's ``low_var_kl``: 10).
    """
    log_ratio = ref_logprobs - new_logprobs
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio * log_ratio
    if estimator == "k3":
        limit = min(KL_EXP_LIMIT, 0.5 * math.log(torch.finfo(log_ratio.dtype).max))
        inside = log_ratio.clamp(max=limit)  # no gradient beyond the limit: the tangent term carries it
        e = torch.exp(inside)
        k3 = e - 1.0 - inside
        k3 = torch.where(log_ratio > limit, k3 + (e - 1.0) * (log_ratio - inside), k3)
        return k3 if cap is None else k3.clamp(-cap, cap)
    raise ValueError(f"unknown kl_estimator {estimator!r}; known: k1, k2, k3")


def behaviour_weight(
    prox_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    level: Literal["token", "sequence", "geometric"],
    low: float = 0.0,
    cap: float | None = None,
    action: Literal["truncate", "mask"] = "truncate",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Detached off-policy weight ``pi_prox / mu`` per token (B, T) and the bool "outside
    [low, cap]" tensor (B, T), for TIS (truncate) or MIS (mask) at token, sequence or geometric
    level (systems.md §11). Sequence and geometric weights are one value per row, broadcast."""
    log_w = torch.where(loss_mask != 0, (prox_logprobs - behaviour_logprobs).detach(), torch.zeros_like(prox_logprobs))
    if level == "sequence":
        log_w = log_w.sum(dim=1, keepdim=True).expand_as(log_w)
    elif level == "geometric":
        log_w = sequence_mean(log_w, loss_mask)[:, None].expand_as(log_w)
    elif level != "token":
        raise ValueError(f"unknown tis_level {level!r}; known: token, sequence, geometric")
    raw = safe_exp(log_w)
    hi = float("inf") if cap is None else cap
    outside = (raw < low) | (raw > hi)
    if action == "truncate":
        weight = raw.clamp(min=low, max=hi)
    elif action == "mask":
        weight = torch.where(outside, torch.zeros_like(raw), raw)
    else:
        raise ValueError(f"unknown tis_action {action!r}; known: truncate, mask")
    return weight, outside


def aggregate(
    per_token_loss: torch.Tensor,
    loss_mask: torch.Tensor,
    mode: Aggregation,
    batch: Batch,
    norm_constant: float | None = None,
    count_empty_rows: bool = False,
) -> torch.Tensor:
    """Reduce a (B, T) per-token loss to a scalar divided by the step's **global** denominator.

    - ``token_mean``: ``sum_{i,t} m l / num_loss_tokens``.
    - ``seq_mean_token_mean``: ``sum_i (sum_t m l / sum_t m) / num_sequences``; a row without loss
      tokens contributes 0 (``num_sequences`` counts rows with >= 1 loss token, as verl's
      ``agg_loss``); with ``count_empty_rows`` the divisor is ``batch.num_rows``, every row of the
      step (TRL's ``loss_type="grpo"``: a mean over all rows of ``sum_t m l / max(sum_t m, 1)``).
    - ``seq_mean_token_sum_norm``: ``sum_{i,t} m l / (num_sequences * norm_constant)``
      (``count_empty_rows``: ``num_rows`` instead of ``num_sequences``, TRL's ``"dr_grpo"``).

    Every mode is a sum of per-row terms over a global constant, so micro-batch losses add up to
    the full-batch loss. Off-mask entries are ignored even if they are inf or NaN.
    """
    mask = loss_mask.to(per_token_loss.dtype)
    masked = torch.where(mask != 0, per_token_loss * mask, torch.zeros_like(per_token_loss))
    d = denominator(mode, batch, norm_constant, count_empty_rows)
    if mode == "seq_mean_token_mean":
        return sequence_mean(per_token_loss, mask).sum() / d
    return masked.sum() / d


def denominator(
    mode: Aggregation, batch: Batch, norm_constant: float | None = None, count_empty_rows: bool = False
) -> float:
    """The global constant ``aggregate`` divides by (see there): ``num_loss_tokens``, the row count,
    or the row count times ``norm_constant``; at least 1 count."""
    if mode == "token_mean":
        return max(batch.num_loss_tokens, 1)
    rows = batch.num_sequences
    if count_empty_rows:
        if batch.num_rows is None:
            raise ValueError("count_empty_rows needs batch.num_rows (the step's global row count)")
        rows = batch.num_rows
    if mode == "seq_mean_token_mean":
        return max(rows, 1)
    if mode == "seq_mean_token_sum_norm":
        if norm_constant is None:
            raise ValueError("aggregation 'seq_mean_token_sum_norm' needs norm_constant")
        return max(rows, 1) * norm_constant
    raise ValueError(f"unknown aggregation {mode!r}; known: token_mean, seq_mean_token_mean, seq_mean_token_sum_norm")


# ---------------------------------------------------------------------------- finishing an objective


def finish(
    batch: Batch,
    new_logprobs: torch.Tensor,
    policy_loss: torch.Tensor,
    opts: ObjectiveOptions,
    entropy: torch.Tensor | None,
    metrics: dict[str, float],
    ratio: torch.Tensor | None = None,
) -> LossOut:
    """Turn an objective's per-token policy loss (B, T) into its ``LossOut``: apply the off-policy
    behaviour weight, add the KL and entropy terms, aggregate by the global denominator and add
    the shared metrics. Each objective computes only its policy loss and calls this.

    ``ratio`` (B, T) is the objective's policy ratio with its gradient, read only by
    ``kl_bias_correction``; None means the token ratio ``exp(new - old)``."""
    mask = batch.loss_mask.to(new_logprobs.dtype)
    metrics = dict(metrics)
    per_token = policy_loss
    if opts.tis_level != "off":
        if batch.prox_logprobs is None:
            raise ValueError(
                f"tis_level={opts.tis_level!r} needs batch.prox_logprobs (the trainer's recompute of pi_prox)"
            )
        weight, outside = behaviour_weight(
            batch.prox_logprobs, batch.old_logprobs, mask, opts.tis_level, opts.tis_low, opts.tis_cap, opts.tis_action
        )
        per_token = per_token * weight.to(per_token.dtype)
        metrics["tis_weight_sum"] = masked_sum(weight, mask)
        metrics["tis_clip_frac_sum"] = masked_sum(outside, mask)
    if batch.ref_logprobs is not None:
        kl = kl_penalty(new_logprobs, batch.ref_logprobs.to(new_logprobs.dtype), opts.kl_estimator, opts.kl_cap)
        metrics["kl_sum"] = masked_sum(kl, mask)
        if opts.kl_coef:
            if opts.kl_bias_correction:
                if ratio is None:
                    ratio = safe_exp(new_logprobs - anchor_logprobs(batch).to(new_logprobs.dtype))
                kl = kl * ratio
            per_token = per_token + opts.kl_coef * kl
    elif opts.kl_coef:
        raise ValueError("kl_coef > 0 needs batch.ref_logprobs (frozen reference log-probs)")
    if entropy is not None:
        metrics["entropy_sum"] = masked_sum(entropy, mask)
        if opts.entropy_coef:
            per_token = per_token - opts.entropy_coef * entropy
    elif opts.entropy_coef:
        raise ValueError("entropy_coef > 0 needs the per-token entropy tensor")
    metrics["token_count"] = float(mask.sum().item())
    loss = aggregate(per_token, mask, opts.aggregation, batch, opts.norm_constant, opts.count_empty_rows)
    return LossOut(loss=loss, metrics=metrics)


def objective(options: type[ObjectiveOptions]) -> Callable:
    """Decorator giving an objective its public signature: attaches ``Options``, fills default
    options and checks that ``new_logprobs`` (and ``entropy``) match ``batch.loss_mask``."""

    def wrap(core: Callable) -> Callable:
        def loss(
            batch: Batch,
            new_logprobs: torch.Tensor,
            opts: ObjectiveOptions | None = None,
            entropy: torch.Tensor | None = None,
        ) -> LossOut:
            shape = tuple(batch.loss_mask.shape)
            if tuple(new_logprobs.shape) != shape:
                raise ValueError(f"new_logprobs has shape {tuple(new_logprobs.shape)}, loss_mask {shape}")
            if entropy is not None and tuple(entropy.shape) != shape:
                raise ValueError(f"entropy has shape {tuple(entropy.shape)}, loss_mask {shape}")
            return core(batch, new_logprobs, options() if opts is None else opts, entropy)

        loss.__name__, loss.__qualname__, loss.__doc__ = "loss", "loss", core.__doc__
        loss.__module__ = core.__module__
        loss.Options = options  # type: ignore[attr-defined]
        return loss

    return wrap
