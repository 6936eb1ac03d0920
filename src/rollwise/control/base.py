"""The controller contract: every hook the loop and the session call, the optional ones with
defaults that change nothing (so neither probes a controller for a hook; issue #27).

Required (no default): ``select``, ``plan``, ``state_dict``, ``load_state_dict``. Optional, with
their defaults: ``next_round`` (no further round), ``finish_batch`` (the kept groups, unchanged),
``observe`` (nothing), ``bind`` (nothing), ``advantage_inputs`` (an empty record: advantages
unweighted, no prior, no baseline), ``after_update`` (nothing),
``metrics`` (none), ``history`` (None: no ``prompt_stats.json``), ``plans_ahead`` (True: see
``rollwise/control/__init__.py``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from types import MappingProxyType
from typing import Any, ClassVar

from rollwise.types import AdvantageInputs, Plan


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

    def advantage_inputs(self, rows, needs: Collection[str] = ()) -> AdvantageInputs:
        """What this controller gives the advantage stage for the step's ``rows``, as one record
        (row weights, priors, baselines; ``rollwise.types.AdvantageInputs``), computed before the
        estimator. ``needs`` names the inputs the step's estimator declares (``fn.inputs``), so a
        prior or a baseline is computed only for an estimator that reads it. None of them by default:
        advantages unweighted, and an estimator that needs a prior (V0.5) or a baseline (MSSR) is
        refused by the batch builder, naming the controller it needs."""
        return AdvantageInputs()

    def after_update(self, batch, rows, metrics: dict, advantages) -> None:
        """After the optimizer step: the trained ``batch`` and ``rows``, the step's ``metrics`` and the
        estimator's (unweighted) ``advantages`` of the rows."""

    def state_dict(self) -> dict:
        raise NotImplementedError

    def load_state_dict(self, s: dict) -> None:
        raise NotImplementedError
