"""``novelty``: XRPO's novelty-aware advantage sharpening on top of the GRPO advantage.

Paper: "Pushing the limits of GRPO with Targeted Exploration and Exploitation" (XRPO),
arXiv 2510.06672, allocation.md §2.3 [SEC + 3P-CODE; the official code was not obtainable].

For rollout i of a group, ``s_i`` is its length-normalised log-likelihood (mean per-token
log-prob of the completion). Then

- novelty ``eta_i = exp(s_i - s_bar)``, ``s_bar`` the group mean of ``s`` (over all rows by
  default; ``mean_over="correct"`` averages over the rows with ``A_i > 0`` — the spec marks
  the choice as unverified);
- for rows with ``A_i > 0`` (correct responses): ``A+_i = A_i + min(max(lam*(1 - eta_i), 0), kappa*A_i)``,
  so only below-average-likelihood correct responses get a bonus, capped at ``kappa*A_i``;
- every other row keeps ``A_i``.

``A`` is the ``grpo`` estimator's advantage (same ``eps`` and ``std`` options). Properties
(allocation.md §2.6): a correct row with ``s_i < s_bar`` gets ``A+ in (A, (1+kappa) A]``; a
correct row with ``s_i >= s_bar``, every wrong row, and every row of a group with equal ``s``
are unchanged. A group with equal rewards keeps advantage 0.

Differences from the sources: the third-party code adds the bonus to *all* rows (wrong ones
too, and caps with ``kappa*|A|``); here only ``A_i > 0`` rows get it, as the paper's "amplify
low-probability yet correct responses" says. ``kappa = 0.5`` is the spec's [RECON] start value
(the third-party code uses 1.0); ``lam = 1.0`` as there.

Inputs. ``s`` is not a function of rewards and group ids, so this estimator takes one more
input: ``seq_logprob`` (B,) float, the mean *sampler* log-prob of each row's completion tokens
(``Rollout.logprobs``, i.e. the behaviour policy, detached — the spec says so), computed by
:func:`sequence_logprob` from the batch's rows. The estimator declares it in ``novelty.inputs``;
:func:`advantage_inputs` builds the keyword arguments for any estimator that declares inputs,
and the loop passes them:
``parts.advantage(rewards, gidx, opts, **advantage_inputs(parts.advantage, rows))`` (loop.py). Called
without ``seq_logprob`` the estimator raises (it never silently degrades to plain GRPO).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from rollwise.objectives.advantages import GrpoOptions, grpo
from rollwise.objectives.groups import Groups
from rollwise.objectives.inputs import advantage_inputs, sequence_logprob  # noqa: F401 (re-exported)
from rollwise.types import Advantages


class NoveltyOptions(GrpoOptions):
    lam: float = Field(1.0, ge=0.0, description="lambda_nov: bonus scale lam*(1 - eta) (third-party code: 1.0).")
    kappa: float = Field(
        0.5, ge=0.0, description="Cap: the bonus is at most kappa*A (spec [RECON] start value 0.5; third-party 1.0)."
    )
    mean_over: Literal["all", "correct"] = Field(
        "all",
        description="Rows whose s enters the group mean s_bar: 'all' rows or only the 'correct' ones (A > 0); "
        "unverified in the paper.",
    )


def novelty(
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    opts: NoveltyOptions | None = None,
    *,
    seq_logprob: torch.Tensor | None = None,
) -> Advantages:
    """GRPO advantage plus the bounded novelty bonus for correct, below-average-likelihood rows.

    Example (one group, unbiased std, lam=1, kappa=0.5): r = [1, 1, 0, 0] -> A = [0.866, 0.866,
    -0.866, -0.866]; s = [-1.0, -0.5, -0.5, -0.5] -> s_bar = -0.625, eta_0 = exp(-0.375) = 0.6873,
    bonus_0 = min(0.3127, 0.433) = 0.3127 -> A+_0 = 1.1787; eta_1 = exp(0.125) > 1 -> no bonus.
    """
    opts = opts or NoveltyOptions()
    if seq_logprob is None:
        raise ValueError(
            "advantage 'novelty' needs seq_logprob (B,): the mean sampler log-prob per rollout "
            "(rollwise.objectives.novelty.sequence_logprob / advantage_inputs)"
        )
    if seq_logprob.shape != rewards.shape:
        raise ValueError(
            f"seq_logprob must be (B,) like rewards, got {tuple(seq_logprob.shape)} and {tuple(rewards.shape)}"
        )
    if not torch.isfinite(seq_logprob).all():
        raise ValueError("seq_logprob contains NaN or inf")
    base = grpo(rewards, group_index, GrpoOptions(eps=opts.eps, std=opts.std))
    a = base.values
    s = seq_logprob.detach().to(a.dtype)
    groups = Groups.of(group_index)
    if opts.mean_over == "all":
        s_bar = groups.mean(s)
    else:
        w = (a > 0).to(a.dtype)
        s_bar = groups.sum(s * w) / groups.sum(w).clamp(min=1.0)
    eta = torch.exp(s - s_bar)
    bonus = torch.minimum((opts.lam * (1.0 - eta)).clamp(min=0.0), opts.kappa * a)
    sharpened = torch.where(a > 0, a + bonus, a)
    return Advantages(sharpened, base.include)


novelty.Options = NoveltyOptions  # type: ignore[attr-defined]
novelty.inputs = ("seq_logprob",)  # type: ignore[attr-defined]
