"""``ace``: asymmetric confidence penalties for wrong rollouts, on top of the GRPO advantage.

Paper: "Overconfident Errors Need Stronger Correction: Asymmetric Confidence Penalties for
Reinforcement Learning" (ACE), arXiv 2602.21420 (LinkedIn; no code found); allocation.md §12b.

For rollout i the confidence shift is ``c_i = log pi(y_i|x) - log pi_ref(y_i|x)``, the sum of
the token log-ratios over the completion [PAPER]. Rows with a negative advantage are amplified::

    A'_i = A_i * (1 + alpha * softplus(c_i))     if A_i < 0
    A'_i = A_i                                   otherwise

so an error the policy has become *more* confident in than the reference gets a stronger push
down. ``A`` is the ``grpo`` estimator's advantage (same ``eps`` / ``std`` options).

[RECON] parts (the spec marks them reconstructions; unverified):

- the exact modulation (the notes say "scales negative advantages by a softplus of the
  log-policy difference"); ``softplus(0) = ln 2``, so a neutral error is amplified by
  ``1 + 0.69 alpha``. Option ``center = true`` uses ``softplus(c_i) - ln 2`` instead (then a
  neutral error is unchanged, and an error the policy became *less* sure of is damped, but never
  below 0 because ``|A'| >= |A| (1 - alpha ln 2)`` is clamped to ``|A|`` — see below);
- ``alpha = 1``;
- ``log pi`` is the rollout (sampler) policy's log-probs, detached; ``log pi_ref`` the frozen
  reference (the initial model) recomputed by the trainer (with ``sampling.top_p < 1`` the sampler's
  log-probs are renormalised over the nucleus, which shifts ``c`` up). Option ``length_normalise`` divides
  ``c_i`` by the completion length (the spec suggests considering it for long CoT; unverified).

Deviation: with ``center = true`` the multiplier is clamped at 1 from below, so the property
"|A'| >= |A| for wrong rows" (allocation.md §12b.3) holds in both modes.

Inputs: ``confidence_shift`` (B,) float, computed by
:func:`rollwise.objectives.inputs.confidence_shift` from the run (the trainer keeps a frozen
reference copy of the initial model whenever this estimator is chosen: ``ace.needs_reference``).
Properties (§12b.3): positive advantages unchanged; for wrong rows ``|A'|`` increases with ``c_i``
and is ``>= |A|``; a zero-advantage group (all wrong) stays 0.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pydantic import Field

from rollwise.objectives.advantages import GrpoOptions, grpo
from rollwise.types import Advantages


class AceOptions(GrpoOptions):
    alpha: float = Field(
        1.0,
        ge=0.0,
        description="Amplification scale alpha in A*(1 + alpha*softplus(c)) for wrong rows (spec [RECON] 1.0).",
    )
    center: bool = Field(
        False,
        description="Use softplus(c) - ln 2 (a neutral error is not amplified), multiplier floored at 1; "
        "the spec notes the paper may centre it (unverified).",
    )
    length_normalise: bool = Field(
        False, description="Divide c_i by the completion length (tokens) before the softplus (unverified)."
    )


def amplify(advantages: torch.Tensor, shift: torch.Tensor, alpha: float, center: bool = False) -> torch.Tensor:
    """``A * (1 + alpha * softplus(c))`` where ``A < 0``, else ``A`` (see the module docstring).

    Example: A = [0.866, -0.866], c = [0.0, 1.0], alpha = 1 -> softplus(1) = 1.3133
    -> A' = [0.866, -0.866 * 2.3133 = -2.0033].
    """
    sp = F.softplus(shift.to(advantages.dtype))
    if center:
        sp = sp - math.log(2.0)
    mult = (1.0 + alpha * sp).clamp(min=1.0)
    return torch.where(advantages < 0, advantages * mult, advantages)


def ace(
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    opts: AceOptions | None = None,
    *,
    confidence_shift: torch.Tensor | None = None,
    completion_lengths: torch.Tensor | None = None,
) -> Advantages:
    """GRPO advantage with ACE's amplification of wrong rows by their confidence shift."""
    opts = opts or AceOptions()
    if confidence_shift is None:
        raise ValueError(
            "advantage 'ace' needs confidence_shift (B,): sum_t log mu - log pi_ref per rollout "
            "(rollwise.objectives.inputs.confidence_shift)"
        )
    if confidence_shift.shape != rewards.shape:
        raise ValueError(
            f"confidence_shift must be (B,) like rewards, got {tuple(confidence_shift.shape)} and "
            f"{tuple(rewards.shape)}"
        )
    if not torch.isfinite(confidence_shift).all():
        raise ValueError("confidence_shift contains NaN or inf")
    base = grpo(rewards, group_index, GrpoOptions(**{k: getattr(opts, k) for k in GrpoOptions.model_fields}))
    c = confidence_shift.detach().to(base.values.dtype)
    if opts.length_normalise:
        if completion_lengths is None:
            raise ValueError("ace.length_normalise needs completion_lengths (B,)")
        c = c / completion_lengths.to(c.dtype).clamp(min=1.0)
    return Advantages(amplify(base.values, c, opts.alpha, opts.center), base.include)


ace.Options = AceOptions  # type: ignore[attr-defined]
ace.inputs = ("confidence_shift", "completion_lengths")  # type: ignore[attr-defined]
ace.needs_reference = True  # type: ignore[attr-defined]
