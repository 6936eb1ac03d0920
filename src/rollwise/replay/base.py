"""The replay-source contract (``rollwise.replay.REGISTRY``): ``add``, ``mix``, ``state_dict``,
``load_state_dict`` required; ``metrics`` (none) and ``bind`` (nothing) optional with defaults.

A source that schedules generation itself (APRIL, SPEC-RL) sets ``schedules_generation = True``
and has ``wrap_pool(pool, controller, state) -> pool``; the assembler wraps the worker pool with it
(``rollwise.components.ROLLOUT_WRAPPERS``).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import ClassVar


class ReplaySource:
    """Base class of every replay source."""

    schedules_generation: ClassVar[bool] = False  # True: wrap_pool(pool, controller, state) owns generation
    metrics: Mapping[str, float] = MappingProxyType({})  # read-only default; sources assign their own dict

    def bind(self, services) -> None:
        """The run's services (``rollwise.types.Services``), given once the run is assembled."""

    def add(self, groups: list) -> None:
        raise NotImplementedError

    def mix(self, fresh: list, state) -> list:
        raise NotImplementedError

    def state_dict(self) -> dict:
        raise NotImplementedError

    def load_state_dict(self, s: dict) -> None:
        raise NotImplementedError
