"""The ``replay`` section: the replay source (``rollwise.replay``, options validated by it)."""

from __future__ import annotations

from pydantic import Field

from rollwise.sections import StrategyConfig


class ReplayConfig(StrategyConfig):
    name: str = Field("on_policy", description="Replay source mixing fresh and stored groups.")
