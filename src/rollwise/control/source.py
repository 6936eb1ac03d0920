"""Where a stream-based controller's prompts come from, and the state its resume depends on.

:class:`PromptStream` is a seeded, epoch-wise shuffled stream over the train prompts (a new
permutation every epoch). :class:`PromptSource` holds the three parts every stream-based
controller keeps: the stream, the per-prompt history
(:class:`~rollwise.control.history.PromptHistory`) and the per-step budget
(:class:`~rollwise.control.budget.StepBudget`, which reads its length estimate from the history).
A controller holds one (``self.source``) and names its parts as its own attributes with
:class:`SourcePart` (``stream``, ``history``, ``step_budget``), so code that reads
``controller.stream`` (dynamic-sampling refill, APRIL's extra groups) is unchanged.

Checkpoints: :meth:`PromptSource.state_dict` gives ``{"stream": ..., "history": ...}``, which the
controller merges into its own state dict at the top level, the keys checkpoints have always had,
so a checkpoint written before this helper loads unchanged.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Literal

from rollwise.control.budget import StepBudget
from rollwise.control.history import PromptHistory
from rollwise.types import Controller, Group, Plan, Prompt, Request


def restore_rng(rng: random.Random, state) -> None:
    """Set ``rng`` to a ``getstate()`` saved in a checkpoint (the saved copy holds the state's inner
    tuple as a list)."""
    v, internal, gauss = state
    rng.setstate((v, tuple(internal), gauss))


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
        restore_rng(self.rng, s["rng"])


class PromptSource:
    """A prompt stream, the per-prompt history and the per-step budget, with their state.

    ``default_rollouts`` is the controller's rollout cap when ``control.budget_rollouts`` is unset
    (``StepBudget.from_config``); ``stream`` replaces the plain ``PromptStream(prompts, seed)``
    (a subclass, or a stream over another pool)."""

    def __init__(
        self,
        prompts: Sequence[Prompt],
        seed: int,
        control_cfg,
        default_rollouts: int | None,
        stream: PromptStream | None = None,
    ):
        self.stream = stream if stream is not None else PromptStream(prompts, seed)
        self.history = PromptHistory()
        self.step_budget = StepBudget.from_config(control_cfg, default_rollouts)

    def take(self, n: int) -> list[Prompt]:
        """The next ``n`` prompts of the stream."""
        return self.stream.take(n)

    def cap(
        self, requests: Sequence[Request], groups: Sequence[Group] = (), how: Literal["trim", "scale"] = "trim"
    ) -> Plan:
        """``requests`` fitted into what the step's budget has left after ``groups``."""
        return self.step_budget.cap(requests, self.history, groups, how=how)

    def remaining(self, groups: Sequence[Group] = ()) -> int | None:
        """Rollouts the step's budget still allows after ``groups`` (None: no cap)."""
        return self.step_budget.remaining(self.history, groups)

    def record(self, groups: list[Group], step: int) -> None:
        """Add ``groups`` to the history, dated by ``step`` and the stream's epoch."""
        self.history.record(groups, step, self.stream.epoch)

    def state_dict(self) -> dict:
        return {"stream": self.stream.state_dict(), "history": self.history.state_dict()}

    def load_state_dict(self, s: dict) -> None:
        self.stream.load_state_dict(s["stream"])
        self.history.load_state_dict(s["history"])


class SourcePart:
    """A controller attribute that is its ``source``'s attribute of the same name: in the class
    body, ``stream, history, step_budget = SourcePart(), SourcePart(), SourcePart()``. Assigning
    it (DRIVE's new stage-2 stream, V0.5's larger budget) assigns the source's."""

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, obj, owner=None):
        return self if obj is None else getattr(obj.source, self.name)

    def __set__(self, obj, value) -> None:
        setattr(obj.source, self.name, value)


class SourceController(Controller):
    """A controller drawing its prompts from ``self.source`` (a :class:`PromptSource`): ``stream``,
    ``history`` and ``step_budget`` read as the source's parts, ``observe`` records the step's groups
    in its history, and the checkpoint state is the source's. Subclasses override what they add."""

    stream, history, step_budget = SourcePart(), SourcePart(), SourcePart()

    def observe(self, groups: list[Group], state) -> None:
        self.source.record(groups, state.step)

    def state_dict(self) -> dict:
        return self.source.state_dict()

    def load_state_dict(self, s: dict) -> None:
        self.source.load_state_dict(s)
