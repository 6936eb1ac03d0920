"""The per-step compute budget that every controller applies (one helper, so strategies can be
compared on equal compute).

Two caps, both optional, both per training step and over *all* of the controller's generation
rounds of that step (a multi-round controller such as DARS asks for the remaining budget after
each round):

- ``control.budget_rollouts``: most rollouts per step. When unset, each controller passes its own
  default (``uniform``: ``prompts_per_step * rollouts_per_prompt``; ``dars``: the most its
  schedule can ask for, so its budget never binds unless set; see each controller).
- ``control.budget_tokens``: most *expected* generated tokens per step. A request's cost is not
  known before it is generated, so it is estimated as ``rollouts * L``, where ``L`` is the mean
  completion length (tokens per rollout) of the rollouts recorded in the controller's
  :class:`~rollwise.control.history.PromptHistory` over its last ``LENGTH_WINDOW`` recorded steps,
  together with the rollouts already generated this step (``groups``); before any data it is
  ``sampling.max_new_tokens`` (an upper bound, so the first step never overshoots). Tokens already
  generated this step are counted exactly. The allowed number of rollouts is
  ``floor((budget_tokens - used_tokens) / L)``. Continuations of a prefix are charged like
  fresh rollouts (an over-estimate). Actual spend can exceed ``budget_tokens`` when rollouts are
  longer than ``L``; the ledger's ``cost/generated_tokens`` is the exact account.

``StepBudget.cap`` trims a list of requests to the remaining allowance (``how="trim"``: the last
requests lose rollouts first, as :func:`cap_plan`; ``how="scale"``: every request shrinks in
proportion, largest remainders first). Requests trimmed to 0 are left out of the plan.

The budget keeps no state of its own: lengths come from the controller's ``PromptHistory``,
which is in every controller's checkpoint, so a resumed run computes the same limits.
Dynamic-sampling refill rounds (``control.dynamic_sampling``, :mod:`rollwise.control.rounds`)
are bounded by their ``max_rounds``, not by this budget.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from rollwise.quota import proportional_quota
from rollwise.types import Group, Plan, Request

LENGTH_WINDOW = 4  # recorded steps whose rollouts give the mean completion length


def cap_plan(requests: Sequence[Request], budget: int) -> Plan:
    """Trim request sizes (last ones first) so the plan's total stays within ``budget``."""
    out, left = [], max(0, budget)
    for r in requests:
        n = min(r.n, left)
        left -= n
        if n > 0:
            out.append(dataclasses.replace(r, n=n))  # keeps prefix, its log-probs and versions
    return Plan(tuple(out))


def scale_plan(requests: Sequence[Request], budget: int) -> Plan:
    """Shrink every request in proportion so the total is ``min(total, budget)``.

    Each request gets ``floor(n * budget / total)``; the rollouts left over go one each to the
    largest fractional parts (earlier requests win ties; :func:`proportional_quota`). Example: sizes
    (24, 11, 3), budget 19, total 38: exact shares 12, 5.5, 1.5 -> floors 12, 5, 1 (18) -> the one
    left goes to 5.5 (the first of the two .5 remainders) -> (12, 6, 1)."""
    total = sum(r.n for r in requests)
    budget = max(0, budget)
    if total <= budget:
        return Plan(tuple(r for r in requests if r.n > 0))
    sizes = proportional_quota(budget, [r.n for r in requests])
    return Plan(tuple(dataclasses.replace(r, n=n) for r, n in zip(requests, sizes) if n > 0))


def completion_tokens(groups: Iterable[Group]) -> tuple[int, int]:
    """(rollouts, generated completion tokens) of ``groups``."""
    n = t = 0
    for g in groups:
        n += g.size
        t += sum(len(r.completion_ids) for r in g.rollouts)
    return n, t


def max_new_tokens_prior(control_cfg) -> int:
    """``sampling.max_new_tokens`` of the run (the ``Config`` hands it to its control section, a private
    attribute ``ControlConfig`` declares); a control section built on its own falls back to the sampling
    default."""
    prior = control_cfg._max_new_tokens
    if prior is None:
        from rollwise.config import SamplingConfig

        prior = SamplingConfig.model_fields["max_new_tokens"].default
    return int(prior)


@dataclass(frozen=True)
class StepBudget:
    """A controller's per-step caps (see the module docstring). ``rollouts`` / ``tokens`` None
    means no cap of that kind; ``prior_tokens`` is the length estimate before any data."""

    rollouts: int | None
    tokens: int | None
    prior_tokens: int

    @classmethod
    def from_config(cls, control_cfg, default_rollouts: int | None) -> StepBudget:
        """``control.budget_rollouts`` (else the controller's ``default_rollouts``; None = no
        rollout cap) and ``control.budget_tokens``."""
        return cls(
            control_cfg.budget_rollouts or default_rollouts,
            control_cfg.budget_tokens,
            max_new_tokens_prior(control_cfg),
        )

    def tokens_per_rollout(self, history=None, groups: Sequence[Group] = ()) -> float:
        """Mean completion length L of the history's last ``LENGTH_WINDOW`` steps and ``groups``;
        ``prior_tokens`` when neither has a rollout."""
        n, t = history.recent_lengths(LENGTH_WINDOW) if history is not None else (0, 0)
        gn, gt = completion_tokens(groups)
        n, t = n + gn, t + gt
        return t / n if n else float(self.prior_tokens)

    def remaining(self, history=None, groups: Sequence[Group] = ()) -> int | None:
        """Most rollouts still allowed this step, given the step's ``groups`` so far (None = no cap)."""
        used_n, used_t = completion_tokens(groups)
        limits = []
        if self.rollouts is not None:
            limits.append(self.rollouts - used_n)
        if self.tokens is not None:
            per = max(self.tokens_per_rollout(history, groups), 1e-9)
            limits.append(math.floor((self.tokens - used_t) / per + 1e-9))
        return max(0, min(limits)) if limits else None

    def cap(
        self,
        requests: Sequence[Request],
        history=None,
        groups: Sequence[Group] = (),
        how: Literal["trim", "scale"] = "trim",
    ) -> Plan:
        """The requests fitted into the remaining allowance (``how``: see the module docstring)."""
        left = self.remaining(history, groups)
        if left is None:
            return Plan(tuple(r for r in requests if r.n > 0))
        return cap_plan(requests, left) if how == "trim" else scale_plan(requests, left)
