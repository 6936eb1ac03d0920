"""``multi_attempt``: any single-turn task as an episode of up to ``max_attempts`` answers.

The policy answers the inner task's prompt; the inner verifier judges each answer. Correct: the
episode ends with reward 1. Wrong: the policy hears ``feedback`` (and, with ``repeat_prompt``, the
prompt again) and answers again, until ``max_attempts`` answers were wrong (reward 0). Turn rewards
are 0 for wrong answers and the score for the last one, so they sum to the episode's reward: 1 if
any attempt is correct. An answer the inner verifier cannot judge (score None) ends the episode
with that verdict (could not verify, never 0).

This is the math episode of R³L (arXiv 2601.03715; docs/specs/guidance.md §7a.1, step 1): up to
``max_attempts = 3`` answers, "Correct!" or "Incorrect... try again" after each, reward 1 if any
attempt is correct. Deviations: the feedback is one fixed line (R³L also has a format-error reply;
here an unparsable answer is just wrong), and the reflection and retry machinery of R³L is not
part of the environment.

**Anchor** (GiGPO's step groups, ``objectives/gigpo.py``): the environment's state is the number
of wrong answers so far (``"0 wrong"`` before the first): every wrong answer gets the same
feedback, so two episodes of one prompt that were wrong once are in one state whatever they
answered, and episodes with different counts never share a step group.

The inner task is built through ``rollwise.tasks.REGISTRY`` (``inner`` and ``inner_options``); its
prompts are the episode prompts (``task`` field ``multi_attempt``), and its warm-start targets
(``sft_examples``) are one-turn demonstrations.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rollwise.envs.base import StepResult
from rollwise.registry import Compat, UserError, record, validate_options
from rollwise.tasks._common import coerce_options
from rollwise.types import Prompt, Verdict

NAME = "multi_attempt"


class MultiAttemptEnv:
    def __init__(self, inner: Any, prompt: Prompt, options: make.Options):
        self.inner, self.prompt, self.options = inner, prompt, options
        self.attempts = 0

    def reset(self, seed: int) -> None:
        self.attempts = 0

    def step(self, action: str) -> StepResult:
        anchor = f"{self.attempts} wrong"  # the state this answer is given in (module docstring)
        self.attempts += 1
        v = self.inner.verify(self.prompt, action)
        if v.score is None or v.score >= 1.0 or self.attempts >= self.options.max_attempts:
            final = dataclasses.replace(v, details={**v.details, "attempts": self.attempts})
            return StepResult("", v.score, True, verdict=final, anchor=anchor)
        again = self.options.feedback + ("\n" + self.prompt.text if self.options.repeat_prompt else "")
        return StepResult(again, 0.0, False, info={"inner_verdict": v}, anchor=anchor)


class MultiAttemptTask:
    name = NAME

    def __init__(self, options: make.Options):
        from rollwise import tasks  # the registry of tasks: this task wraps one of them

        self.options = options
        res = tasks.REGISTRY.resolve(options.inner)
        self.inner = res.obj(res.arg, validate_options("task", options.inner, res.obj, dict(options.inner_options)))
        if record(res.obj).episodes:  # the inner task's declaration (its factory's compatibility record)
            raise UserError(f"task {NAME!r}: inner {options.inner!r} is already an environment task")
        relabel = lambda ps: tuple(dataclasses.replace(p, task=NAME) for p in ps)  # noqa: E731
        self._train, self._heldout = relabel(self.inner.train_prompts()), relabel(self.inner.heldout_prompts())

    def train_prompts(self) -> Sequence[Prompt]:
        return self._train

    def heldout_prompts(self) -> Sequence[Prompt]:
        return self._heldout

    def verify(self, prompt: Prompt, completion: str) -> Verdict:
        return self.inner.verify(prompt, completion)

    def environment(self, prompt: Prompt) -> MultiAttemptEnv:
        return MultiAttemptEnv(self.inner, prompt, self.options)

    def episode_examples(self, n: int, seed: int) -> list[tuple[Prompt, tuple[tuple[str, str], ...]]]:
        """One-turn demonstrations: the inner task's warm-start targets (a correct first answer)."""
        if not hasattr(self.inner, "sft_examples"):
            raise UserError(f"task {NAME!r}: inner {self.options.inner!r} has no warm-start examples")
        return [(dataclasses.replace(p, task=NAME), ((t, ""),)) for p, t in self.inner.sft_examples(n, seed)]


def make(arg: str | None, options=None) -> MultiAttemptTask:
    """Task factory: ``multi_attempt`` (no argument; the inner task is an option)."""
    if arg:
        raise UserError(f"task {NAME!r} takes no argument (got '{NAME}:{arg}'); set options.inner")
    return MultiAttemptTask(coerce_options(make.Options, options, NAME))


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")

    inner: str = Field(default="arithmetic", description="the single-turn task to retry, a task name like 'arithmetic'")
    inner_options: dict[str, Any] = Field(default_factory=dict, description="options of the inner task")
    max_attempts: int = Field(default=3, ge=1, le=100, description="answers allowed per episode")
    feedback: str = Field(default="wrong, try again", description="what the policy hears after a wrong answer")
    repeat_prompt: bool = Field(default=True, description="repeat the prompt's text after the feedback")

    @field_validator("inner")
    @classmethod
    def _inner(cls, v: str) -> str:
        if v.split(":", 1)[0] == NAME:
            raise ValueError(f"inner cannot be {NAME!r} itself")
        return v


make.Options = _Options
make.compat = Compat(
    episodes=True
)  # an environment task: rollwise.compat checks the episode keys from the config alone
