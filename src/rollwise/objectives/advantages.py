"""Advantage estimators: pure functions of rewards and group ids (docs/architecture.md §3).

Contract (every registered estimator)::

    fn(rewards: Tensor (B,) float, group_index: Tensor (B,) long, opts: fn.Options) -> Advantages

- ``Advantages.values`` (B,) float is one advantage per rollout, broadcast over its tokens by
  the objective; ``Advantages.include`` (B,) bool marks the rows that enter the loss (only
  ``median`` excludes rows). Whoever builds the training ``Batch`` drops excluded rows (or zeroes
  their ``loss_mask``) *before* counting ``num_loss_tokens``.
- Groups may have any size and ids need not be contiguous or sorted; group statistics come from
  :mod:`rollwise.objectives.groups` (index operations, never a reshape by a global ``n``).
- A group whose rewards are all equal gets advantage exactly 0 on every row (no NaN), and so does
  a group of one row for the estimators whose baseline needs a second rollout.
- ``fn.Options`` is a pydantic model (``extra="forbid"``); call ``fn(r, g, fn.Options())`` for
  the defaults.

Estimators and papers:

- ``grpo``: ``(r - mean) / (std + eps)`` — DeepSeekMath, arXiv 2402.03300. Default std is the
  *unbiased* sample std (``torch.std``, as TRL and verl compute it); the paper does not say.
  ``scale = "batch"`` divides by the std of the whole batch instead (TRL's ``scale_rewards``).
- ``dr_grpo``: ``r - mean`` — Dr. GRPO, arXiv 2503.20783 (allocation.md §14.2).
- ``rloo``: ``r_i - mean_{j != i} r_j`` — Ahmadian et al., arXiv 2402.14740.
- ``reinforce_pp_baseline``: ``r - mean``, then whitened over the whole batch — REINFORCE++,
  arXiv 2501.03262. Default ``whiten = "sequence"`` (every rollout weighs 1); verl whitens over
  *tokens* (a sequence weighs by its length): ``whiten = "token"``, which reads the declared
  input ``completion_lengths``.

Peer conventions (issue #19, ``docs/objectives.md``): a group of one row gets 0 here; verl uses
baseline 0 and scale 1 for it, so its advantage is the reward (``singleton = "reward"`` on
``grpo``, ``dr_grpo``, ``rloo``, ``reinforce_pp_baseline``). TRL's GRPO advantage is
``grpo`` with ``eps = 1e-4`` (and ``scale = "batch"`` for ``scale_rewards="batch"``).
- ``median``: MC-GRPO, arXiv 2601.22582 (allocation.md §9): baseline = group median, scale =
  MAD + ``mad_eps``, the pivot row is excluded. Deviation: the pivot is chosen deterministically
  as the *lowest-index* row whose reward equals the median (the reference code takes whichever
  tied index ``torch.median`` returns). Options ``scale="none"`` and ``mad_eps`` are ours, as the
  spec (§9.3) asks, because MAD is often 0 for binary rewards (scale 1/1e-3 = 1000x).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from rollwise.objectives.groups import Groups
from rollwise.types import Advantages


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _estimator(options: type[BaseModel]) -> Callable:
    """Attach ``Options`` and check the inputs of an estimator once, here."""

    def wrap(core: Callable) -> Callable:
        def fn(rewards: torch.Tensor, group_index: torch.Tensor, opts: BaseModel | None = None, **inputs) -> Advantages:
            if rewards.dim() != 1 or group_index.shape != rewards.shape:
                raise ValueError(
                    f"rewards and group_index must both be (B,), got {tuple(rewards.shape)} and "
                    f"{tuple(group_index.shape)}"
                )
            if not torch.isfinite(rewards).all():
                raise ValueError("rewards contain NaN or inf (an unverified rollout must be dropped, not scored)")
            rewards = rewards.float() if not rewards.is_floating_point() else rewards
            opts = options() if opts is None else opts
            return core(rewards, Groups.of(group_index), opts, **inputs)

        fn.__name__, fn.__qualname__, fn.__doc__ = core.__name__, core.__qualname__, core.__doc__
        fn.Options = options  # type: ignore[attr-defined]
        return fn

    return wrap


def _all(rewards: torch.Tensor) -> torch.Tensor:
    return torch.ones_like(rewards, dtype=torch.bool)


def _zero_where(values: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
    return torch.where(cond, torch.zeros_like(values), values)


Singleton = Literal["zero", "reward"]
SINGLETON_HELP = (
    "Advantage of a group of one row: 'zero' (no relative signal; rollwise) or 'reward', baseline 0 and "
    "scale 1 as verl's estimators do (then A = r, for grpo r / (1 + eps))."
)


def _singleton(
    values: torch.Tensor, rewards: torch.Tensor, groups: Groups, mode: str, scale: float = 1.0
) -> torch.Tensor:
    """Give one-row groups their advantage under ``mode`` ('zero' or 'reward': ``r / scale``)."""
    alone = groups.count(rewards) < 2
    return torch.where(alone, torch.zeros_like(values) if mode == "zero" else rewards / scale, values)


# ---------------------------------------------------------------------------- grpo


class GrpoOptions(_Options):
    eps: float = Field(1e-6, ge=0.0, description="Added to the group std before dividing (verl uses 1e-6, TRL 1e-4).")
    std: Literal["unbiased", "population"] = Field(
        "unbiased",
        description="Group std estimator: 'unbiased' divides by n-1 (torch.std, TRL, verl); 'population' by n.",
    )
    scale: Literal["group", "batch", "none"] = Field(
        "group",
        description="Divisor of r - group mean: the 'group' std (paper, verl, TRL's default), the std of the whole "
        "'batch' (TRL scale_rewards='batch'), or 'none' (= dr_grpo).",
    )
    singleton: Singleton = Field("zero", description=SINGLETON_HELP)


@_estimator(GrpoOptions)
def grpo(rewards: torch.Tensor, groups: Groups, opts: GrpoOptions) -> Advantages:
    """``A_i = (r_i - mean_g r) / (std_g r + eps)``; a group of equal rewards gets 0, a group of
    one row 0 (or ``r / (1 + eps)`` with ``singleton = "reward"``).

    Example (one group, unbiased std): r = [1, 0, 0, 1] -> mean 0.5, std sqrt(1/3) = 0.57735,
    A = [0.866, -0.866, -0.866, 0.866]. ``scale = "batch"``: the std is over all rows of the batch
    (a single value), the mean stays per group.
    """
    unbiased = opts.std == "unbiased"
    centred = rewards - groups.mean(rewards)
    if opts.scale == "group":
        values = centred / (groups.std(rewards, unbiased=unbiased) + opts.eps)
    elif opts.scale == "batch":
        values = centred / (rewards.std(unbiased=unbiased) + opts.eps) if rewards.numel() > 1 else centred
    else:
        values = centred
    values = _zero_where(values, groups.constant(rewards))
    return Advantages(
        _singleton(values, rewards, groups, opts.singleton, 1.0 + opts.eps if opts.scale == "group" else 1.0),
        _all(rewards),
    )


# ---------------------------------------------------------------------------- dr_grpo


class DrGrpoOptions(_Options):
    singleton: Singleton = Field("zero", description=SINGLETON_HELP)


@_estimator(DrGrpoOptions)
def dr_grpo(rewards: torch.Tensor, groups: Groups, opts: DrGrpoOptions) -> Advantages:
    """``A_i = r_i - mean_g r`` (no std division). Example: r = [1, 0, 0, 1] -> [0.5, -0.5, -0.5, 0.5]."""
    values = _zero_where(rewards - groups.mean(rewards), groups.constant(rewards))
    return Advantages(_singleton(values, rewards, groups, opts.singleton), _all(rewards))


# ---------------------------------------------------------------------------- rloo


class RlooOptions(_Options):
    singleton: Singleton = Field("zero", description=SINGLETON_HELP)


@_estimator(RlooOptions)
def rloo(rewards: torch.Tensor, groups: Groups, opts: RlooOptions) -> Advantages:
    """``A_i = r_i - (sum_g r - r_i) / (n_g - 1)``, i.e. ``n/(n-1) * (r_i - mean)``; a group of one gets 0.

    Example: r = [1, 0, 0] -> baselines [0, 0.5, 0.5] -> A = [1, -0.5, -0.5].
    """
    n = groups.count(rewards)
    baseline = (groups.sum(rewards) - rewards) / (n - 1).clamp(min=1)
    values = _zero_where(rewards - baseline, groups.constant(rewards))
    return Advantages(_singleton(values, rewards, groups, opts.singleton), _all(rewards))


# ---------------------------------------------------------------------------- reinforce_pp_baseline


class ReinforcePPBaselineOptions(_Options):
    eps: float = Field(1e-8, ge=0.0, description="Added to the batch variance before the square root (as verl does).")
    std: Literal["unbiased", "population"] = Field(
        "unbiased",
        description="Batch std estimator used for whitening: 'unbiased' (n-1, verl's default) or 'population'.",
    )
    whiten: Literal["sequence", "token"] = Field(
        "sequence",
        description="Whitening statistics over 'sequence's (every rollout weighs 1) or over 'token's (a rollout weighs "
        "by its completion length, as verl's masked_whiten; n in 'unbiased' is then the token count).",
    )
    singleton: Singleton = Field("zero", description=SINGLETON_HELP)


@_estimator(ReinforcePPBaselineOptions)
def reinforce_pp_baseline(
    rewards: torch.Tensor,
    groups: Groups,
    opts: ReinforcePPBaselineOptions,
    completion_lengths: torch.Tensor | None = None,
) -> Advantages:
    """``a_i = r_i - mean_g r``, then ``A = (a - mean_batch a) / sqrt(var_batch a + eps)``.

    Example: groups {r=[1,0]}, {r=[1,1]} -> a = [0.5, -0.5, 0, 0]; batch mean 0, unbiased var
    0.5/3 = 1/6 -> A = [1.2247, -1.2247, 0, 0]. All rows of an all-equal batch get 0.
    With ``whiten = "token"`` row i weighs ``completion_lengths[i]`` (B,) in the mean and variance
    (``n`` = total tokens): lengths [3, 1, 1, 1] -> mean (1.5 - 0.5) / 6 = 1/6, var
    (3 (1/3)^2 + (2/3)^2 + 2 (1/6)^2) / 5 = 1/6, A = [0.8165, -1.6330, -0.4082, -0.4082].
    """
    centred = _zero_where(rewards - groups.mean(rewards), groups.constant(rewards))
    centred = _singleton(centred, rewards, groups, opts.singleton)
    if opts.whiten == "token":
        if completion_lengths is None:
            raise ValueError(
                "reinforce_pp_baseline with whiten='token' needs completion_lengths (B,) "
                "(rollwise.objectives.inputs.completion_lengths / advantage_inputs)"
            )
        if completion_lengths.shape != rewards.shape or bool((completion_lengths < 0).any()):
            raise ValueError(f"completion_lengths must be (B,) and >= 0, got shape {tuple(completion_lengths.shape)}")
        w = completion_lengths.to(centred.dtype)
        n = float(w.sum())
        if n < 2 or bool((centred[w > 0] == centred[w > 0][0]).all()):
            return Advantages(torch.zeros_like(rewards), _all(rewards))
        mean = (w * centred).sum() / n
        var = (w * (centred - mean) ** 2).sum() / (n - 1 if opts.std == "unbiased" else n)
        return Advantages((centred - mean) / (var + opts.eps).sqrt(), _all(rewards))
    if centred.numel() < 2 or bool((centred == centred[0]).all()):
        return Advantages(torch.zeros_like(rewards), _all(rewards))
    var = centred.var(unbiased=opts.std == "unbiased")
    values = (centred - centred.mean()) / (var + opts.eps).sqrt()
    return Advantages(values, _all(rewards))


reinforce_pp_baseline.inputs = ("completion_lengths",)  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------- median (MC-GRPO)


class MedianOptions(_Options):
    mad_eps: float = Field(1e-3, gt=0.0, description="Added to the MAD before dividing (MC-GRPO code: 1e-3).")
    scale: Literal["mad", "none"] = Field(
        "mad",
        description="'mad' divides by MAD + mad_eps (paper); 'none' keeps r - median (ours: MAD is often 0 for "
        "binary rewards).",
    )


@_estimator(MedianOptions)
def median(rewards: torch.Tensor, groups: Groups, opts: MedianOptions) -> Advantages:
    """MC-GRPO: ``A_i = (r_i - m_g) / (MAD_g + mad_eps)`` with ``m_g`` the (lower) group median and
    ``MAD_g = median_g |r - m_g|``; the pivot (lowest-index row with ``r == m_g``) gets include=False.

    A group is meant to hold G+1 rollouts (odd), so exactly G remain. Example: r = [1, 1, 0]
    -> m = 1, |r - m| = [0, 0, 1], MAD = 0 -> A = [0, 0, -1/1e-3 = -1000]; row 0 is the pivot.
    """
    m = groups.lower_median(rewards)
    centred = rewards - m
    if opts.scale == "mad":
        centred = centred / (groups.lower_median(centred.abs()) + opts.mad_eps)
    values = _zero_where(centred, groups.constant(rewards))
    pivot = groups.first_row_where(rewards == m)
    return Advantages(values, ~pivot)
