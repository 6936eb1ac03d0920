"""The environment protocol of multi-turn episodes (docs/architecture.md §11).

An environment task is a ``Task`` (train / held-out prompts, ``verify``) that also makes one
environment per episode::

    env = task.environment(prompt)          # a fresh environment for one episode of ``prompt``
    env.reset(seed)                         # seed = prompt.metadata["seed"] (0 when absent)
    result = env.step(action_text)          # the policy's decoded turn -> StepResult

The prompt's text (or messages) is the first observation the policy sees: the task builds it, so
``reset`` returns nothing to show. Every later observation (tool output, feedback, the next board)
is the ``StepResult.observation`` of the step before; the episode pool tokenises it and *appends*
it after the policy's tokens, never re-tokenising the conversation.

``step`` runs in a worker thread of the episode pool (environments of different episodes step
concurrently), so an environment must not share mutable state with other episodes' environments.
Tools that run model-written code run in the code verifier's sandbox (``rollwise.verify.sandbox``).

**Forking** (episode branching, ``rollwise.generate.branching``, issue #44). An environment whose
state can be copied mid-episode declares it: the class attribute ``forkable = True`` and
``fork() -> Environment``, a new environment in the same state (everything a later ``step`` reads,
deep-copied) that steps independently of the original from then on. The task's factory declares the
same in its compatibility record (``Compat(forkable=True)``), which ``rollwise.compat.check_branching``
reads at load: ``sampling.branching`` is refused for a task whose environments cannot be forked. An
environment without the attribute is not forkable (the branching pool reads the declaration, never
probes for a ``fork`` method).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from rollwise.types import Prompt, ToolCall, Verdict


@dataclass(frozen=True)
class StepResult:
    """What one environment step returns."""

    observation: str  # text appended after the policy's turn ("" when done)
    reward: float | None = 0.0  # this turn's reward; None = could not verify (never read as 0)
    done: bool = False
    tool_calls: tuple[ToolCall, ...] = ()  # the tool calls this step ran
    # The episode's verdict when ``done`` (its score is the trajectory reward); None = the pool
    # uses Verdict(sum of the turn rewards) (None when any turn reward is None).
    verdict: Verdict | None = None
    anchor: str | None = None  # a key of the state this step acted on (GiGPO step groups); None = none
    info: Mapping[str, Any] = field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    def reset(self, seed: int) -> None: ...

    def step(self, action: str) -> StepResult: ...


@runtime_checkable
class ForkableEnvironment(Environment, Protocol):
    """An environment that can be forked mid-episode (module docstring, "Forking")."""

    forkable: bool  # True: declared, read by the branching pool

    def fork(self) -> Environment: ...


@runtime_checkable
class EnvTask(Protocol):
    """A task whose rollouts are episodes (see the module docstring)."""

    name: str

    def train_prompts(self) -> Sequence[Prompt]: ...

    def heldout_prompts(self) -> Sequence[Prompt]: ...

    def verify(self, prompt: Prompt, completion: str) -> Verdict: ...

    def environment(self, prompt: Prompt) -> Environment: ...

    def episode_examples(self, n: int, seed: int) -> list[tuple[Prompt, tuple[tuple[str, str], ...]]]:
        """``n`` demonstrations for the warm start: (prompt, ((action, observation[, role]), ...)); the
        last observation is ""; the warm start trains on the actions only (observations masked). ``role``
        ("user" when absent) is the chat message the observation is shown in: "tool" after an action
        that called a tool, as the episode pool shows it (``tokens.episode_ids``)."""
        ...


def makes_environments(task: Any) -> bool:
    """True for a built task that makes environments. Not a mode switch: a task declares episodes in
    its factory's compatibility record (``Compat(episodes=True)``, read by
    ``rollwise.compat.declares_episodes``); the assembler only checks that the built task agrees."""
    return callable(getattr(task, "environment", None))
