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

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from rollwise.registry import UserError, format_validation


class Section(BaseModel):
    """A section of the configuration. Assignment is validated as a ``--set`` is (``cfg.train.steps = 0``
    raises ``UserError`` naming ``train.steps``, issue #46): ``_key`` is where the section sits in
    ``rollwise.config.Config`` (``place`` sets it), the prefix of the key an error names."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    _key: str = PrivateAttr("")

    def __setattr__(self, name: str, value: Any) -> None:
        try:
            super().__setattr__(name, value)
        except ValidationError as e:
            raise UserError("invalid configuration:\n" + format_validation(e, prefix=self._key)) from None

    def __eq__(self, other: object) -> bool:
        """Equal values, wherever the sections sit: ``_key`` is where a section is, not what it holds
        (``task.turn_budget`` compared with a fresh ``TurnBudgetConfig()`` to tell a changed key)."""
        if type(other) is not type(self):
            return NotImplemented
        return self.__dict__ == other.__dict__ and self.__pydantic_extra__ == other.__pydantic_extra__

    __hash__ = None  # mutable, as pydantic's models are


def place(section: BaseModel, key: str = "") -> None:
    """Tell ``section`` and the sections inside it their keys (``train``, ``train.async``, ...)."""
    if isinstance(section, Section):
        section._key = key
    for name, field in type(section).model_fields.items():
        value = getattr(section, name)
        if isinstance(value, BaseModel):
            place(value, f"{key}.{field.alias or name}" if key else field.alias or name)


class StrategyConfig(Section):
    name: str
    options: dict[str, Any] = Field(
        default_factory=dict, description="Options of the chosen strategy (validated by it)."
    )
