"""The configuration's sections (docs/architecture.md §6), one module per section of ``rollwise.config.Config``:
each holds its section's pydantic models, the option schemas of the features that have a fixed place in it
(``sampling.arrol``, ``batch.d3s``, ``reward.ttrl``, ``model.warm_start.otr``, ``train.ess_lr_scaling``, which
their strategy modules alias) and the refusals that concern that section alone. A new feature with a fixed
section touches that section's module and its strategy module; refusals between sections stay in
``rollwise.compat``. Like ``rollwise.config``, which assembles ``Config`` from them, these modules are the
ground floor: they import no strategy module.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class StrategyConfig(Section):
    name: str
    options: dict[str, Any] = Field(
        default_factory=dict, description="Options of the chosen strategy (validated by it)."
    )
