"""``uniform``: the baseline controller. Each step draws ``prompts_per_step`` prompts from the
train split in a seeded shuffled order (a new permutation every epoch) and gives each
``rollouts_per_prompt`` rollouts in one round, capped by the per-step budget
(:class:`~rollwise.control.budget.StepBudget`: ``budget_rollouts``, default
``prompts_per_step * rollouts_per_prompt``, and ``budget_tokens``; the last prompts lose
rollouts first).

State: the data position (epoch, index), the shuffle RNG and the per-prompt history
(:class:`~rollwise.control.history.PromptHistory`), held by its
:class:`~rollwise.control.source.PromptSource`; all go into checkpoints.
"""

from __future__ import annotations

from collections.abc import Sequence

from rollwise.control.budget import cap_plan  # noqa: F401  (cap_plan: re-exported)
from rollwise.control.source import PromptSource, PromptStream, SourceController  # noqa: F401  (PromptStream: re-exported)
from rollwise.types import Plan, Prompt, Request


class Uniform(SourceController):
    def __init__(self, prompts: Sequence[Prompt], cfg, options, seed: int):
        self.cfg = cfg
        self.source = PromptSource(prompts, seed, cfg, cfg.prompts_per_step * cfg.rollouts_per_prompt)

    @property
    def budget(self) -> int:
        """Most rollouts per step (``budget_rollouts`` or ``prompts_per_step * rollouts_per_prompt``)."""
        return self.step_budget.rollouts

    def select(self, state) -> list[Prompt]:
        return self.source.take(self.cfg.prompts_per_step)

    def plan(self, prompts: list[Prompt], state) -> Plan:
        return self.source.cap([Request(p, self.cfg.rollouts_per_prompt) for p in prompts])
