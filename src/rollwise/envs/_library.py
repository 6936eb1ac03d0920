"""What the library adapters (``textarena_env``, ``gem_env``) share: each environment's own random state.

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
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

_LOCK = threading.Lock()


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
