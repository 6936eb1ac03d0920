"""Environment slots and DART's rollout-wise schedule (``task.env_slots``, ``task.episode_schedule =
"rollout_wise"``; issue #44).

DART ("Efficient Multi-turn RL for GUI Agents via Decoupled Training and Adaptive Data Curation",
arXiv 2509.23866; docs/specs/systems.md §9) runs its environments (desktop VMs) as a fixed cluster and
schedules **one trajectory at a time**: an environment whose trajectory ends starts the next one at
once, with no batch or task barrier, while a batch-synchronous system holds every environment of a
batch until its slowest trajectory has finished. Environments are the scarce resource there, so the
paper reports environment utilisation (5.5x) and rollout-GPU utilisation (1.6x) against that barrier.

``SlotPool`` is the episode pool (``rollwise.generate.episodes``) of a run with ``task.env_slots`` set:
at most ``env_slots`` environments are live at once, and the call's episodes queue for them in plan
order. An environment is made and reset when its episode takes a slot, and the slot is free again
when the episode ends. The schedule says when a queued episode may take a free slot:

- ``lockstep``: in **waves** of ``env_slots`` episodes; a wave's turns are lockstep (every turn waits
  for all of the wave's steps) and the next wave starts when the whole wave has ended: the batch
  barrier. Reproducible for a seed, like lockstep without slots;
- ``overlap``: waves as above, but within a wave an episode whose step is done generates its next turn
  while the others still wait;
- ``rollout_wise``: **a freed slot takes the next queued episode at once**, which joins the next
  backend call with the episodes already running (their turns overlap as in ``overlap``). Not
  bit-reproducible: which episodes share a call depends on timing.

Where the seam is: inside one generation call of the episode pool, not in the asynchronous pool
(``rollwise.distributed.async_pool``). The asynchronous pool plans whole steps ahead
(``train.async.max_staleness``, which runs with episodes when ``on_new_weights = "finish"``) and so
overlaps generation with training, DART's decoupling of the rollout service from the trainer; what it
cannot see is the barrier inside a step's episodes, which is where the slots and their schedule sit.
The two compose: under ``train.async`` the slot pool is the asynchronous pool's engine
(``tests/integration/test_agentic_presets.py``).
Per-worker weight sync (DART's third part) is not built: one sampler holds the weights here.

Utilisation (per charged call, in ``metrics.jsonl``; ``wall`` = the seconds from the call's first
environment reset to its last episode's end):

- ``episodes/env_utilisation`` = seconds of environment steps (``episodes/env_s``, summed over episodes)
  / (``env_slots`` x ``wall``): the share of slot time an environment was working, not waiting for a
  turn to be decoded, for a wave's stragglers or for nothing (an empty queue);
- ``episodes/sampler_utilisation`` = seconds the backend decoded / ``wall``;
- ``episodes/rows_per_call`` = rows decoded / backend calls: how full the sampler's batches were
  (``model.max_batch`` caps them). Rollout-wise calls tend to be smaller: the schedule trades batch
  size for never waiting;

with their sums ``episodes/slot_s`` (``env_slots`` x ``wall``), ``episodes/wall_s`` and
``episodes/backend_calls``, from which a run's utilisation is ``sum env_s / sum slot_s``.
"""

from __future__ import annotations

import math
import time
from collections import deque

from rollwise.generate.episodes import EpisodePool, _Live, _Tally
from rollwise.types import Plan, Sampling


class SlotPool(EpisodePool):
    """See the module docstring."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        if self.limits.env_slots < 1:
            raise ValueError("SlotPool needs task.env_slots >= 1")
        self._make = None
        self._calls = self._rows = 0
        self._wall = 0.0

    def _starts(self, plan: Plan, cap: int, make) -> list[_Live]:
        """The call's episodes, queued: none has an environment until it takes a slot (``_open``)."""
        self._make = make
        live: list[_Live] = []
        for req in plan.requests:
            if req.prefix:
                raise ValueError(f"request for {req.prompt.id!r} continues a prefix, which episodes do not do")
            pids = self.codec.encode_prompt(req.prompt)
            live += [_Live(len(live) + i, req.prompt, pids, None, limit=cap) for i in range(req.n)]
        return live

    def _open(self, e: _Live) -> None:
        """Make and reset the episode's environment as it takes a slot (an environment that cannot
        start ends its episode "error", as in the base pool, and frees the slot at once)."""
        fresh = self._start(e.index, e.prompt, e.pids, e.limit, self._make)
        e.env, e.end, e.error = fresh.env, fresh.end, fresh.error

    def _run(self, live: list[_Live], sampling: Sampling, generator, tally: _Tally) -> None:
        """Turns until every queued episode has taken a slot and ended (module docstring): the base pool's
        turns, with the slots refilled from the queue as episodes end."""
        slots, rollout_wise = self.limits.env_slots, self.limits.episode_schedule == "rollout_wise"
        queue = deque(live)
        held = 0  # episodes holding a slot
        self._calls = self._rows = 0

        def refill(ended: list[_Live], idle: bool) -> list[_Live]:
            """Free the ended episodes' slots; fill free slots from the queue when a slot frees
            (rollout-wise) or at a wave's end (``idle``)."""
            nonlocal held
            held -= len(ended)
            started = []
            while (rollout_wise or idle) and held < slots and queue:
                e = queue.popleft()
                self._open(e)
                if e.end is None:
                    started.append(e)
                    held += 1
            return started

        t_start = time.perf_counter()
        self._drive(refill([], True), sampling, generator, tally, refill)
        self._wall = time.perf_counter() - t_start

    def _turn(self, ready: list[_Live], sampling: Sampling, generator, tally: _Tally) -> None:
        """The base pool's turn, counting its backend calls and rows (``episodes/rows_per_call``)."""
        self._calls += math.ceil(len(ready) / (self.max_batch or len(ready)))
        self._rows += len(ready)
        super()._turn(ready, sampling, generator, tally)

    def _charge(self, out, tally: _Tally) -> None:
        """The base pool's cost, then the call's utilisation (module docstring)."""
        super()._charge(out, tally)
        slot_s = self.limits.env_slots * self._wall
        c = self.cost
        c.count(
            **{
                "episodes/slot_s": slot_s,
                "episodes/wall_s": self._wall,
                "episodes/backend_calls": self._calls,
            }
        )
        c.metrics["episodes/env_utilisation"] = tally.env_s / slot_s if slot_s > 0 else 0.0  # the last call's
        c.metrics["episodes/sampler_utilisation"] = tally.generate_s / self._wall if self._wall > 0 else 0.0
        c.metrics["episodes/rows_per_call"] = self._rows / self._calls if self._calls else 0.0
