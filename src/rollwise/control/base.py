"""The controller contract: every hook the loop and the session call, the optional ones with
defaults that change nothing (so neither probes a controller for a hook; issue #27).

Required (no default): ``select``, ``plan``, ``state_dict``, ``load_state_dict``. Optional, with
their defaults: ``next_round`` (no further round), ``finish_batch`` (the kept groups, unchanged),
``observe`` (nothing), ``bind`` (nothing), ``row_weights`` (None: advantages unweighted),
``priors`` / ``baselines`` (refused: only V0.5 / MSSR have them), ``after_update`` (nothing),
``metrics`` (none), ``history`` (None: no ``prompt_stats.json``), ``plans_ahead`` (True: see
``rollwise/control/__init__.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar

from rollwise.types import Plan


class Controller:
    """Base class of every controller (``rollwise.control.REGISTRY``) and controller wrapper."""

    plans_ahead: ClassVar[bool] = True  # False: select/plan write state that the plan's later hooks read
    metrics: Mapping[str, float] = MappingProxyType({})  # read-only default; controllers assign their own dict
    history: Any = None  # a PromptHistory, dumped to prompt_stats.json at each checkpoint

    def select(self, state) -> list:
        raise NotImplementedError

    def plan(self, prompts: list, state) -> Plan:
        raise NotImplementedError

    def next_round(self, groups: list, state) -> Plan | None:
        """The next generation round of this step; an empty plan when the step's rollouts are done."""
        return Plan()

    def finish_batch(self, groups: list, kept: list, dropped) -> list:
        """The training groups from the filters' ``kept`` groups (of all generated ``groups``); may count
        extra drop reasons in ``dropped``."""
        return kept

    def observe(self, groups: list, state) -> None:
        """Every group generated this step (before filtering)."""

    def bind(self, services) -> None:
        """The run's services (``rollwise.types.Services``), given once the run is assembled."""

    def row_weights(self, rows):
        """(B,) weights that multiply the step's advantages (Prompt-GDRO), computed before the
        estimator; None leaves them unweighted."""
        return None

    def priors(self, rows):
        """(B,) value prior of each row's prompt (the ``value_prior`` advantage input)."""
        raise ValueError(f"advantage 'v05' needs control.name = 'v05' (the value prior), got {type(self).__name__}")

    def baselines(self, rows):
        """(B,) per-prompt value baseline of each row (the ``prompt_baseline`` advantage input)."""
        raise ValueError(
            f"this advantage needs a controller with a per-prompt baseline (control.name = 'mssr'), "
            f"got {type(self).__name__}"
        )

    def after_update(self, batch, rows, metrics: dict, advantages) -> None:
        """After the optimizer step: the trained ``batch`` and ``rows``, the step's ``metrics`` and the
        estimator's (unweighted) ``advantages`` of the rows."""

    def state_dict(self) -> dict:
        raise NotImplementedError

    def load_state_dict(self, s: dict) -> None:
        raise NotImplementedError
