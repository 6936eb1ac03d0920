"""Gymnasium environments as text episodes: ``frozenlake`` and the generic ``gym:<env_id>``.

``gymnasium`` is optional (``pip install gymnasium``, or the ``envs`` extra) and imported only here,
on use. ``GymEnv`` wraps one gymnasium environment with a ``Discrete`` action space and an
``ansi`` rendering: each turn the policy names one action (a word or a letter, case-insensitive;
only the turn's first word counts), the observation is the new board as text, the turn's reward is
gymnasium's; the episode ends when gymnasium terminates or truncates it, and its verdict is the sum
of the rewards. A turn that names no action leaves the state as it was and says which actions
exist (reward 0). ``anchor`` is the board the action was taken on (GiGPO's step groups).

``frozenlake`` (FrozenLake 4x4, as RAGEN's text FrozenLake, arXiv 2504.20073): reward 1 on reaching
the goal G, 0 on falling in a hole H or running out of gymnasium's 100 steps. Actions ``L D R U``
(or ``left down right up``). ``is_slippery`` defaults to False (the move is the one chosen), so the
task is learnable; with it the move slips sideways 2 times in 3 and the episode's randomness is
fixed by the prompt's seed. Each prompt is a map from ``generate_random_map`` (every map has a
path); splits are by map seed and disjoint by map. The board is gymnasium's ansi rendering with
the player's cell, which gymnasium marks only by colour, written ``P``. Demonstrations follow a
shortest path (non-slippery). ``verify`` replays a completion's actions, one per word.

``gym:<env_id>``: any registered gymnasium environment with text (ansi) observations and a
``Discrete(n)`` action space; actions are ``0 .. n-1`` or names from the ``actions`` option; colour
codes are stripped (option ``highlight`` writes a character over highlighted cells). Prompts are
reset seeds (held-out seeds disjoint from train). It has no demonstrations (``episode_examples``
is empty: there is no generic solver).

TextArena (arXiv 2504.11442) and GEM have adapters of their own: ``textarena:<env_id>``
(``rollwise.envs.textarena_env``, single-player games; TextArena's API is multi-player, not
gymnasium's) and ``gem:<env_id>`` (``rollwise.envs.gem_env``, GEM's gymnasium-like text API).
Each is an optional extra imported on use; their docstrings list the games known to work offline.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rollwise.envs.base import StepResult
from rollwise.registry import Compat, UserError
from rollwise.tasks._common import coerce_options, sample_prompts
from rollwise.types import Prompt, Verdict

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_HIGHLIGHT = re.compile(r"\x1b\[4\dm(.)\x1b\[0m")
_LAST_ACTION = re.compile(r"^\s*\(\w+\)\n")  # toy_text renderings start with the last action, "  (Right)"
FROZEN_ACTIONS = {"left": 0, "down": 1, "right": 2, "up": 3, "l": 0, "d": 1, "r": 2, "u": 3}
MOVES = {0: (0, -1), 1: (1, 0), 2: (0, 1), 3: (-1, 0)}


def gymnasium():
    try:
        import gymnasium as gym
    except ImportError as e:
        raise UserError(
            "this environment needs gymnasium: pip install gymnasium (or pip install 'rollwise[envs]')"
        ) from e
    return gym


def text_of(ansi: str, player: str | None = None) -> str:
    """An ansi rendering as plain text: a highlighted cell becomes ``player`` (when given), colours go."""
    if player is not None:
        ansi = _HIGHLIGHT.sub(player, ansi)
    return _LAST_ACTION.sub("", _ANSI.sub("", ansi).strip("\n")).strip("\n")


class GymEnv:
    """One episode of a gymnasium environment as text (see the module docstring)."""

    def __init__(self, env: Any, actions: Mapping[str, int], player: str | None = None):
        self.env, self.actions, self.player = env, dict(actions), player
        self.board, self.total = "", 0.0

    def render(self) -> str:
        return text_of(self.env.render(), self.player)

    def reset(self, seed: int) -> None:
        self.env.reset(seed=seed)
        self.total = 0.0
        self.board = self.render()

    def step(self, action: str) -> StepResult:
        words = action.strip().split()
        a = self.actions.get(words[0].lower().strip(".,:;!")) if words else None
        before = self.board
        if a is None:
            names = ", ".join(k for k in self.actions)
            return StepResult(f"invalid action; choose one of {names}\n{before}\n", 0.0, anchor=before)
        _, reward, terminated, truncated, _ = self.env.step(a)
        self.total += float(reward)
        self.board = self.render()
        if terminated or truncated:
            reason = "success" if self.total > 0 else "truncated" if truncated else "failure"
            return StepResult("", float(reward), True, verdict=Verdict(self.total, reason), anchor=before)
        return StepResult(self.board + "\n", float(reward), anchor=before)


def replay(env: GymEnv, seed: int, completion: str) -> Verdict:
    """The verdict of a completion that lists the actions, one per word (the verifier of a gym task)."""
    env.reset(seed)
    for word in completion.split():
        res = env.step(word)
        if res.done:
            return res.verdict
    return Verdict(env.total, "not_done")


class _GymTask:
    """Shared by the gym tasks: splits, verification by replay, environments."""

    name: str
    _train: tuple[Prompt, ...] = ()
    _heldout: tuple[Prompt, ...] = ()

    def make_env(self, prompt: Prompt) -> GymEnv:
        raise NotImplementedError

    def train_prompts(self) -> Sequence[Prompt]:
        return self._train

    def heldout_prompts(self) -> Sequence[Prompt]:
        return self._heldout

    def environment(self, prompt: Prompt) -> GymEnv:
        return self.make_env(prompt)

    def verify(self, prompt: Prompt, completion: str) -> Verdict:
        return replay(self.make_env(prompt), prompt.metadata.get("seed", 0), completion)

    def _prompt(self, pid: str, intro: str, seed: int, meta: dict) -> Prompt:
        p = Prompt(pid, self.name, "", None, metadata={**meta, "seed": seed})
        env = self.make_env(p)
        env.reset(seed)
        return Prompt(pid, self.name, f"{intro}\n{env.board}\n", None, metadata=p.metadata)


class FrozenLakeTask(_GymTask):
    name = "frozenlake"
    INTRO = "FrozenLake: walk from S to G without falling into a hole H; P is you. One move per turn: L, D, R or U."

    def __init__(self, options: make_frozenlake.Options):
        self.options = o = options
        gymnasium()  # a clear error when it is missing
        from gymnasium.envs.toy_text.frozen_lake import generate_random_map

        seen: dict[tuple, int] = {}
        splits: dict[str, list[Prompt]] = {"heldout": [], "train": []}
        seed = o.seed * 10_000_000
        for split, n in (("heldout", o.n_heldout), ("train", o.n_train)):
            misses = 0
            while len(splits[split]) < n:
                seed += 1
                m = tuple(generate_random_map(size=o.size, p=o.p_frozen, seed=seed))
                if m in seen:
                    misses += 1
                    if misses > 1000 + 20 * n:
                        raise UserError(f"task 'frozenlake': cannot draw {n} distinct {split} maps; lower n_{split}")
                    continue
                seen[m] = seed
                splits[split].append(self._prompt(f"frozenlake/{'/'.join(m)}", self.INTRO, 0, {"map": m}))
        self._train, self._heldout = tuple(splits["train"]), tuple(splits["heldout"])

    def make_env(self, prompt: Prompt) -> GymEnv:
        gym = gymnasium()
        env = gym.make(
            "FrozenLake-v1", desc=list(prompt.metadata["map"]), is_slippery=self.options.is_slippery, render_mode="ansi"
        )
        return GymEnv(env, FROZEN_ACTIONS, player="P")

    def episode_examples(self, n: int, seed: int) -> list[tuple[Prompt, tuple[tuple[str, str], ...]]]:
        """A shortest path per map (breadth-first), one letter per turn, with the boards it shows."""
        out = []
        for p in sample_prompts(self._train, n, seed):
            env = self.make_env(p)
            env.reset(p.metadata.get("seed", 0))
            pairs = tuple((a, env.step(a).observation) for a in shortest_path(p.metadata["map"]))
            out.append((p, pairs))
        return out


def shortest_path(rows: Sequence[str]) -> list[str]:
    """The letters of a shortest S -> G walk over frozen cells (non-slippery)."""
    n, m = len(rows), len(rows[0])
    start = next((i, j) for i in range(n) for j in range(m) if rows[i][j] == "S")
    prev: dict[tuple[int, int], tuple[tuple[int, int], int] | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if rows[cell[0]][cell[1]] == "G":
            path = []
            while prev[cell] is not None:
                cell, a = prev[cell]
                path.append("LDRU"[a])
            return path[::-1]
        for a, (di, dj) in MOVES.items():
            nxt = (cell[0] + di, cell[1] + dj)
            if 0 <= nxt[0] < n and 0 <= nxt[1] < m and nxt not in prev and rows[nxt[0]][nxt[1]] != "H":
                prev[nxt] = (cell, a)
                queue.append(nxt)
    raise ValueError("no path from S to G")


class GymTask(_GymTask):
    """``gym:<env_id>`` (see the module docstring)."""

    def __init__(self, env_id: str, options: make_gym.Options):
        self.env_id, self.options, self.name = env_id, options, f"gym:{env_id}"
        gym = gymnasium()
        try:
            probe = gym.make(env_id, render_mode="ansi", **options.env_kwargs)
        except Exception as e:
            raise UserError(f"task 'gym:{env_id}': gymnasium cannot make it with render_mode='ansi': {e}") from e
        n = getattr(probe.action_space, "n", None)
        if n is None:
            raise UserError(f"task 'gym:{env_id}': needs a Discrete action space, got {probe.action_space}")
        if options.actions and len(options.actions) != n:
            raise UserError(f"task 'gym:{env_id}': actions has {len(options.actions)} names for {n} actions")
        self.action_names = {str(i): i for i in range(n)}
        self.action_names.update({a.lower(): i for i, a in enumerate(options.actions)})
        intro = f"{env_id}: one action per turn, of {', '.join(options.actions or map(str, range(n)))}."
        base = options.seed * 10_000_000
        self._heldout = tuple(
            self._prompt(f"gym:{env_id}/{s}", intro, s, {}) for s in range(base, base + options.n_heldout)
        )
        start = base + 5_000_000
        self._train = tuple(
            self._prompt(f"gym:{env_id}/{s}", intro, s, {}) for s in range(start, start + options.n_train)
        )

    def make_env(self, prompt: Prompt) -> GymEnv:
        env = gymnasium().make(self.env_id, render_mode="ansi", **self.options.env_kwargs)
        return GymEnv(env, self.action_names, player=self.options.highlight or None)

    def episode_examples(self, n: int, seed: int) -> list:
        return []


def make_frozenlake(arg: str | None, options=None) -> FrozenLakeTask:
    """Task factory: ``frozenlake`` (no argument)."""
    if arg:
        raise UserError(f"task 'frozenlake' takes no argument (got 'frozenlake:{arg}')")
    return FrozenLakeTask(coerce_options(make_frozenlake.Options, options, "frozenlake"))


def make_gym(arg: str | None, options=None) -> GymTask:
    """Task factory: ``gym:<env_id>``."""
    if not arg:
        raise UserError("task 'gym' needs an environment id: 'gym:<env_id>', e.g. 'gym:FrozenLake-v1'")
    return GymTask(arg, coerce_options(make_gym.Options, options, f"gym:{arg}"))


class _Splits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n_train: int = Field(default=1000, ge=1, le=1_000_000, description="number of train prompts")
    n_heldout: int = Field(default=100, ge=1, le=100_000, description="number of held-out prompts")
    seed: int = Field(default=0, ge=0, le=100, description="fixes both splits")


class _FrozenOptions(_Splits):
    is_slippery: bool = Field(default=False, description="gymnasium's slippery ice (moves slip sideways 2 times in 3)")
    size: int = Field(default=4, ge=3, le=8, description="the map is size x size")
    p_frozen: float = Field(default=0.8, gt=0, le=1, description="probability that a cell is frozen (not a hole)")


class _GymOptions(_Splits):
    env_kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of gymnasium.make")
    actions: list[str] = Field(default_factory=list, description="names of the actions 0..n-1 (besides the digits)")
    highlight: str = Field(
        default="",
        max_length=1,
        description="a character written over each cell the ansi rendering highlights (background colour), "
        "e.g. the agent's; empty: the cell's own character (what only colour shows is lost)",
    )


make_frozenlake.Options = _FrozenOptions
make_gym.Options = _GymOptions
make_frozenlake.compat = make_gym.compat = Compat(episodes=True)  # environment tasks (rollwise.compat)
