"""TextArena games as text episodes: ``textarena:<env_id>`` (TextArena, arXiv 2504.11442).

``textarena`` is optional (``pip install 'rollwise[textarena]'``) and imported only here, on use.
``textarena`` alone is ``textarena:GuessTheNumber-v0``.

Single-player games only: the policy is player 0 of ``env.reset(num_players=1, seed=...)``. A game
whose state is not TextArena's single-player state (two-player and free-for-all games) is refused
when the task loads, naming the task. TextArena's own observation and action wrappers are taken
off (the pool appends each turn's *new* text; the wrappers re-send the whole history each turn):

- the prompt is the game's first observation (its instructions and first board), or the option
  ``instructions`` in place of the instructions;
- each turn the policy's text is the action, wrapped in ``[...]`` when it has no bracket (as
  TextArena's ``ActionFormattingWrapper`` does; option ``bracket_actions``); the observation is
  the game's new messages to player 0, one a line, without the echo of the action;
- the turn's reward is 0 until the game ends; on the last turn it is TextArena's reward of player 0
  (``env.close()``), which is also the episode's verdict: reason ``success`` (reward >= 1),
  ``invalid_move`` (TextArena ended the game on invalid moves) or ``failure``, with TextArena's
  reason in ``details``. A game that ends with no reward is *could not verify* (score None, reason
  ``no_outcome``), never 0. An episode cut by ``task.max_turns`` before the game ends scores the
  sum of its turn rewards, 0, like the other environment tasks: set ``task.max_turns`` to at least
  the game's own turn limit to get the game's verdict (e.g. GuessTheNumber-v0's partial credit);
- ``anchor`` (GiGPO's step groups) is the text the action was taken on: the game's first
  observation and every action and observation since (two turns share a step group only when
  they act on the same history, which in a seeded game is the same state).

Prompts are reset seeds: held-out ``seed*10_000_000 + i``, train from ``+ 5_000_000`` (disjoint
seed ranges, as ``gym:``; a game with few distinct boards, e.g. 20 secrets, repeats boards across
seeds). Each environment keeps its own copy of the global random state TextArena draws from
(``rollwise.envs._library``), so an episode is a function of its seed and actions even with
episodes stepping in parallel. No demonstrations (``episode_examples`` is empty).

Offline (TextArena 0.7.4; each single-player id made, reset and stepped with sockets and
``nltk.download`` blocked): 2048, Bandit, Blackjack, Countdown, Crosswords, Cryptarithm,
FifteenPuzzle, FrozenLake, GuessTheNumber, LightsOut, LogicPuzzle, Mastermind, Minesweeper,
PegJump, RushHour, Secretary, Set, Slitherlink, Sokoban, Sudoku, ThreeCardMonte and TowerOfHanoi
(every variant of each) need nothing from the network. Hangman, Wordle, WordLadder, WordSearch and
SpellingBee call ``nltk.download`` (the ``words`` corpus and others) when made: install those
corpora beforehand to run them offline; TwentyQuestions and GuessWho need an OpenRouter API key;
Klondike does not import (a syntax error in 0.7.4). A game that fails to start is refused at load
with its error.
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

DEFAULT = "GuessTheNumber-v0"
_ACTION = re.compile(r"\[[^\[\]]*\]")


OFFLINE = " (rollwise.envs.textarena_env lists the single-player games known to work offline)"


def textarena(task: str = "textarena"):
    try:
        import textarena as ta
    except ImportError as e:
        raise UserError(f"task {task!r} needs textarena: pip install 'rollwise[textarena]'") from e
    return ta


def unwrapped(env: Any, ta) -> Any:
    while isinstance(env, ta.Wrapper):
        env = env.env
    return env


class TextArenaEnv:
    """One episode of a single-player TextArena game (see the module docstring)."""

    def __init__(self, env: Any, ta, instructions: str = "", bracket_actions: bool = True):
        self.env, self.ta, self.instructions, self.bracket = env, ta, instructions, bracket_actions
        self.rng = LibraryRandom()
        self.first, self.history = "", ""

    def text(self, messages) -> str:
        """Player 0's new messages, one a line (the echo of its own action left out)."""
        kinds = self.ta.ObservationType
        lines = []
        for _, message, kind in messages:
            if kind == kinds.PLAYER_ACTION:
                continue
            if kind == kinds.PROMPT and self.instructions:
                message = self.instructions
            lines.append(str(message).strip("\n"))
        return "\n".join(lines)

    def reset(self, seed: int) -> None:
        with self.rng.use(seed):
            self.env.reset(num_players=1, seed=seed)
            _, messages = self.env.get_observation()
        self.single = isinstance(getattr(self.env, "state", None), self.ta.SinglePlayerState)
        self.first = self.history = self.text(messages)

    def step(self, action: str) -> StepResult:
        move = action.strip()
        if self.bracket and "[" not in move and "]" not in move:
            move = f"[{move}]"
        before = self.history
        with self.rng.use():
            done, _ = self.env.step(move)
            _, messages = self.env.get_observation()
            rewards, game_info = self.env.close() if done else (None, None)
        observation = self.text(messages)
        self.history = f"{before}\n{action}\n{observation}"
        if not done:
            return StepResult(f"\n{observation}\n", 0.0, anchor=before)
        info = (game_info or {}).get(0, {})
        details = {"reason": str(info.get("reason", "")), "final": observation}
        score = None if not rewards or rewards.get(0) is None else float(rewards[0])
        if score is None:
            verdict = Verdict(None, "no_outcome", details)
        else:
            why = "success" if score >= 1.0 else "invalid_move" if info.get("invalid_move") else "failure"
            verdict = Verdict(score, why, details)
        return StepResult("", score, True, verdict=verdict, anchor=before)


class TextArenaTask(LibraryTask):
    """``textarena:<env_id>`` (see the module docstring)."""

    ACTIONS = _ACTION  # what verify replays

    def __init__(self, env_id: str, options: make.Options):
        self.env_id, self.options, self.name = env_id, options, f"textarena:{env_id}"
        self.ta = textarena(self.name)
        probe = self.make_env()
        base = options.seed * 10_000_000
        try:
            probe.reset(base)
        except (AssertionError, ValueError) as e:  # the games' own checks of num_players
            if "player" in str(e).lower():
                self._multi(e)
            raise UserError(f"task {self.name!r}: TextArena cannot start it: {why(e)}") from e
        except Exception as e:  # noqa: BLE001  e.g. a corpus it would download, an API key it needs
            raise UserError(f"task {self.name!r}: TextArena cannot start it: {why(e)}{OFFLINE}") from e
        if not probe.single:
            self._multi(None)
        self._splits(base)

    def _multi(self, e: Exception | None):
        why = f" ({e})" if e else ""
        raise UserError(
            f"task {self.name!r}: a multi-player TextArena game{why}; rollwise plays single-player "
            "TextArena games only (num_players=1), e.g. 'textarena:GuessTheNumber-v0'"
        )

    def make_env(self) -> TextArenaEnv:
        try:
            with LibraryRandom().use(0):  # some games draw at construction
                env = self.ta.make(self.env_id, **self.options.env_kwargs)
        except Exception as e:  # noqa: BLE001  an unknown id, a game that does not import
            raise UserError(f"task {self.name!r}: TextArena cannot make it: {why(e)}{OFFLINE}") from e
        return TextArenaEnv(unwrapped(env, self.ta), self.ta, self.options.instructions, self.options.bracket_actions)


def make(arg: str | None, options=None) -> TextArenaTask:
    """Task factory: ``textarena:<env_id>`` (``textarena`` alone: ``textarena:GuessTheNumber-v0``)."""
    env_id = arg or DEFAULT
    return TextArenaTask(env_id, coerce_options(make.Options, options, f"textarena:{env_id}"))


class _Options(LibraryOptions):
    env_kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of textarena.make")
    instructions: str = Field(
        default="",
        description="text shown in place of the game's instructions (its prompt message); empty: the game's own",
    )
    bracket_actions: bool = Field(
        default=True, description="wrap an action that has no '[' or ']' in brackets (TextArena's action format)"
    )


make.Options = _Options
make.compat = Compat(
    episodes=True
)  # an environment task: rollwise.compat checks the episode keys from the config alone
