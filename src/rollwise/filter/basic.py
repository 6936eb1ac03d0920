"""Basic group filters ``(group) -> Decision``.

- ``zero_variance`` (DAPO dynamic sampling, arXiv 2503.14476): drop groups whose verified
  rewards are all equal (within ``tol``): they carry no gradient under group baselines.
  This module only drops; refilling the batch (DAPO) is a controller round, and replacing the
  dropped groups by copies of kept ones (POLARIS/SkyRL, :mod:`rollwise.filter.replace`) happens
  after the filters (``control.dynamic_sampling.type``, :mod:`rollwise.control.rounds`).
- ``overlong``: drop groups where every rollout hit the length limit.
- ``errored``: drop groups with a rollout whose generation failed or could not be verified.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from rollwise.types import Decision, Group


class _ZVOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tol: float = Field(1e-6, ge=0, description="Rewards closer than this count as equal.")


def zero_variance(group: Group, opts: _ZVOptions = _ZVOptions()) -> Decision:  # noqa: B008  (frozen)
    if not group.is_zero_variance(opts.tol):
        return Decision(True, "kept")
    scores = group.verified_rewards()
    if not scores:
        return Decision(False, "no_verified")
    if min(scores) >= 1.0 - opts.tol:
        return Decision(False, "all_correct")
    return Decision(False, "all_wrong" if max(scores) <= opts.tol else "all_equal")


zero_variance.Options = _ZVOptions


def overlong(group: Group, opts=None) -> Decision:
    if group.rollouts and all(r.finish == "length" for r in group.rollouts):
        return Decision(False, "all_overlong")
    return Decision(True, "kept")


def errored(group: Group, opts=None) -> Decision:
    if any(r.finish == "error" or r.reward is None for r in group.rollouts):
        return Decision(False, "errored")
    return Decision(True, "kept")
