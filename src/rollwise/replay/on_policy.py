"""``on_policy``: train on exactly the fresh groups of this step; stores nothing."""

from __future__ import annotations

from rollwise.types import Group, ReplaySource


class OnPolicy(ReplaySource):
    def __init__(self, cfg, options, seed: int):
        pass

    def add(self, groups: list[Group]) -> None:
        pass

    def mix(self, fresh: list[Group], state) -> list[Group]:
        return list(fresh)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, s: dict) -> None:
        pass
