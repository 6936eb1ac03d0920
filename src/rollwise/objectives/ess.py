"""VCPO's two variance controls (systems.md §3): effective-sample-size learning-rate scaling and
the closed-form off-policy optimal baseline (OPOB).

Paper: "Stable Asynchrony: Variance-Controlled Off-Policy RL" (VCPO), arXiv 2602.17616;
code mit-han-lab/vcpo. Under policy lag the sequence importance weights become heavy-tailed and
the ESS drops before collapse; VCPO shrinks that optimizer step's learning rate with the ESS, and
centres the rewards on the baseline that minimises the variance of the importance-weighted
score-function estimate.

**ESS learning-rate scaling.** For the sequences of one optimizer step (the **global** minibatch:
pass all rows, gathered across ranks, not one micro-batch)::

    w_i  = exp(sum_t m_it (log pi_prox - log mu))        (sequence-level, unclipped)
    rho  = (sum_i w_i)^2 / (B * sum_i w_i^2)  in (0, 1]
    scale = sqrt(min(1, rho / rho_base))   (rule "sqrt", the default)  or  min(1, rho / rho_base) ("linear")

and the caller sets ``lr = lr_base * scale`` for this step only. ``B`` counts rows with at least
one loss token. ``rho`` is invariant to scaling every ``w_i`` by a constant, which is used to
compute it stably (weights are normalised by their maximum in log space).

Wiring: ``train.ess_lr_scaling = {enabled, rule, base_ess_ratio}`` (the config model extends
:class:`Options`); ``Trainer.optimize`` computes the weights from the step's proximal log-probs
and logs ``train/ess_ratio`` and ``train/lr_scale``. Defaults follow the code
(``scaling_rule = sqrt``, ``base_ess_ratio = 1.0``, unclipped weights).

**OPOB** (``advantage.name = "opob"``, :func:`opob`). For the off-policy estimator
``g = sum_i w_i (R_i - b) grad log pi(tau_i)`` the variance ``E||g||^2 - ||E g||^2`` depends on the
constant ``b`` only through ``sum_i w_i^2 ||grad log pi(tau_i)||^2 (R_i - b)^2``, minimised by::

    b* = sum_i w_i^2 ||grad log pi(tau_i)||^2 R_i / sum_i w_i^2 ||grad log pi(tau_i)||^2

per group (``scope = "group"``, the code's default: the responses to one prompt) or over the batch.
The advantage is ``A_i = R_i - b*`` (divided by the reward std over the same rows with
``norm_by_std``, as the VCPO recipes set). Since ``sum_i w_i (R_i - b*) g_i`` is what the
objective's backward computes from these advantages, this equals the code's two-accumulator
path (``S_R - b* S_1``) without keeping two gradient buffers. What it needs per row, ``||g_i||``
and ``w_i``, comes from one forward and backward per row at the pre-update weights
(``Trainer.row_scores``, through ``objectives.inputs.row_scores``): expensive, hence an option.
``g_i`` is the gradient of the row's token-mean log-prob (the code's ``seq-mean-token-mean``
aggregation, which it requires), without the IS weight; ``w_i^2`` enters through
``use_is_weights`` (the README's formula; systems.md §3 notes that the code's norm already holds
the in-loss weight, so its default counts it twice: not reproduced). Reconstructed: the
aggregation modes ``median`` / ``winsorized_mean`` are not built (``mean`` only). ``b*`` is
invariant to scaling every ``w_i`` (weights are normalised by their group's largest in log
space). With every ``w_i = 1`` and equal norms ``b*`` is the group mean (GRPO's baseline).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from rollwise.registry import UserError
from rollwise.sections.train import EssOptions as Options  # noqa: F401 (the schema lives in its section)

if TYPE_CHECKING:
    import torch


def ess_ratio(log_weights: torch.Tensor, mask: torch.Tensor) -> float:
    """``rho = (sum w)^2 / (B sum w^2)`` of the sequence weights ``w_i = exp(sum_t m log_w)``.

    ``log_weights`` and ``mask`` are (B, T): per-token ``log pi_prox - log mu`` and the loss mask.
    Returns 1.0 when no row has a loss token.
    """
    import torch  # imported here so that the config (rollwise.sections.train) can use ``Options`` without loading torch

    mask = mask.to(log_weights.dtype)
    log_w = torch.where(mask != 0, log_weights * mask, torch.zeros_like(log_weights)).sum(dim=1).detach()
    log_w = log_w[mask.sum(dim=1) > 0].double()
    if log_w.numel() == 0:
        return 1.0
    w = torch.exp(log_w - log_w.max())  # rho is scale-invariant; max weight becomes 1
    return float((w.sum() ** 2 / (w.numel() * (w * w).sum())).item())


def ess_lr_scale(
    log_weights: torch.Tensor,
    mask: torch.Tensor,
    rule: Literal["sqrt", "linear"] = "sqrt",
    base_ess_ratio: float = 1.0,
) -> float:
    """Learning-rate multiplier in (0, 1] for this optimizer step (see module docstring).

    Example: two sequences with log weights 0 and log 3 -> w = [1, 3], rho = 16 / (2 * 10) = 0.8,
    scale = sqrt(0.8) = 0.894 (sqrt rule).
    """
    ratio = min(1.0, ess_ratio(log_weights, mask) / base_ess_ratio)
    if rule == "sqrt":
        return ratio**0.5
    if rule == "linear":
        return ratio
    raise ValueError(f"unknown ESS scaling rule {rule!r}; known: sqrt, linear")


class OpobOptions(BaseModel):
    """Options of ``advantage.name = "opob"`` (VCPO's ``grad_baselining``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scope: Literal["group", "batch"] = Field(
        "group", description="Where one baseline b* is computed: per prompt 'group' (VCPO's default) or the 'batch'."
    )
    use_is_weights: bool = Field(
        True, description="Weight each row by w_i^2 (the sequence importance weight pi_prox / mu) in b*; false: 1."
    )
    norm_by_std: bool = Field(
        True, description="Divide R_i - b* by the reward std (+ eps) of the rows sharing b*, as the VCPO recipes set."
    )
    eps: float = Field(1e-6, ge=0.0, description="Added to the reward std before dividing.")


def opob_baseline(
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    log_weights: torch.Tensor,
    score_norms: torch.Tensor,
    use_is_weights: bool = True,
) -> torch.Tensor:
    """(B,) the variance-minimising baseline ``b*`` of each row's group (module docstring).

    ``log_weights`` (B,): ``sum_t (log pi_prox - log mu)``; ``score_norms`` (B,): ``||grad log pi(tau_i)||``.
    A group whose rows all have zero norm (nothing to weight) falls back to its mean reward.
    Example: R = [1, 0], w = [1, 2], norms 1 -> b* = (1 * 1 + 4 * 0) / (1 + 4) = 0.2 (the mean is 0.5).
    """
    import torch

    from rollwise.objectives.groups import Groups

    groups = Groups.of(group_index)
    r = rewards.double()
    c = score_norms.double() ** 2
    if use_is_weights:  # w_i^2 = exp(2 log w_i), normalised by the group's largest weight (b* is scale-invariant)
        lw = log_weights.double()
        c = c * torch.exp(2.0 * (lw - groups.max(lw)))
    den = groups.sum(c)
    b = torch.where(den > 0, groups.sum(c * r) / den.clamp(min=torch.finfo(torch.float64).tiny), groups.mean(r))
    return b.to(rewards.dtype)


def opob(
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    opts: OpobOptions | None = None,
    *,
    seq_log_weights: torch.Tensor | None = None,
    score_norms: torch.Tensor | None = None,
):
    """``A_i = (R_i - b*) [/ (std_g R + eps)]`` with VCPO's off-policy optimal baseline (module docstring).
    A group of equal rewards gets 0 (b* is that reward), as does a group of one row."""
    import torch

    from rollwise.objectives.groups import Groups
    from rollwise.types import Advantages

    opts = opts or OpobOptions()
    if seq_log_weights is None or score_norms is None:
        raise ValueError("advantage 'opob' needs seq_log_weights and score_norms (B,) (rollwise.objectives.inputs)")
    if seq_log_weights.shape != rewards.shape or score_norms.shape != rewards.shape:
        raise ValueError(f"seq_log_weights / score_norms must be (B,) like rewards {tuple(rewards.shape)}")
    scope = group_index if opts.scope == "group" else torch.zeros_like(group_index)
    b = opob_baseline(rewards, scope, seq_log_weights, score_norms, opts.use_is_weights)
    groups = Groups.of(scope)
    values = rewards - b
    if opts.norm_by_std:  # the std over the rows that share the baseline
        std = groups.std(rewards, unbiased=True)
        values = torch.where(groups.count(rewards) > 1, values / (std + opts.eps), torch.zeros_like(values))
    values = torch.where(groups.constant(rewards), torch.zeros_like(values), values)  # b* = R exactly
    return Advantages(values, torch.ones_like(rewards, dtype=torch.bool))


def _check_opob(cfg, opts) -> None:
    """Refusals at load: the per-row gradient norms are taken on the trained model in this process."""
    if cfg.train.fsdp:
        raise UserError(
            "advantage.name = 'opob' measures each row's score-gradient norm on the whole model, which "
            "train.fsdp = true shards: set train.fsdp = false, or another advantage"
        )


opob.Options = OpobOptions  # type: ignore[attr-defined]
opob.inputs = ("seq_log_weights", "score_norms")  # type: ignore[attr-defined]
opob.check_config = _check_opob  # type: ignore[attr-defined]
