"""``poise``: a learned value as the baseline, with the cross-rollout construction.

Paper: POISE, "Your Language Model is Its Own Critic" (2026), read from its abstract (issue #31):
a lightweight probe on the policy's own hidden states (prompt and trajectory) plus token-entropy
statistics predicts the expected verifiable reward and serves as the baseline; each rollout's value
is predicted from an *independent* rollout's states so that the baseline does not depend on the
rollout it is subtracted from and the policy gradient stays unbiased; it works with one rollout per
prompt.

Here::

    A_i = r_i - b_i,   b_i = v(x, tau_{s(i)})  for a group of n >= 2 rows,   b_i = v(x)  for n = 1

where ``s(i)`` is the next row of the same group (cyclically, in batch order; :func:`cross_rollout`),
``v(x, tau)`` the value predicted from rollout ``tau``'s states and ``v(x)`` the state-zero
prediction (:mod:`rollwise.value.predictor`). Since ``tau_{s(i)}`` is sampled independently of
``tau_i``, ``E[b_i grad log pi(tau_i)] = E[b_i] E[grad log pi(tau_i)] = 0``: the baseline adds no bias
(tests/unit/objectives/test_poise.py checks it on a bandit with a known gradient).

The argument needs ``tau_{s(i)}``, and the probe that scores it, to be independent of ``tau_i``'s
outcome in the batch the row trains in (issue #40). So: rows are grouped by the batch's groups, not
by prompt id (two groups of one prompt are two independent draws); a row's baseline is fixed the
first time it is trained and reused when rollout replay trains it again
(``objectives.inputs.value_baseline``), since by then the probes have learned its outcome; and the
combinations where the other rows of a group depend on the row (LATR's shared prefixes, ARRoL's
joint pruning, rounds and ``finish_batch`` that follow outcomes, dynamic sampling, filters on the
rewards, SAPO's ``drop_zero_advantage``) are refused at load (``compat.check_independent_rows``).

[RECON] the abstract does not say which independent rollout is used (we take the next one of the
group), whether advantages are scaled (we do not scale: ``A = r - b``, as Dr. GRPO), nor how the probe
is trained (rollwise.value.predictor). The declared input ``value_baseline`` (B,) is ``b`` per row;
the estimator is a pure function of it.
"""

from __future__ import annotations

import torch

from rollwise.objectives.advantages import _all, _estimator, _Options
from rollwise.objectives.groups import Groups
from rollwise.registry import Compat
from rollwise.types import Advantages


class PoiseOptions(_Options):
    pass


def cross_rollout(values: torch.Tensor, group_index: torch.Tensor, state_zero: torch.Tensor) -> torch.Tensor:
    """(B,) baseline per row: the value of the *next* row of its group in batch order (the last row
    takes the first), or ``state_zero`` for a row alone in its group.
    Example: values (0.1, 0.2, 0.3, 0.9), groups (7, 7, 7, 8), state_zero (.., .., .., 0.4)
    -> (0.2, 0.3, 0.1, 0.4)."""
    if not (values.shape == group_index.shape == state_zero.shape) or values.dim() != 1:
        raise ValueError(
            f"values, group_index and state_zero must all be (B,), got {tuple(values.shape)}, "
            f"{tuple(group_index.shape)}, {tuple(state_zero.shape)}"
        )
    b = values.numel()
    if b == 0:
        return values.clone()
    order = torch.argsort(group_index, stable=True)  # rows grouped, batch order kept inside a group
    dense = Groups.of(group_index[order]).inverse
    pos = torch.arange(b)
    first = torch.full((int(dense.max()) + 1,), b).scatter_reduce(
        0, dense, pos, reduce="amin"
    )  # each group's first sorted slot
    last = torch.cat([dense[1:] != dense[:-1], torch.tensor([True])])
    nxt = torch.where(last, first[dense], (pos + 1).clamp_max(b - 1))  # the next slot of the group, cyclically
    out = torch.empty_like(values)
    out[order] = values[order[nxt]]
    alone = Groups.of(group_index).count(values) < 2
    return torch.where(alone, state_zero.to(values.dtype), out)


@_estimator(PoiseOptions)
def poise(rewards: torch.Tensor, groups: Groups, opts: PoiseOptions, value_baseline: torch.Tensor) -> Advantages:
    """``A_i = r_i - b_i`` with ``b`` the cross-rollout value baseline (module docstring).
    Example: r (1, 0, 1), b (0.25, 0.5, 0.75) -> A (0.75, -0.5, 0.25)."""
    if value_baseline.shape != rewards.shape:
        raise ValueError(f"value_baseline must be (B,) = {tuple(rewards.shape)}, got {tuple(value_baseline.shape)}")
    return Advantages(rewards - value_baseline.to(rewards.dtype), _all(rewards))


poise.inputs = ("value_baseline",)  # type: ignore[attr-defined]
poise.compat = Compat(needs_value=True, independent_rows=True)  # type: ignore[attr-defined]  (module docstring)
