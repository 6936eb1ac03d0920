"""What the library adapters (``textarena_env``, ``gem_env``) share: each environment's own random state, and
the task around an environment (:class:`LibraryTask`: prompts as reset seeds, replaying a completion).

TextArena and GEM draw their games from the *global* ``random`` (and ``numpy.random``) generators
and seed them in ``reset``. The episode pool steps environments of different episodes in worker
threads, so left alone one episode's draws would move another's and an episode would not be a
function of its seed. ``LibraryRandom`` gives each environment its own copy of both states: every
call into the library runs under one lock with the environment's states swapped in, and the
caller's global states are put back after it (rollwise's own draws are never moved by a library).
The lock serialises the library calls of concurrent episodes; the games are cheap.
"""

from __future__ import annotations

import random
import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from rollwise.types import Prompt, Verdict

_LOCK = threading.Lock()


def why(e: Exception) -> str:
    """A library's exception in one line for a UserError: its type and first 300 characters."""
    return f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"


class LibraryRandom:
    """The global random states one library environment sees (see the module docstring)."""

    def __init__(self) -> None:
        self.state: tuple | None = None

    @contextmanager
    def use(self, seed: int | None = None) -> Iterator[None]:
        """Run the block with this environment's states; ``seed`` starts them afresh from it."""
        with _LOCK:
            outer = random.getstate(), np.random.get_state()
            try:
                if seed is not None or self.state is None:
                    random.seed(seed or 0)
                    np.random.seed((seed or 0) % 2**32)
                else:
                    random.setstate(self.state[0])
                    np.random.set_state(self.state[1])
                yield
            finally:
                self.state = random.getstate(), np.random.get_state()
                random.setstate(outer[0])
                np.random.set_state(outer[1])


class LibraryOptions(BaseModel):
    """The options every library adapter has (each adds its own)."""

    model_config = ConfigDict(extra="forbid")

    n_train: int = Field(default=512, ge=1, le=1_000_000, description="number of train prompts (reset seeds)")
    n_heldout: int = Field(default=64, ge=1, le=100_000, description="number of held-out prompts (reset seeds)")
    seed: int = Field(default=0, ge=0, le=100, description="fixes both splits' seed ranges")


class LibraryTask:
    """A library game as a task: each prompt is a reset seed (held-out seeds from ``options.seed`` x 10^7,
    train seeds 5 x 10^6 further: disjoint ranges), its text the game's first observation; ``verify``
    replays a completion's actions (``ACTIONS`` matches each) in order. Subclasses set ``name``,
    ``options``, ``ACTIONS`` and ``make_env`` (an environment with ``reset(seed)``, ``step(action)`` and
    ``first``, the reset observation)."""

    ACTIONS: re.Pattern

    def make_env(self):
        raise NotImplementedError

    def _splits(self, base: int) -> None:
        self._heldout = tuple(self._prompt(s) for s in range(base, base + self.options.n_heldout))
        start = base + 5_000_000
        self._train = tuple(self._prompt(s) for s in range(start, start + self.options.n_train))

    def _prompt(self, seed: int) -> Prompt:
        env = self.make_env()
        env.reset(seed)
        return Prompt(f"{self.name}/{seed}", self.name, env.first + "\n", None, metadata={"seed": seed})

    def train_prompts(self) -> Sequence[Prompt]:
        return self._train

    def heldout_prompts(self) -> Sequence[Prompt]:
        return self._heldout

    def environment(self, prompt: Prompt):
        return self.make_env()

    def verify(self, prompt: Prompt, completion: str) -> Verdict:
        """Replays the completion's actions in order: the episode's verdict, or *could not verify*
        (reason ``not_done``) when they do not end it."""
        env = self.make_env()
        env.reset(int(prompt.metadata.get("seed", 0)))
        for move in self.ACTIONS.findall(completion):
            res = env.step(move)
            if res.done:
                return res.verdict
        return Verdict(None, "not_done")

    def episode_examples(self, n: int, seed: int) -> list:
        return []  # no demonstrations: there is no generic solver
