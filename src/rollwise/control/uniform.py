"""``uniform``: the baseline controller. Each step draws ``prompts_per_step`` prompts from the
train split in a seeded shuffled order (a new permutation every epoch) and gives each
``rollouts_per_prompt`` rollouts in one round, capped by the per-step budget
(:class:`~rollwise.control.budget.StepBudget`: ``budget_rollouts``, default
``prompts_per_step * rollouts_per_prompt``, and ``budget_tokens``; the last prompts lose
rollouts first).

State: the data position (epoch, index), the shuffle RNG and the per-prompt history
(:class:`~rollwise.control.history.PromptHistory`); all go into checkpoints.
"""

from __future__ import annotations

import random
from typing import Sequence

from rollwise.control.base import Controller
from rollwise.control.budget import StepBudget, cap_plan  # noqa: F401  (cap_plan: re-exported)
from rollwise.control.history import PromptHistory
from rollwise.types import Group, Plan, Prompt, Request


class PromptStream:
    """Seeded epoch-wise shuffled stream over the train prompts (shared by controllers)."""

    def __init__(self, prompts: Sequence[Prompt], seed: int):
        self.prompts = list(prompts)
        self.rng = random.Random(seed)
        self.epoch, self.index = 0, 0
        self.order = self._permute()

    def _permute(self) -> list[int]:
        order = list(range(len(self.prompts)))
        self.rng.shuffle(order)
        return order

    def take(self, n: int) -> list[Prompt]:
        out = []
        while len(out) < n:
            if self.index >= len(self.order):
                self.epoch, self.index = self.epoch + 1, 0
                self.order = self._permute()
            out.append(self.prompts[self.order[self.index]])
            self.index += 1
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index, "order": self.order, "rng": self.rng.getstate()}

    def load_state_dict(self, s: dict) -> None:
        self.epoch, self.index, self.order = s["epoch"], s["index"], list(s["order"])
        v, internal, gauss = s["rng"]
        self.rng.setstate((v, tuple(internal), gauss))


class Uniform(Controller):
    def __init__(self, prompts: Sequence[Prompt], cfg, options, seed: int):
        self.cfg = cfg
        self.stream = PromptStream(prompts, seed)
        self.history = PromptHistory()
        self.step_budget = StepBudget.from_config(cfg, cfg.prompts_per_step * cfg.rollouts_per_prompt)

    @property
    def budget(self) -> int:
        """Most rollouts per step (``budget_rollouts`` or ``prompts_per_step * rollouts_per_prompt``)."""
        return self.step_budget.rollouts

    def select(self, state) -> list[Prompt]:
        return self.stream.take(self.cfg.prompts_per_step)

    def plan(self, prompts: list[Prompt], state) -> Plan:
        return self.step_budget.cap([Request(p, self.cfg.rollouts_per_prompt) for p in prompts], self.history)

    def next_round(self, groups: list[Group], state) -> Plan:
        return Plan()

    def observe(self, groups: list[Group], state) -> None:
        self.history.record(groups, state.step, self.stream.epoch)

    def state_dict(self) -> dict:
        return {"stream": self.stream.state_dict(), "history": self.history.state_dict()}

    def load_state_dict(self, s: dict) -> None:
        self.stream.load_state_dict(s["stream"])
        self.history.load_state_dict(s["history"])
