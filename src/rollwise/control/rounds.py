"""Dynamic sampling: what to do about groups the filters will drop, for any controller.
``control.dynamic_sampling.type`` picks ``refill`` (DAPO, the default; this part of the
docstring) or ``replace`` (POLARIS / SkyRL; "Replace" below).

Paper: Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
arXiv 2503.14476 (allocation.md §14.1). A group whose rewards are all equal has zero advantage
under a group baseline and gives no gradient; DAPO drops such groups and keeps sampling new
prompts until the batch holds ``target_groups`` groups with signal.

How it is split here (each part exists once):

- The test "does this group carry signal?" is the configured filter chain, which must contain
  ``zero_variance`` (:func:`rollwise.filter.basic.zero_variance`, with its ``tol`` for float
  rewards; refused without it at config load, ``rollwise.compat.check``); a group counts towards the target when every
  configured filter keeps it.
- :class:`DynamicSampling` wraps the chosen controller (``components.build_strategies`` does it
  when ``control.dynamic_sampling.enabled``). After each generation round, once the controller's
  own ``next_round`` has nothing more to ask, it draws ``target_groups - passing`` fresh prompts
  (at most ``prompts_per_step`` per round) from the controller's :class:`~rollwise.control.source.PromptStream` and lets
  the controller's ``plan`` allocate them, until the target is met or ``max_rounds`` rounds (the first included)
  have run. Every round goes through the worker pool, so its tokens, rollouts and verifier calls
  are charged to the ledger; ``control/rounds`` and ``control/budget_used`` log them.
- The loop's filters then drop the degenerate groups; if more groups pass than ``target_groups``
  (possible when ``target_groups < prompts_per_step``, DAPO's over-sampling), the loop keeps the
  **first** ``target_groups`` in generation order and counts the rest as ``filter/surplus``
  (:func:`target_groups` gives that limit; ``filter.chain.apply_filters`` applies it).

Differences from the paper / verl's recipe: a refill round asks only for the missing number of
groups (verl generates a whole generation batch per round and trims the surplus), so no rollout
is generated only to be trimmed away after the first round; when ``max_rounds`` is reached the
step trains on the groups it has (verl raises an error); prompts already in this step's groups
(possible when the stream wraps around an epoch) are skipped rather than topped up. The default
``max_rounds = 4`` is ours (the paper gives none; verl's ``max_num_gen_batches`` 0 = unlimited).

**Replace** (``type = "replace"``; selection.md §4; SkyRL ``handle_replace_sampling``; the group
operations and their side effects on the loss are in :mod:`rollwise.filter.replace`):

- A *batch* is the groups of one ``select`` + ``plan`` of the wrapped controller, with all of the
  controller's own rounds (DARS stage 2, AR3PO stages). Once the controller has nothing more to
  ask, ``next_round`` applies the **gate**: more than ``min_replace_ratio * B`` of the batch's B
  groups must pass the filter chain. If not, the whole batch is **discarded** and a new one is
  drawn with the controller's ``select`` + ``plan`` (prompts already generated this step are
  skipped) — SkyRL's "throw away and generate from the next loader batch"; nothing accumulates
  across batches. ``max_failed_batches`` discarded batches in one step raise an error (SkyRL's
  ``max_sample_batches``, default 30, -1 = unlimited); ``max_rounds`` and ``target_groups`` are
  refill's and are not used.
- After the filters, the loop calls :meth:`DynamicSampling.finish_batch` (from
  ``filter.chain.apply_filters``): the groups of discarded batches are dropped (``filter/discarded_batch``
  counts those the filters had kept), and every group of the last batch that the filters
  dropped is replaced by a copy of a random kept group (:func:`~rollwise.filter.replace.replace_bad`;
  ``replace_merge``: joined to its source, SkyRL, or a group of its own, POLARIS). The drop
  counters still show why groups failed (``filter/all_wrong``, ...), and ``observe`` sees every
  generated group, never the copies.
- "Bad" is "dropped by the filter chain" (with ``filter.names = ["zero_variance"]``: zero-variance,
  the spec's ZV; rollwise's filter also drops groups of a single verified rollout, so with n = 1
  every group is bad and every batch fails the gate — use ``refill`` or no dynamic sampling there).
- B is the number of groups the batch generated (``prompts_per_step`` unless the controller's
  budget trimmed prompts; SkyRL's ``train_batch_size``). If no prompt not yet generated this step
  is left for a new batch (a tiny train split), the step trains on nothing. Rollouts of discarded
  batches are never trained on, but ``observe`` (the per-prompt history) sees them.
- The copies' RNG is ``random.Random("replace:<run seed>:<step>")``, so a resumed run makes the
  same choices and the wrapper still has no checkpoint state of its own.
- Logs ``control/replace_replaced`` (groups overwritten), ``control/replace_discarded_batches``
  and ``control/replace_distinct_groups`` (distinct prompts trained); discarded batches' rollouts
  are charged to the ledger like every round (``control/rounds`` counts their rounds).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

from rollwise.control.source import PromptStream
from rollwise.filter.replace import passes_gate, replace_bad
from rollwise.registry import UserError
from rollwise.types import Controller, Group, Plan


def target_groups(control_cfg) -> int | None:
    """Groups to train on per step when dynamic sampling is on (``target_groups``, default
    ``prompts_per_step``); ``None`` when it is off (the loop then keeps every passing group)."""
    ds = control_cfg.dynamic_sampling
    if not ds.enabled or ds.type == "replace":
        return None
    return ds.target_groups or control_cfg.prompts_per_step


def count_passing(groups: list[Group], filters: list[tuple[str, Callable]]) -> int:
    """Number of groups that every filter of the configured chain keeps."""
    return sum(all(f(g).keep for _, f in filters) for g in groups)


class DynamicSampling(Controller):
    """A controller wrapper adding DAPO refill rounds or POLARIS/SkyRL replace (module docstring).

    ``select``, ``plan``, ``observe`` and the checkpoint state are the wrapped controller's
    (``state_dict`` is exactly the inner one, so checkpoints do not depend on the option);
    ``next_round`` returns the controller's own next round first, then a refill round (refill)
    or a new batch after a failed gate (replace); ``finish_batch`` does replace's copies.
    """

    def __init__(self, inner, filters: list[tuple[str, Callable]], control_cfg):
        ds = control_cfg.dynamic_sampling
        if ds.type == "refill" and not isinstance(getattr(inner, "stream", None), PromptStream):
            raise UserError(
                f"control.dynamic_sampling needs a controller with a prompt stream; {type(inner).__name__!r} has none"
            )
        self.inner = inner
        self.filters = filters
        self.type = ds.type
        self.target = target_groups(control_cfg)
        self.max_rounds = ds.max_rounds
        self.per_round = control_cfg.prompts_per_step  # a refill round draws at most one step's prompts
        self.min_ratio, self.max_failed, self.merge = ds.min_replace_ratio, ds.max_failed_batches, ds.replace_merge
        self.rounds = 0  # generation rounds run so far in this step
        self.failed = 0  # replace: batches discarded so far in this step
        self._batch: set[str] = set()  # replace: prompt ids of the current batch
        self._discarded: set[str] = set()  # replace: prompt ids of this step's discarded batches
        self._state = None
        self._metrics: dict[str, float] = {}

    @property
    def metrics(self) -> dict[str, float]:
        return {**self.inner.metrics, **self._metrics}

    @property
    def history(self):
        return self.inner.history

    def select(self, state):
        return self.inner.select(state)

    def plan(self, prompts, state) -> Plan:
        self.rounds, self.failed, self._discarded, self._state, self._metrics = 0, 0, set(), state, {}
        plan = self.inner.plan(prompts, state)
        self._batch = {r.prompt.id for r in plan.requests}
        return plan

    def next_round(self, groups: list[Group], state) -> Plan:
        self.rounds += 1
        plan = self.inner.next_round(groups, state)
        if plan:
            return plan
        if self.type == "replace":
            return self._new_batch_if_gate_fails(groups, state)
        if self.rounds >= self.max_rounds:
            return plan
        missing = self.target - count_passing(groups, self.filters)
        if missing <= 0:
            return Plan()
        seen = {g.prompt.id for g in groups}
        fresh = [p for p in self.inner.stream.take(min(missing, self.per_round)) if p.id not in seen]
        return self.inner.plan(fresh, state) if fresh else Plan()

    def _new_batch_if_gate_fails(self, groups: list[Group], state) -> Plan:
        batch = [g for g in groups if g.prompt.id in self._batch]
        if passes_gate(count_passing(batch, self.filters), len(batch), self.min_ratio):
            return Plan()
        self.failed += 1
        self._discarded |= self._batch
        self._batch = set()
        if self.max_failed != -1 and self.failed >= self.max_failed:
            raise RuntimeError(
                f"dynamic sampling 'replace': {self.failed} batches in a row had at most "
                f"{self.min_ratio} x B groups passing the filters (control.dynamic_sampling."
                "max_failed_batches); lower min_replace_ratio or raise max_failed_batches (-1 = unlimited)"
            )
        seen = {g.prompt.id for g in groups}
        fresh = [p for p in self.inner.select(state) if p.id not in seen]
        plan = self.inner.plan(fresh, state) if fresh else Plan()
        self._batch = {r.prompt.id for r in plan.requests}
        return plan

    def finish_batch(self, groups: list[Group], kept: list[Group], dropped: Counter) -> list[Group]:
        """Replace only (refill returns ``kept``): drop the discarded batches' groups, then copy
        kept groups of the last batch over its dropped ones. ``groups`` are all generated groups,
        ``kept`` those the filters kept; ``dropped`` (reason counts) gains ``discarded_batch``."""
        if self.type != "replace":
            return kept
        lost = sum(1 for g in kept if g.prompt.id in self._discarded)
        if lost:
            dropped["discarded_batch"] += lost
        kept_ids = {id(g) for g in kept}
        batch = [g for g in groups if g.prompt.id in self._batch]
        step, seed = getattr(self._state, "step", 0), getattr(self._state, "seed", 0)
        res = replace_bad(
            batch,
            random.Random(f"replace:{seed}:{step}"),
            self.min_ratio,
            self.merge,
            is_good=lambda g: id(g) in kept_ids,
        )
        out = [] if res.keep_sampling else res.groups  # a batch that failed the gate trains on nothing
        self._metrics = {
            "control/replace_replaced": float(res.replaced),
            "control/replace_discarded_batches": float(self.failed),
            "control/replace_distinct_groups": float(len(out) if self.merge else len({g.prompt.id for g in out})),
        }
        return out

    def observe(self, groups: list[Group], state) -> None:
        self.inner.observe(groups, state)

    def bind(self, services) -> None:
        self.inner.bind(services)

    def advantage_inputs(self, rows, needs=()):
        return self.inner.advantage_inputs(rows, needs)

    def after_update(self, batch, rows, metrics: dict, advantages) -> None:
        self.inner.after_update(batch, rows, metrics, advantages)

    def state_dict(self) -> dict:
        return self.inner.state_dict()

    def load_state_dict(self, s: dict) -> None:
        self.inner.load_state_dict(s)

    def __getattr__(self, name):  # anything else (e.g. ``stream``, ``budget``) is the controller's
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
