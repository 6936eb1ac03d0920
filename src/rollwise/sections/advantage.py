"""The ``advantage`` section: the advantage estimator (``rollwise.objectives``, options validated by it)."""

from __future__ import annotations

from pydantic import Field

from rollwise.sections import StrategyConfig


class AdvantageConfig(StrategyConfig):
    name: str = Field("grpo", description="Advantage estimator.")
