"""``r3l``: R³L's Positive Amplification advantage (mean baseline, positives amplified).

Paper: "Reflect-then-Retry Reinforcement Learning with Language-Guided Exploration, Pivotal
Credit, and Positive Amplification" (R³L), arXiv 2601.03715 (Shi et al., Alibaba); code
shiweijiezero/R3L (``opmd_reweight_adv``); guidance.md §7a.1 step 8. Built from the code:

    baseline = group mean reward (0 for a group of one)
    A = r - baseline
    if r >= max_reward:  A = 1.0                 (a maximal-reward rollout)
    elif A >= 0:         A = alpha * A           (a partial reward above the mean)
    negatives unchanged

Options: ``rule = "paper"`` follows the reviewers' reading of the paper's eq. 11 instead
(maximal-reward rollouts get ``A = alpha``; other positives ``alpha * A``); the spec flags the
two as inconsistent.

Properties (guidance.md §7a.5, §8.3) — note they *differ* from the contract of
:mod:`rollwise.objectives.advantages` on purpose: with binary rewards every positive row gets
exactly ``A = 1`` (the ``x alpha`` branch only acts on partial rewards), the group's advantages
sum to ``G p^2 > 0`` rather than 0, and an all-correct group gets ``A = 1`` on every row (it is
*not* a zero-advantage group here). An all-wrong group gets 0.

The rest of R³L is not in this module: the OPMD loss (REINFORCE without ratio or clip, divided
by ``1 + tau``) is the ``opmd`` objective (:mod:`rollwise.objectives.opmd`); reflect-then-retry
with pivot masking is not built (docs/strategies.md says why).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from rollwise.objectives.advantages import _estimator, _Options
from rollwise.objectives.groups import Groups
from rollwise.types import Advantages


class R3lOptions(_Options):
    alpha: float = Field(3.0, ge=1.0, description="Positive Amplification factor alpha (R3L: 3).")
    max_reward: float = Field(1.0, description="A rollout with r >= max_reward is a maximal-reward one (code: 1).")
    rule: Literal["code", "paper"] = Field(
        "code",
        description="'code': maximal-reward rows get A = 1 (opmd_reweight_adv); "
        "'paper': they get A = alpha (reviewers' reading of eq. 11).",
    )


@_estimator(R3lOptions)
def r3l(rewards: torch.Tensor, groups: Groups, opts: R3lOptions) -> Advantages:
    """R³L Positive Amplification. Example (code rule, alpha 3): r = [1, 1, 0, 0, 0, 0, 0, 0]
    -> mean 0.25 -> A = [1, 1, -0.25 x 6]; r = [0.5, 0, 0, 0.5] -> mean 0.25 -> the partial
    rewards get A = 3 * 0.25 = 0.75, the others -0.25."""
    n = groups.count(rewards)
    baseline = torch.where(n > 1, groups.mean(rewards), torch.zeros_like(rewards))
    a = rewards - baseline
    top = torch.full_like(a, 1.0 if opts.rule == "code" else opts.alpha)
    values = torch.where(rewards >= opts.max_reward, top, torch.where(a >= 0, opts.alpha * a, a))
    return Advantages(values, torch.ones_like(rewards, dtype=torch.bool))
