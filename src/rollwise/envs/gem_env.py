"""GEM environments as text episodes: ``gem:<env_id>``, e.g. ``gem:game:GuessTheNumber-v0-easy``.

``gem-llm`` is optional (``pip install 'rollwise[gem]'``) and imported only here, on use. It pins
``reasoning_gym`` and ``nltk`` to versions of its own, so it is not in the ``test`` extra; install it
where those pins do not clash with the rest (e.g. ``pip install --no-deps --target DIR gem-llm`` and
``DIR`` on ``PYTHONPATH``). ``gem`` alone is ``gem:game:GuessTheNumber-v0-easy``.

GEM's API is gymnasium's, for text: ``env = gem.make(env_id)``, ``obs, info = env.reset(seed=...)``,
``obs, reward, terminated, truncated, info = env.step(action_text)``. The adapter:

- the prompt is the reset observation (the game's instructions), or the option ``instructions``;
- each turn the policy's text is the action as it is (GEM's games read the last ``\\boxed{...}``);
  the observation is GEM's next observation;
- the turn's reward is GEM's; the episode ends when GEM terminates or truncates it. Its verdict
  is the sum of the rewards (GEM's return), reason ``success`` (last reward >= 1), ``truncated``
  or ``failure``; an episode that GEM truncates without terminating it has no result (a time
  limit outside the game): *could not verify* (score None, reason ``truncated``), never 0. An
  episode cut by ``task.max_turns`` scores the sum of its turn rewards, like the other
  environment tasks: set ``task.max_turns`` to at least the game's own turn limit;
- ``anchor`` (GiGPO's step groups) is the text the action was taken on: the reset observation and
  every action and observation since (GEM's observations describe one turn, not the state).

Prompts are reset seeds: held-out ``seed*10_000_000 + i``, train from ``+ 5_000_000`` (disjoint
seed ranges, as ``gym:``). GEM seeds the global ``random`` and ``numpy.random`` in ``reset``; each
environment keeps its own copy of both (``rollwise.envs._library``), so an episode is a function of
its seed and actions with episodes stepping in parallel. No demonstrations.

Offline (gem-llm 0.1.0; each ``game:`` id made, reset and stepped with sockets and
``nltk.download`` blocked): GuessTheNumber, Mastermind, Minesweeper, FifteenPuzzle (easy, hard),
Sudoku, TowerofHanoi, Game2048, Sokoban and Crosswords (easy, hard) need nothing from the network.
Wordle, Hangman and WordSearch need nltk's ``words`` corpus (GEM downloads it when missing);
FifteenPuzzle-v0-random and Crosswords-v0-random fail in 0.1.0. GEM's ``math:``, ``code:``,
``qa:`` and ``eval:`` environments load Hugging Face datasets (network) and ``rg:`` wraps
reasoning-gym; rollwise's own ``reasoning_gym:`` and ``hf:`` tasks cover those single-turn.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field

from rollwise.envs._library import LibraryOptions, LibraryRandom, LibraryTask, why
from rollwise.envs.base import StepResult
from rollwise.registry import Compat, UserError
from rollwise.tasks._common import coerce_options
from rollwise.types import Verdict

DEFAULT = "game:GuessTheNumber-v0-easy"
_BOXED = re.compile(r"\\boxed\{[^{}]*\}")
OFFLINE = " (rollwise.envs.gem_env lists the games known to work offline)"


def gem(task: str = "gem"):
    try:
        import gem as g
    except ImportError as e:
        raise UserError(f"task {task!r} needs GEM (gem-llm): pip install 'rollwise[gem]'") from e
    return g


class GemEnv:
    """One episode of a GEM environment (see the module docstring)."""

    def __init__(self, env: Any, instructions: str = ""):
        self.env, self.instructions = env, instructions
        self.rng = LibraryRandom()
        self.first, self.history, self.total = "", "", 0.0

    def reset(self, seed: int) -> None:
        with self.rng.use(seed):
            obs, _ = self.env.reset(seed=seed)
        self.first = self.history = self.instructions or str(obs).strip("\n")
        self.total = 0.0

    def step(self, action: str) -> StepResult:
        before = self.history
        with self.rng.use():
            obs, reward, terminated, truncated, _ = self.env.step(action)
        obs, reward = str(obs).strip("\n"), float(reward)
        self.total += reward
        self.history = f"{before}\n{action}\n{obs}"
        if not (terminated or truncated):
            return StepResult(f"\n{obs}\n", reward, anchor=before)
        if not terminated:
            return StepResult("", reward, True, verdict=Verdict(None, "truncated", {"final": obs}), anchor=before)
        why = "success" if reward >= 1.0 else "truncated" if truncated else "failure"
        return StepResult("", reward, True, verdict=Verdict(self.total, why, {"final": obs}), anchor=before)


class GemTask(LibraryTask):
    """``gem:<env_id>`` (see the module docstring)."""

    ACTIONS = _BOXED  # what verify replays

    def __init__(self, env_id: str, options: make.Options):
        self.env_id, self.options, self.name = env_id, options, f"gem:{env_id}"
        self.gem = gem(self.name)
        base = options.seed * 10_000_000
        try:
            self.make_env().reset(base)
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001  e.g. a corpus or data set it would download
            raise UserError(f"task {self.name!r}: GEM cannot start it: {why(e)}{OFFLINE}") from e
        self._splits(base)

    def make_env(self) -> GemEnv:
        try:
            with LibraryRandom().use(0):  # GEM's games reset (and draw) when constructed
                env = self.gem.make(self.env_id, **self.options.env_kwargs)
        except Exception as e:  # noqa: BLE001  an unknown id, a game that does not start
            raise UserError(f"task {self.name!r}: GEM cannot make it: {why(e)}{OFFLINE}") from e
        return GemEnv(env, self.options.instructions)


def make(arg: str | None, options=None) -> GemTask:
    """Task factory: ``gem:<env_id>`` (``gem`` alone: ``gem:game:GuessTheNumber-v0-easy``)."""
    env_id = arg or DEFAULT
    return GemTask(env_id, coerce_options(make.Options, options, f"gem:{env_id}"))


class _Options(LibraryOptions):
    env_kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of gem.make")
    instructions: str = Field(
        default="", description="text shown in place of the reset observation (the instructions); empty: GEM's own"
    )


make.Options = _Options
make.compat = Compat(
    episodes=True
)  # an environment task: rollwise.compat checks the episode keys from the config alone
