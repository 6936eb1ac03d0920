"""``v05``: V0.5's fused baseline — a value prior shrunk against the group mean by estimated MSE.

Paper: "Generalist Value Model as a Prior for Sparse RL Rollouts" (V0.5), arXiv 2603.10848;
allocation.md §11. The controller half (the prior, the z-test and on-demand extra rollouts) is
:mod:`rollwise.control.v05`, which supplies each row's prior as the ``value_prior`` input.

For a prompt with prior ``v`` and n verified rollouts with mean ``r_bar`` [RECON, the spec's
standard shrinkage estimator]:

1. sampling variance ``s2 = v (1 - v)`` (``variance = "prior"``, Bernoulli under the prior) or
   ``max(r_bar (1 - r_bar), variance_floor)`` (``"empirical"``); the mean's variance is ``s2 / n``;
2. squared prior bias ``b2 = max(0, (r_bar - v)^2 - s2 / n)`` (unbiased for ``(p - v)^2``);
3. ``w = (s2 / n) / (s2 / n + b2)`` (``w = 1`` when both are 0), baseline ``b = w v + (1 - w) r_bar``;
4. ``A_i = r_i - b``, divided by the group std + ``eps`` when ``scale = "group"`` (off by default).

Unlike the mean baseline, a group whose rewards are all equal can get a non-zero advantage when the
prior disagrees with it (an all-correct group with v = 0.8 and n = 4: w = 1, A = 0.2) — the prior
is the signal V0.5 adds at small n. Properties (§11.5): w in [0, 1]; r_bar = v -> w = 1, b = v;
w falls as |r_bar - v| grows at fixed n; the fused baseline's MSE is at most about the better of the
prior's and the group mean's (checked by simulation in the tests).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from rollwise.objectives.advantages import _Options
from rollwise.objectives.groups import Groups
from rollwise.registry import Compat
from rollwise.types import Advantages


class V05Options(_Options):
    variance: Literal["prior", "empirical"] = Field(
        "prior",
        description="Sampling variance: 'prior' v(1-v) or 'empirical' "
        "r_bar(1-r_bar) floored at variance_floor (spec [RECON]).",
    )
    variance_floor: float = Field(0.01, ge=0.0, description="Floor of the empirical variance.")
    scale: Literal["none", "group"] = Field(
        "none",
        description="'group' divides r - b by the group std + eps (the spec's optional "
        "normalisation); a group of equal rewards then keeps r - b.",
    )
    eps: float = Field(1e-6, ge=0.0, description="Added to the group std when scale = 'group'.")


def fuse(
    v: torch.Tensor, rbar: torch.Tensor, n: torch.Tensor, variance: str = "prior", floor: float = 0.01
) -> tuple[torch.Tensor, torch.Tensor]:
    """(baseline b, weight w) elementwise (module docstring).

    Example: v = 0.5, r_bar = 1.0, n = 4 -> s2/n = 0.0625, b2 = 0.25 - 0.0625 = 0.1875
    -> w = 0.0625 / 0.25 = 0.25 -> b = 0.25 * 0.5 + 0.75 * 1.0 = 0.875.
    """
    s2 = v * (1 - v) if variance == "prior" else (rbar * (1 - rbar)).clamp(min=floor)
    var_mean = s2 / n.clamp(min=1)
    bias2 = ((rbar - v) ** 2 - var_mean).clamp(min=0.0)
    denom = var_mean + bias2
    w = torch.where(denom > 0, var_mean / denom.clamp(min=torch.finfo(denom.dtype).tiny), torch.ones_like(denom))
    return w * v + (1 - w) * rbar, w


def v05(
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    opts: V05Options | None = None,
    *,
    value_prior: torch.Tensor | None = None,
) -> Advantages:
    """``A_i = r_i - b`` with the fused baseline b of the row's group (optionally std-scaled)."""
    opts = opts or V05Options()
    if value_prior is None or value_prior.shape != rewards.shape:
        raise ValueError("advantage 'v05' needs value_prior (B,): each row's prompt prior (control.name = 'v05')")
    if not ((value_prior >= 0) & (value_prior <= 1)).all():
        raise ValueError("value_prior must lie in [0, 1]")
    groups = Groups.of(group_index)
    v = value_prior.to(rewards.dtype)
    b, _ = fuse(groups.mean(v), groups.mean(rewards), groups.count(rewards), opts.variance, opts.variance_floor)
    a = rewards - b
    if opts.scale == "group":
        std = groups.std(rewards, unbiased=True)
        a = torch.where(torch.isfinite(std) & (std > 0), a / (std + opts.eps), a)
    return Advantages(a, torch.ones_like(rewards, dtype=torch.bool))


v05.Options = V05Options  # type: ignore[attr-defined]
v05.compat = Compat(pairs_with=("control", "v05"))  # type: ignore[attr-defined]  # the controller supplies the priors
v05.inputs = ("value_prior",)  # type: ignore[attr-defined]
