"""The ``objective`` section: the policy objective (``rollwise.objectives``, options validated by it)."""

from __future__ import annotations

from pydantic import Field

from rollwise.sections import StrategyConfig


class ObjectiveConfig(StrategyConfig):
    name: str = Field("grpo", description="Policy objective.")
