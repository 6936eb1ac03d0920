"""Dynamic sampling: refill rounds for groups the filters will drop, for any controller.

Paper: Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
arXiv 2503.14476 (allocation.md §14.1). A group whose rewards are all equal has zero advantage
under a group baseline and gives no gradient; DAPO drops such groups and keeps sampling new
prompts until the batch holds ``target_groups`` groups with signal.

How it is split here (each part exists once):

- The test "does this group carry signal?" is the configured filter chain, which must contain
  ``zero_variance`` (:func:`rollwise.filter.basic.zero_variance`, with its ``tol`` for float
  rewards); a group counts towards the target when every configured filter keeps it.
- :class:`DynamicSampling` wraps the chosen controller (``components.build_strategies`` does it
  when ``control.dynamic_sampling.enabled``). After each generation round, once the controller's
  own ``next_round`` has nothing more to ask, it draws ``target_groups - passing`` fresh prompts
  (at most ``prompts_per_step`` per round) from the controller's :class:`~rollwise.control.uniform.PromptStream` and lets the controller's
  ``plan`` allocate them, until the target is met or ``max_rounds`` rounds (the first included)
  have run. Every round goes through the worker pool, so its tokens, rollouts and verifier calls
  are charged to the ledger; ``control/rounds`` and ``control/budget_used`` log them.
- The loop's filters then drop the degenerate groups; if more groups pass than ``target_groups``
  (possible when ``target_groups < prompts_per_step``, DAPO's over-sampling), the loop keeps the
  **first** ``target_groups`` in generation order and counts the rest as ``filter/surplus``
  (:func:`target_groups` gives that limit; ``loop.apply_filters`` applies it).

Differences from the paper / verl's recipe: a refill round asks only for the missing number of
groups (verl generates a whole generation batch per round and trims the surplus), so no rollout
is generated only to be trimmed away after the first round; when ``max_rounds`` is reached the
step trains on the groups it has (verl raises an error); prompts already in this step's groups
(possible when the stream wraps around an epoch) are skipped rather than topped up. The default
``max_rounds = 4`` is ours (the paper gives none; verl's ``max_num_gen_batches`` 0 = unlimited).
"""

from __future__ import annotations

from typing import Callable

from rollwise.control.uniform import PromptStream
from rollwise.registry import UserError
from rollwise.types import Group, Plan


def target_groups(control_cfg) -> int | None:
    """Groups to train on per step when dynamic sampling is on (``target_groups``, default
    ``prompts_per_step``); ``None`` when it is off (the loop then keeps every passing group)."""
    ds = control_cfg.dynamic_sampling
    if not ds.enabled:
        return None
    return ds.target_groups or control_cfg.prompts_per_step


def check_filters(control_cfg, filter_names: list[str]) -> None:
    """Dynamic sampling refills what ``zero_variance`` drops: refuse it without that filter."""
    if control_cfg.dynamic_sampling.enabled and "zero_variance" not in filter_names:
        raise UserError("control.dynamic_sampling.enabled needs 'zero_variance' in filter.names "
                        f"(got {filter_names}); it refills the groups that filter drops")


def count_passing(groups: list[Group], filters: list[tuple[str, Callable]]) -> int:
    """Number of groups that every filter of the configured chain keeps."""
    return sum(all(f(g).keep for _, f in filters) for g in groups)


class DynamicSampling:
    """A controller wrapper adding DAPO refill rounds (see the module docstring).

    ``select``, ``plan``, ``observe`` and the checkpoint state are the wrapped controller's
    (``state_dict`` is exactly the inner one, so checkpoints do not depend on the option);
    ``next_round`` returns the controller's own next round first, then a refill round.
    """

    def __init__(self, inner, filters: list[tuple[str, Callable]], control_cfg):
        check_filters(control_cfg, [name for name, _ in filters])
        if not isinstance(getattr(inner, "stream", None), PromptStream):
            raise UserError(f"control.dynamic_sampling needs a controller with a prompt stream; "
                            f"{type(inner).__name__!r} has none")
        self.inner = inner
        self.filters = filters
        self.target = target_groups(control_cfg)
        self.max_rounds = control_cfg.dynamic_sampling.max_rounds
        self.per_round = control_cfg.prompts_per_step  # a refill round draws at most one step's prompts
        self.rounds = 0  # generation rounds run so far in this step

    def select(self, state):
        return self.inner.select(state)

    def plan(self, prompts, state) -> Plan:
        self.rounds = 0
        return self.inner.plan(prompts, state)

    def next_round(self, groups: list[Group], state) -> Plan:
        self.rounds += 1
        plan = self.inner.next_round(groups, state)
        if plan or self.rounds >= self.max_rounds:
            return plan
        missing = self.target - count_passing(groups, self.filters)
        if missing <= 0:
            return Plan()
        seen = {g.prompt.id for g in groups}
        fresh = [p for p in self.inner.stream.take(min(missing, self.per_round)) if p.id not in seen]
        return self.inner.plan(fresh, state) if fresh else Plan()

    def observe(self, groups: list[Group], state) -> None:
        self.inner.observe(groups, state)

    def state_dict(self) -> dict:
        return self.inner.state_dict()

    def load_state_dict(self, s: dict) -> None:
        self.inner.load_state_dict(s)

    def __getattr__(self, name):  # anything else (e.g. ``stream``, ``budget``) is the controller's
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
