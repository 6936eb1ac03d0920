"""The ``filter`` section: group filters by name (``rollwise.filter``, options validated by each)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from rollwise.registry import UserError
from rollwise.sections import Section


class FilterConfig(Section):
    names: list[str] = Field(default_factory=list, description="Filters applied in order, e.g. ['zero_variance'].")
    options: dict[str, dict[str, Any]] = Field(default_factory=dict, description="Options per filter name.")


def check_options_named(section: FilterConfig) -> None:
    """Options given for a filter that ``filter.names`` does not turn on would be silently unused."""
    unknown = sorted(set(section.options) - set(section.names))
    if unknown:
        raise UserError(f"filter.options has entries for filters not in filter.names: {unknown}")
