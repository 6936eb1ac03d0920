"""``dars`` and ``dars_b``: Difficulty Adaptive Rollout Sampling and its breadth mode.

Paper: Yang et al. 2025, "Depth-Breadth Synergy in RLVR: Unlocking LLM Reasoning Gains with
Adaptive Exploration", arXiv 2508.13755; code github.com/yangzhch6/DARS at 9b21b714
(``verl/trainer/ppo/ray_dars_trainer.py``), docs/specs/allocation.md §1.

GRPO's cumulative advantage per prompt, ``S_total = N * S(p)``, peaks at ``p = 0.5`` and vanishes
as ``p -> 0``, so hard prompts are under-weighted. DARS runs two generation rounds per step:

1. **Stage 1** (``plan``): the step's prompts get ``N = control.rollouts_per_prompt`` rollouts each.
2. **Stage 2** (``next_round``): for each stage-1 group, ``p_hat`` = mean verified reward
   (``k / N`` for binary rewards), and the prompt gets ``ΔN = extra_rollouts(p_hat, N, N_max,
   schedule, std)`` more rollouts (a request for the same prompt, merged into its group by the
   worker pool). :func:`extra_rollouts` is the code's schedule:

   - ``p_hat <= 1e-6`` is replaced by ``0.5 / N`` ("half a success"); ``p_hat >= 0.5`` gives 0;
   - ``S(p) = 2p(1-p)``, ``A_peak = N/2`` (no-std mode, the released scripts'
     ``grpo_use_std=False``) or ``S(p) = 2 sqrt(p(1-p))``, ``A_peak = N`` (std mode);
   - ET (equal treatment): ``ΔN = ceil(A_peak / S(p_hat) - N)``;
     HW (hardness weighted): ``ΔN = ceil(2 (1 - p_hat) A_peak / S(p_hat) - N)``;
   - both capped at ``N_max - N`` (and at 0 from below).

   A third round is never asked for: after stage 2, ``next_round`` returns an empty plan.
3. The rest of the method is configuration, not controller code: drop groups whose *merged*
   accuracy is 0 or 1 with ``filter.names = ["zero_variance"]``; the mean-only advantage of the
   released scripts is ``advantage.name = "dr_grpo"`` (set ``std = true`` here when using the
   std-normalised ``grpo`` advantage, so the schedule matches it).

**Budget** (not in the paper, whose cost is simply variable): stage 1 and stage 2 together stay
within the per-step budget (:class:`~rollwise.control.budget.StepBudget`: ``control.budget_rollouts``
/ ``control.budget_tokens``). Without ``budget_rollouts`` the rollout cap defaults to the most the
schedule can ask for, ``prompts * N_max``, so it never binds. When it does bind, stage 1 trims the
last prompts (as ``uniform``) and stage 2 shrinks every top-up in proportion
(:func:`~rollwise.control.budget.scale_plan`), so all hard prompts keep part of their extra rollouts.

**DARS-B** (``dars_b``, :class:`DARSB`): the paper's breadth variant trains on a very large
prompt batch (3072 prompts, ``train_batch_size = ppo_mini_batch_size``: one full-batch optimizer
step per epoch) for ``ppo_epochs = 2`` epochs. It is a *mode* of this controller rather than its
own module because the part a controller can do is only the batch size: ``dars_b`` draws
``breadth * control.prompts_per_step`` prompts per step (``breadth`` default 4, ours; the paper's
3072 vs an [RECON] standard 128-512 prompts is 6-24x). The update is already full-batch here:
rollwise's trainer takes exactly one optimizer step over the whole batch (micro-batches
accumulate gradients exactly). The paper's second epoch is the trainer option ``train.epochs
= 2`` (one full-batch optimizer step per epoch; ``configs/dars_b.toml`` sets it): update epochs
are a trainer matter, not a controller's.

Differences from the paper / code, besides the budget and the epoch:

- ``N`` in the schedule is the stage-1 group's actual size (``rollouts_per_prompt`` unless the
  budget trimmed it) and ``p_hat`` is over its verified rollouts; a group with no verified
  rollout gets no top-up. Rewards need not be binary: ``p_hat`` is their mean.
- ``ceil`` is taken with a 1e-9 tolerance, so float noise in ``A_peak / S`` (e.g. 64.00000001)
  cannot add a rollout; this matches the table of docs/specs/allocation.md §1.2 exactly.
- The non-breadth hyper-parameters (batch size, mini-batches) are not in the released scripts;
  rollwise's defaults are used [RECON, docs/specs/allocation.md §1.3].
- The default ``N_max`` is the scripts' (32 for ET, 64 for HW); the paper pairs them that way.

Logs nothing of its own: ``control/rounds`` (2 when any prompt was topped up),
``control/budget_used`` and ``control/rollouts_per_prompt_{mean,min,max,p90}`` show the
allocation. With ``rates = "predicted"`` [ours, issue #31] ``p_hat`` is the pass-rate predictor's
(``value.enabled``) and each prompt gets ``N + ΔN`` in one round, before any of its rollouts.
State (checkpointed): the prompt stream and the per-prompt history; the stage-1 set
is per step and empty between steps, where checkpoints are taken.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rollwise.control.source import PromptSource, SourceController
from rollwise.registry import Compat
from rollwise.types import Group, Plan, Prompt, Request

ZERO_ACC = 1e-6  # p_hat at or below this counts as "no success" (the code's threshold)
DEFAULT_N_MAX = {"et": 32, "hw": 64}  # the released scripts' N_max per schedule


def extra_rollouts(p_hat: float, n: int, n_max: int, schedule: Literal["et", "hw"], std: bool) -> int:
    """ΔN, the stage-2 rollouts for a prompt with stage-1 accuracy ``p_hat`` over ``n`` rollouts.

    ``schedule``: "et" lifts the cumulative advantage to the peak level ``A_peak``; "hw" to
    ``2 (1 - p_hat) A_peak``. ``std``: the schedule of std-normalised advantages. The result is
    in ``[0, n_max - n]``. See the module docstring for the formulas and the table in the tests.
    """
    if schedule not in ("et", "hw"):
        raise ValueError(f"schedule must be 'et' or 'hw', got {schedule!r}")
    if n <= 0:
        return 0
    p = 0.5 / n if p_hat <= ZERO_ACC else p_hat
    if p >= 0.5:
        return 0
    if std:
        s, peak = 2.0 * math.sqrt(p * (1.0 - p)), float(n)
    else:
        s, peak = 2.0 * p * (1.0 - p), n / 2.0
    target = peak if schedule == "et" else 2.0 * (1.0 - p) * peak
    dn = math.ceil(target / s - n - 1e-9)
    return max(0, min(dn, n_max - n))


def accuracy(group: Group) -> float | None:
    """Mean verified reward of a group (``k / N`` for binary rewards); None if none verified."""
    scores = group.verified_rewards()
    return sum(scores) / len(scores) if scores else None


class DARSOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schedule: Literal["et", "hw"] = Field(
        "et",
        description="Top-up schedule: 'et' (equal treatment: lift every prompt with "
        "p_hat < 0.5 to the cumulative advantage of p = 0.5) or 'hw' (hardness weighted: "
        "target 2(1-p_hat) times that).",
    )
    n_max: int | None = Field(
        None,
        ge=1,
        description="Most rollouts per prompt over both stages, N_max "
        "(default 32 for 'et', 64 for 'hw', as the released scripts).",
    )
    std: bool = Field(
        False,
        description="Schedule for std-normalised advantages (advantage 'grpo'); false matches the "
        "released scripts' mean-only advantage (advantage 'dr_grpo').",
    )
    breadth: int = Field(
        1,
        ge=1,
        description="Prompts per step = breadth * control.prompts_per_step (DARS-B's large "
        "breadth batch; 1 = plain DARS).",
    )
    rates: Literal["observed", "predicted"] = Field(
        "observed",
        description="p_hat of the schedule: 'observed' in a stage-1 round (the paper), or 'predicted' by the "
        "pass-rate predictor (value.enabled) before any rollout, so N + delta_N go out in one round [ours].",
    )


class DARS(SourceController):
    """DARS (arXiv 2508.13755): stage-1 rollouts, then ΔN top-ups for prompts with p_hat < 0.5."""

    Options = DARSOptions
    # keeps_plan_state=True: select()/plan() reset and fill the stage-1 prompts that next_round tops up
    compat = Compat(needs_value=("rates", "predicted"), keeps_plan_state=True)

    def __init__(self, prompts: Sequence[Prompt], cfg, options: DARSOptions | None, seed: int):
        self.cfg = cfg
        self.opts = options if options is not None else self.Options()
        self.n = cfg.rollouts_per_prompt
        self.n_max = self.opts.n_max or DEFAULT_N_MAX[self.opts.schedule]
        self.prompts_per_step = self.opts.breadth * cfg.prompts_per_step
        # Without budget_rollouts the cap is the most the schedule can ask for (never binds).
        self.source = PromptSource(prompts, seed, cfg, self.prompts_per_step * max(self.n, self.n_max))
        self._stage1: set[str] = set()  # prompt ids planned for stage 1 this step, not yet topped up
        self.value = None  # the pass-rate predictor (rates = "predicted"), bound by the assembler

    def bind(self, services) -> None:
        self.value = services.value

    @property
    def budget(self) -> int:
        return self.step_budget.rollouts

    def select(self, state) -> list[Prompt]:
        self._stage1 = set()
        return self.stream.take(self.prompts_per_step)

    def plan(self, prompts: list[Prompt], state) -> Plan:
        if self.opts.rates == "predicted":  # one round: N plus the schedule's top-up for the predicted p
            pred = self.value.predict(prompts, state.policy_version)
            o = self.opts
            return self.source.cap(
                [
                    Request(p, self.n + extra_rollouts(pred[p.id], self.n, self.n_max, o.schedule, o.std))
                    for p in prompts
                ]
            )
        plan = self.source.cap([Request(p, self.n) for p in prompts])
        self._stage1 |= {r.prompt.id for r in plan.requests}
        return plan

    def top_ups(self, groups: list[Group]) -> list[Request]:
        """Stage-2 requests (before the budget) for the stage-1 groups among ``groups``."""
        out = []
        for g in groups:
            if g.prompt.id not in self._stage1:
                continue
            p_hat = accuracy(g)
            if p_hat is None:
                continue
            dn = extra_rollouts(p_hat, g.size, self.n_max, self.opts.schedule, self.opts.std)
            if dn > 0:
                out.append(Request(g.prompt, dn))
        return out

    def next_round(self, groups: list[Group], state) -> Plan:
        requests = self.top_ups(groups)
        self._stage1 -= {g.prompt.id for g in groups}  # each prompt is topped up at most once
        if not requests:
            return Plan()
        return self.source.cap(requests, groups, how="scale")

    def load_state_dict(self, s: dict) -> None:
        self.source.load_state_dict(s)
        self._stage1 = set()


class DARSBOptions(DARSOptions):
    breadth: int = Field(
        4,
        ge=1,
        description="Prompts per step = breadth * control.prompts_per_step (the large breadth "
        "batch; default 4 is ours, the paper uses 3072 prompts).",
    )


class DARSB(DARS):
    """DARS-B (arXiv 2508.13755, breadth): DARS with ``breadth`` times more prompts per step;
    the paper's two update epochs are ``train.epochs = 2`` (see the module docstring)."""

    Options = DARSBOptions
