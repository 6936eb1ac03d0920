"""``vcrl``: variance-based curriculum with a query memory bank (and the ``vcrl`` filter).

Paper: Jiang et al. 2025, "VCRL: Variance-based Curriculum Reinforcement Learning for Large
Language Models", arXiv 2509.19803 (no code found); docs/specs/allocation.md §4. The paper's text was
not reachable: the score is from secondary summaries [SEC], the memory bank is largely our
reconstruction **[RECON, unverified]**.

The reward variance of a group is a cheap difficulty signal: too-easy and too-hard prompts have
none, prompts near 50% success have the most. For a group with ``n`` verified rewards:

- unbiased variance ``s2 = sum_i (r_i - mean)^2 / (n - 1)`` (binary: ``k (n - k) / (n (n - 1))``);
- its maximum for rewards in [0, 1]: ``n / (4 (n - 1))`` for even n, ``(n + 1) / (4 n)`` for odd n;
- the normalised score ``p = s2 / s2_max`` (:func:`normalized_variance`): 0 for all-equal groups,
  1 at ``k = n/2`` (even n). Groups with fewer than two verified rewards score 0.

The method has two halves, because rollwise keeps dropping and choosing apart:

1. **Dynamic sampling (S3)** is the filter ``vcrl`` (:func:`variance_filter`, registered in
   :mod:`rollwise.filter`): it keeps exactly the groups with ``p >= kappa`` and drops the others
   with reason ``low_variance`` (``filter/low_variance``). Put it in ``filter.names`` and give it
   the **same** ``kappa`` as the controller (``filter.options.vcrl.kappa``; both default 0.3):
   the controller cannot see the filter's options, so this is the one setting written twice.
2. **Replay learning (S0) [RECON]** is the controller: a *query* bank (not a trajectory buffer),
   a priority queue keyed by ``p``, holding at most ``bank_capacity`` prompts.

   - ``select`` draws ``B = control.prompts_per_step`` fresh prompts from the shuffled stream
     (as ``uniform``); ``plan`` gives each ``G = control.rollouts_per_prompt`` rollouts.
   - ``next_round`` (refill): while fewer than ``B`` of the step's groups have ``p >= kappa`` and
     fewer than ``max_rounds`` rounds have run, it pops the highest-priority bank queries that are
     not already in this step (ties: the most recently pushed first) and **re-rolls them with the
     current policy**, ``G`` rollouts each, one query per missing group, whole groups only, within
     the step's remaining budget. Re-rolling (rather than replaying stored trajectories) is the
     spec's reading and is unverified.
   - ``observe`` (every generated group of the step): a group with ``p >= kappa`` is pushed into
     the bank, or, if its prompt is already there, its priority becomes
     ``momentum * old + (1 - momentum) * p`` (``momentum = 0``: the latest ``p``, the spec's
     default); a group with ``p < kappa`` evicts its prompt from the bank. When the bank is over
     capacity, the lowest priorities are evicted (ties: the oldest push first).

**Budget.** All rounds of a step stay within :class:`~rollwise.control.budget.StepBudget`
(``control.budget_rollouts`` / ``control.budget_tokens``). Without ``budget_rollouts`` the cap is
the most the refill can ask for, ``max_rounds * B * G``, so it never binds (the paper's cost is
variable, as DAPO's); set it to bound the refill.

Defaults [RECON, the paper's values were not recovered]: ``kappa = 0.3``, ``bank_capacity =
2 B``, ``momentum = 0``, ``max_rounds = 2`` (one refill round; ours). The loss is whatever
objective is configured (the spec suggests a DAPO/GSPO-style loss) [RECON].

Differences from the paper: the score accepts non-binary rewards (sample variance of the
verified rewards, whose bound assumes rewards in [0, 1]); groups may have any size (``n`` is the
group's verified count); the refill draws only from the bank (no fresh prompts: that is
``control.dynamic_sampling``, DAPO).

Logs nothing of its own: ``control/rounds``, ``control/budget_used`` and ``filter/low_variance``
show the refill and the filter. State (checkpointed): the prompt stream, the per-prompt history,
the bank (prompt ids, priorities, push order). The step's round counter is reset by ``plan``.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from rollwise.control.source import PromptSource, SourceController
from rollwise.types import Decision, Group, Plan, Prompt, Request

KAPPA_HELP = "Keep groups whose normalised reward variance p = s2 / s2_max is at least kappa (0..1) [RECON default]."


def normalized_variance(scores: Sequence[float]) -> float:
    """``p = s2 / s2_max`` of the rewards (see the module docstring); 0 for fewer than two.

    Worked example, G = 4 binary rewards [1, 1, 0, 0]: mean 0.5, s2 = 4 * 0.25 / 3 = 1/3,
    s2_max = 4 / (4 * 3) = 1/3, p = 1. For [1, 0, 0, 0]: s2 = (0.5625 + 3 * 0.0625) / 3 = 0.25,
    p = 0.75 (= 4 k (G - k) / G^2 for binary rewards and even G)."""
    n = len(scores)
    if n < 2:
        return 0.0
    mean = sum(scores) / n
    s2 = sum((s - mean) ** 2 for s in scores) / (n - 1)
    s2_max = n / (4 * (n - 1)) if n % 2 == 0 else (n + 1) / (4 * n)
    return s2 / s2_max


def group_score(group: Group) -> float:
    """``p`` of a group's verified rewards (rollouts that could not be verified are left out)."""
    return normalized_variance(group.verified_rewards())


class FilterOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kappa: float = Field(0.3, ge=0.0, le=1.0, description=KAPPA_HELP + " Use the same value as control.options.kappa.")


def variance_filter(group: Group, opts: FilterOptions = FilterOptions()) -> Decision:  # noqa: B008  (frozen)
    """VCRL's dynamic sampling (filter ``vcrl``): keep the group iff ``p >= kappa``."""
    if group_score(group) >= opts.kappa:
        return Decision(True, "kept")
    return Decision(False, "low_variance")


variance_filter.Options = FilterOptions


class VCRLOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kappa: float = Field(
        0.3,
        ge=0.0,
        le=1.0,
        description=KAPPA_HELP + " Groups below it are not counted as kept "
        "(refill) and evict their prompt from the bank; use the same value in filter.options.vcrl.kappa.",
    )
    bank_capacity: int | None = Field(
        None, ge=1, description="Most prompts in the memory bank (default 2 * control.prompts_per_step) [RECON]."
    )
    momentum: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Priority update on a revisit: momentum * old + (1 - momentum) * p (0 = the latest p) [RECON].",
    )
    max_rounds: int = Field(
        2, ge=1, description="Most generation rounds per step, the first included (1 = no refill from the bank) [ours]."
    )


class VCRL(SourceController):
    """VCRL (arXiv 2509.19803): fresh prompts, then bank refills for groups with p < kappa."""

    Options = VCRLOptions

    def __init__(self, prompts: Sequence[Prompt], cfg, options: VCRLOptions | None, seed: int):
        self.cfg = cfg
        self.opts = options if options is not None else self.Options()
        self.by_id = {p.id: p for p in prompts}
        # Without budget_rollouts the cap is the most the refill can ask for (never binds).
        self.source = PromptSource(
            prompts, seed, cfg, self.opts.max_rounds * cfg.prompts_per_step * cfg.rollouts_per_prompt
        )
        self.capacity = self.opts.bank_capacity or 2 * cfg.prompts_per_step
        self.bank: dict[str, tuple[float, int]] = {}  # prompt id -> (priority, push counter)
        self.pushes = 0  # monotone counter giving the push order
        self.rounds = 0  # generation rounds run in the current step

    @property
    def budget(self) -> int | None:
        return self.step_budget.rollouts

    # -------------------------------------------------------------- the controller protocol
    def select(self, state) -> list[Prompt]:
        return self.stream.take(self.cfg.prompts_per_step)

    def plan(self, prompts: list[Prompt], state) -> Plan:
        self.rounds = 1
        return self.source.cap([Request(p, self.cfg.rollouts_per_prompt) for p in prompts])

    def next_round(self, groups: list[Group], state) -> Plan:
        if self.rounds >= self.opts.max_rounds:
            return Plan()
        self.rounds += 1
        missing = self.cfg.prompts_per_step - sum(group_score(g) >= self.opts.kappa for g in groups)
        if missing <= 0:
            return Plan()
        n = self.cfg.rollouts_per_prompt
        left = self.source.remaining(groups)
        if left is not None:
            missing = min(missing, left // n)  # whole groups only
        seen = {g.prompt.id for g in groups}
        popped = [pid for pid in self.ranked() if pid not in seen][: max(0, missing)]
        for pid in popped:
            del self.bank[pid]
        return self.source.cap([Request(self.by_id[pid], n) for pid in popped], groups)

    def observe(self, groups: list[Group], state) -> None:
        self.source.record(groups, state.step)
        for g in groups:
            if not g.verified_rewards():
                continue
            self.update(g.prompt.id, group_score(g))
        self.evict_over_capacity()

    # -------------------------------------------------------------- the bank
    def update(self, pid: str, p: float) -> None:
        """Push, re-prioritise (momentum) or evict one prompt after a fresh score ``p``."""
        if p < self.opts.kappa:
            self.bank.pop(pid, None)
            return
        if pid in self.bank:
            old = self.bank[pid][0]
            p = self.opts.momentum * old + (1.0 - self.opts.momentum) * p
        self.pushes += 1
        self.bank[pid] = (p, self.pushes)

    def ranked(self) -> list[str]:
        """Bank prompt ids, highest priority first (ties: the most recently pushed first)."""
        return sorted(self.bank, key=lambda pid: (-self.bank[pid][0], -self.bank[pid][1]))

    def evict_over_capacity(self) -> None:
        while len(self.bank) > self.capacity:
            worst = min(self.bank, key=lambda pid: (self.bank[pid][0], self.bank[pid][1]))  # lowest, oldest
            del self.bank[worst]

    # -------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        return {
            **self.source.state_dict(),
            "bank": [[pid, pr, seq] for pid, (pr, seq) in self.bank.items()],
            "pushes": self.pushes,
        }

    def load_state_dict(self, s: dict) -> None:
        self.source.load_state_dict(s)
        self.bank = {pid: (float(pr), int(seq)) for pid, pr, seq in s["bank"]}
        self.pushes = int(s["pushes"])
        self.rounds = 0
