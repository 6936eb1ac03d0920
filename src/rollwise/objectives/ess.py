"""VCPO effective-sample-size learning-rate scaling (systems.md §3).

Paper: "Stable Asynchrony: Variance-Controlled Off-Policy RL" (VCPO), arXiv 2602.17616;
code mit-han-lab/vcpo. Under policy lag the sequence importance weights become heavy-tailed and
the ESS drops before collapse; VCPO shrinks that optimizer step's learning rate with the ESS.

For the sequences of one optimizer step (the **global** minibatch: pass all rows, gathered
across ranks, not one micro-batch)::

    w_i  = exp(sum_t m_it (log pi_prox - log mu))        (sequence-level, unclipped)
    rho  = (sum_i w_i)^2 / (B * sum_i w_i^2)  in (0, 1]
    scale = sqrt(min(1, rho / rho_base))   (rule "sqrt", the default)  or  min(1, rho / rho_base) ("linear")

and the caller sets ``lr = lr_base * scale`` for this step only. ``B`` counts rows with at least
one loss token. ``rho`` is invariant to scaling every ``w_i`` by a constant, which is used to
compute it stably (weights are normalised by their maximum in log space).

Wiring: ``train.ess_lr_scaling = {enabled, rule, base_ess_ratio}`` (the config model extends
:class:`Options`); ``Trainer.optimize`` computes the weights from the step's proximal log-probs
and logs ``train/ess_ratio`` and ``train/lr_scale``.

Differences from the code: VCPO's second control, the off-policy optimal baseline (OPOB, a
per-trajectory gradient path), is not implemented here. Defaults follow the code
(``scaling_rule = sqrt``, ``base_ess_ratio = 1.0``, unclipped weights).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

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
