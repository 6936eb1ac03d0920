"""``gdpo``: group reward-decoupled normalisation for several named rewards, and ``grpo_sum``, its
baseline (GRPO on the weighted sum of the named rewards).

Paper: "GDPO: Group reward-Decoupled Normalization Policy Optimization for Multi-reward RL
Optimization", Liu et al. (NVIDIA), arXiv 2601.05242; code NVlabs/GDPO @ b080e63;
docs/specs/guidance.md §3.

A task may return several named rewards per rollout (``Verdict.rewards``, e.g. the built-in
``arithmetic`` task with ``second_reward = "format"`` or ``"length"``). For prompt i, rollout j
and reward k (eqs. 4-6):

1. conditioning (eq. 8, optional, ``conditions``): ``r_k <- r_k if r_on >= threshold else 0``,
   e.g. ``{length = {on = "correct", threshold = 1.0}}`` gives the paper's conditioned length
   reward (length counts only for correct answers). Conditions read the *unconditioned* values;
2. per-reward group normalisation ``A_k = (r_k - mean_j r_k) / (std_j r_k + eps)`` with the
   unbiased sample std (``torch.std``, as TRL and verl); a reward that is constant within a group
   contributes **exactly 0** there (the spec's [RECON] fix of the fp32 residue, via
   :func:`rollwise.objectives.advantages.grpo`, which is this step);
3. weighted sum ``A_sum = sum_k w_k A_k`` (weights act on the *normalised* advantages; default 1);
4. batch normalisation ``(A_sum - mean_batch) / (std_batch + eps)`` over every row of the step
   (sample-level, unbiased std: the paper's eq. 6 and TRL; ``batch_norm = false`` skips it).

Worked example (G = 2, two binary rewards): totals (0, 1) and (0, 2) both give GRPO advantages
(-0.7071, 0.7071); GDPO before step 4 gives (-0.7071, 0.7071) for r = ((0,1), (0,0)) and
(-1.4142, 1.4142) for r = ((0,1), (0,1)).

``grpo_sum`` (the paper's GRPO baseline) applies the same conditioning and weights to the raw
rewards, sums them (``sum_k w_k r_k``) and normalises the total per group as ``grpo`` does.

Differences from the sources: verl's batch whitening is token-weighted (``masked_whiten``);
advantages here are computed before tokens exist, so only the sample-level form (eq. 6) is
built. One ``eps`` (default 1e-6, verl) is used in both denominators (TRL uses 1e-4). The
[DERIVED] caution of the spec holds: with equal weights, rewards whose sum is constant within a
group give exactly 0 (the paper's 3-rollout example claims otherwise).

Input: ``named_rewards`` (a dict name -> (B,) float), read from the rows' ``Verdict.rewards`` by
:func:`rollwise.objectives.inputs.named_rewards`; a row without named rewards raises an error
naming its prompt. The verdict's scalar ``score`` (the training reward of every other estimator,
and what evaluation counts as correct) is not used by these two estimators.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from pydantic import BaseModel, ConfigDict, Field

from rollwise.objectives.advantages import GrpoOptions, grpo
from rollwise.registry import Compat
from rollwise.types import Advantages


class Condition(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    on: str = Field(description="Name of the reward this one is conditioned on (e.g. 'correct').")
    threshold: float = Field(
        1.0, description="The reward counts only where the 'on' reward is >= threshold (eq. 8: t)."
    )


class GdpoOptions(GrpoOptions):
    weights: dict[str, float] = Field(
        default_factory=dict,
        description="Weight w_k per reward name (default 1 for every "
        "reward); applied to the normalised advantages (gdpo) or the raw rewards (grpo_sum).",
    )
    conditions: dict[str, Condition] = Field(
        default_factory=dict,
        description="Conditioned rewards (eq. 8): "
        "{name = {on = other, threshold = t}} sets reward 'name' to 0 where 'other' < t.",
    )
    batch_norm: bool = Field(
        True,
        description="gdpo only: normalise the weighted sum over the batch (eq. 6; the paper "
        "reports runs failing to converge without it).",
    )


def condition(named: Mapping[str, torch.Tensor], conditions: Mapping[str, Condition]) -> dict[str, torch.Tensor]:
    """Named rewards after eq. 8: ``r_k <- r_k if r_on >= t else 0`` for each conditioned k.
    Example: correct = (1, 0, 1), length = (1, 1, 0), length on correct (t = 1) -> (1, 0, 0)."""
    for k, c in conditions.items():
        for name in (k, c.on):
            if name not in named:
                raise ValueError(
                    f"advantage.options.conditions names reward {name!r}, which the task does not return "
                    f"(its rewards: {sorted(named)})"
                )
    return {
        k: torch.where(named[conditions[k].on] >= conditions[k].threshold, r, torch.zeros_like(r))
        if k in conditions
        else r
        for k, r in named.items()
    }


def _weights(named: Mapping[str, torch.Tensor], weights: Mapping[str, float]) -> dict[str, float]:
    unknown = sorted(set(weights) - set(named))
    if unknown:
        raise ValueError(
            f"advantage.options.weights names rewards {unknown} that the task does not return "
            f"(its rewards: {sorted(named)})"
        )
    return {k: float(weights.get(k, 1.0)) for k in named}


def _checked(rewards: torch.Tensor, named: Mapping[str, torch.Tensor] | None, who: str) -> dict[str, torch.Tensor]:
    if not named:
        raise ValueError(
            f"advantage {who!r} needs named rewards (a task whose verdicts carry Verdict.rewards, e.g. "
            "task 'arithmetic' with options.second_reward = 'format' or 'length')"
        )
    out = {}
    for k, r in named.items():
        if r.shape != rewards.shape:
            raise ValueError(f"named reward {k!r} has shape {tuple(r.shape)}, rewards {tuple(rewards.shape)}")
        if not torch.isfinite(r).all():
            raise ValueError(f"named reward {k!r} contains NaN or inf")
        out[k] = r.float()
    return out


def batch_normalise(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``(x - mean) / (std + eps)`` over all rows (unbiased std). A batch whose values span at most
    1e-6 (all equal up to float residue, e.g. complementary rewards that cancel) or a single row -> 0,
    so round-off is never blown up to unit scale."""
    if x.numel() < 2 or float(x.max() - x.min()) <= 1e-6:
        return torch.zeros_like(x)
    return (x - x.mean()) / (x.std(unbiased=True) + eps)


def gdpo(
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    opts: GdpoOptions | None = None,
    *,
    named_rewards: Mapping[str, torch.Tensor] | None = None,
) -> Advantages:
    """GDPO advantages (module docstring): per-reward group normalisation, weighted sum, batch
    normalisation. Example (one group of 2, unbiased std, no batch norm): correct = (0, 1),
    format = (0, 1) -> A = (-1.4142, 1.4142); format = (1, 1) instead -> (-0.7071, 0.7071)."""
    opts = opts or GdpoOptions()
    named = condition(_checked(rewards, named_rewards, "gdpo"), opts.conditions)
    w = _weights(named, opts.weights)
    per = GrpoOptions(eps=opts.eps, std=opts.std)
    total = torch.zeros_like(rewards, dtype=torch.float32)
    for k, r in named.items():
        total = total + w[k] * grpo(r, group_index, per).values
    if opts.batch_norm:
        total = batch_normalise(total, opts.eps)
    return Advantages(total, torch.ones_like(total, dtype=torch.bool))


def grpo_sum(
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    opts: GdpoOptions | None = None,
    *,
    named_rewards: Mapping[str, torch.Tensor] | None = None,
) -> Advantages:
    """GRPO on ``sum_k w_k r_k`` (GDPO's baseline). Example: totals (0, 1) and (0, 2) in groups
    of two both give (-0.7071, 0.7071)."""
    opts = opts or GdpoOptions()
    named = condition(_checked(rewards, named_rewards, "grpo_sum"), opts.conditions)
    w = _weights(named, opts.weights)
    total = sum(w[k] * r for k, r in named.items())
    return grpo(total, group_index, GrpoOptions(eps=opts.eps, std=opts.std))


for _fn in (gdpo, grpo_sum):
    _fn.Options = GdpoOptions  # type: ignore[attr-defined]
    _fn.inputs = ("named_rewards",)  # type: ignore[attr-defined]
gdpo.compat = Compat(batch_statistics="batch_norm")  # type: ignore[attr-defined]  # eq. 6 normalises over the batch
