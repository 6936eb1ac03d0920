"""``ar3po``: staged rollouts that stop at a prompt's first correct response, and reuse of a stored
correct response for groups that stay all wrong.

Paper: Zhang et al. 2025, "Improving Sampling Efficiency in RLVR through Adaptive Rollout and
Response Reuse", arXiv 2509.25808; docs/specs/selection.md §3. **No code was found**, and only the
abstract and secondary summaries were reachable: the *structure* (stages until the first success,
a replay store of correct responses used when new rollouts all fail) is from those sources; the
stage sizes, the store policy, the number of reused responses, the filter and the loss treatment
are **reconstructions** ([RECON] in the spec, §3.2-3.3). Label results "reconstruction".

Per step (k = ``control.rollouts_per_prompt``, S = ``options.stages``):

1. ``plan`` — **stage 1**: the step's ``prompts_per_step`` prompts get k rollouts each.
2. ``next_round`` — **stages 2..S** [RECON]: a prompt with a correct response so far (reward
   >= 0.5, the threshold of :class:`~rollwise.control.history.PromptHistory`) is finished; every
   other prompt gets k more rollouts (a request for the same prompt, merged into its group by the
   worker pool), until it succeeds or has had S stages. The step stops early when no prompt is
   left unfinished. Fresh responses per prompt with pass rate p: ``k Σ_{s<S} (1-p)^{k s}``
   (:func:`expected_fresh_responses`).
3. **Response reuse** [RECON: one response, newest wins, no expiry]: when a prompt's staging
   ends with no correct response among at least one verified rollout, and ``store[x]`` holds a
   correct response from an earlier step, that *one* rollout is appended to the group (S·k wrong
   + 1 correct). Never more than once per group; a prompt that never succeeded has no entry and
   is never rescued. Groups left all wrong (and all-correct stage-1 groups) are zero-variance and
   are dropped by the ``zero_variance`` filter (configs/ar3po.toml), with no refill: the number
   of trained groups varies.
4. ``observe`` — **store update**: for every prompt with a correct *freshly generated* response
   this step, ``store[x]`` becomes the last such rollout (newest wins). ``max_reuse_age`` (ours;
   default None = the spec's "no expiry") skips entries more than that many policy versions old
   (it was ``max_staleness``, the name of ``train.async``'s bound, and is refused under that name).

**How the reused rollout gets into the group.** The loop's rounds are ``groups =
pool.generate(plan, groups)`` then ``plan = next_round(groups)``; the list ``next_round`` sees is
the list the loop then filters, observes and trains on. When a prompt's staging ends,
``next_round`` replaces that prompt's entry *in this list* with a new ``Group`` record whose
rollouts are the fresh ones plus the stored rollout (records are never mutated; only the loop's
working list is). No shared file changes; it composes with dynamic sampling's wrapper, which calls
``next_round`` with the same list before counting passing groups, so a rescued group counts.

**The reused rollout is off-policy and stays labelled so.** It is the stored ``Rollout`` as it
was generated: its token ids, its sampler log-probs (behaviour policy mu of an older step), its
``policy_version`` and ``token_versions``, and its verdict (it is not re-verified). Which weight
the objective gives it is an *objective* option, because only the trainer has the current policy
(spec §3.2 step 6, §5.2):

- **option A** (the spec's default, used by configs/ar3po.toml): recompute ``pi_old`` with the
  current weights and treat the row as on-policy: ``objective.options = {tis_level = "token",
  tis_low = 1.0, tis_cap = 1.0}``. The trainer then fills ``prox_logprobs`` for every row, the
  ratio is ``pi_theta / pi_prox`` and the behaviour weight ``pi_prox / mu`` is truncated to
  exactly 1 (fresh rows are ordinary PPO; ``train/tis_clip_frac`` is meaningless in this mode).
- **option B** (DOTS replay clip, allocation.md §7.3): ``objective.options = {tis_level =
  "token", tis_cap = 1e9}``: PPO's clip around ``pi_prox`` times the untruncated ``pi_prox / mu``.
- rollwise's default ``tis_level = "off"`` (bypass): the ratio is ``pi_theta / mu`` of the old
  sampler, clipped by PPO; the stale row gets gradient only where that clip allows.

Counting (spec §5.1): every generated rollout is charged by the pool; the reused rollout is not
(it was charged when it was generated). ``observe`` leaves reused rollouts out of the history, so
per-prompt statistics and the budget's length estimate see only fresh rollouts. The loop's
``groups/*``, ``reward/mean`` and ``control/rollouts_per_prompt_*`` are computed on the groups
*with* the reused rollout (a rescued group is not degenerate).

**Budget** (not in the paper): all stages stay within the per-step
:class:`~rollwise.control.budget.StepBudget` (``control.budget_rollouts``, default
``prompts_per_step * k * S`` = the most the stages can ask for, so it never binds;
``control.budget_tokens``); a stage that does not fit is trimmed (last prompts first). A prompt
whose staging the budget cut short ends then; if it is still all wrong it may be rescued, like a
prompt after stage S (deviation: the spec applies reuse after stage S).

Logs ``control/ar3po_fresh_per_prompt`` (mean freshly generated responses per prompt, the paper's
"responses per training prompt"), ``control/ar3po_reused`` (groups rescued),
``control/ar3po_reused_frac`` (share of the step's rollouts that are reused),
``control/ar3po_reuse_staleness`` (mean policy-version age of the reused rollouts),
``control/ar3po_unrescued`` (groups left all wrong) and ``control/ar3po_store_size``.

State (checkpointed): the prompt stream, the history and the response store (whole ``Rollout``
records); the stage counters and the reused set are per step and empty between steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from rollwise.control.source import PromptSource, SourceController
from rollwise.registry import Compat
from rollwise.types import CORRECT, Group, Plan, Prompt, Request, Rollout


def expected_fresh_responses(p: float, k: int, stages: int) -> float:
    """``E = k Σ_{s=0}^{S-1} (1-p)^{k s}``: stage s+1 runs when the k·s earlier responses all
    failed. k = 4, S = 2: p = 0.5 -> 4 (1 + 1/16) = 4.25; p = 0 -> 8; p = 1 -> 4."""
    return k * sum((1.0 - p) ** (k * s) for s in range(stages))


def is_correct(r: Rollout) -> bool:
    return r.reward is not None and r.reward >= CORRECT


def has_correct(group: Group) -> bool:
    return any(is_correct(r) for r in group.rollouts)


class AR3POOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    # old option name -> new: refused naming the new one (rollwise.registry.validate_options); ``max_staleness``
    # is the bound of train.async, a different knob
    renamed: ClassVar[dict[str, str]] = {"max_staleness": "max_reuse_age"}
    stages: int = Field(
        2,
        ge=1,
        description="S: most generation stages per prompt; each stage gives a prompt with no "
        "correct response yet control.rollouts_per_prompt (k) more rollouts [RECON default 2].",
    )
    reuse: bool = Field(
        True,
        description="Append one stored correct response to a group still all wrong after its "
        "stages (false = adaptive rollout only).",
    )
    max_reuse_age: int | None = Field(
        None,
        ge=0,
        description="Reuse only stored responses at most this many policy "
        "versions old (None = no expiry, the spec's [RECON] default).",
    )


class AR3PO(SourceController):
    """AR3PO (arXiv 2509.25808), reconstructed: stages until the first success, then response reuse."""

    Options = AR3POOptions
    compat = Compat(keeps_plan_state=True)  # select() clears, plan() fills the stages that next_round reads

    def __init__(self, prompts: Sequence[Prompt], cfg, options: AR3POOptions | None, seed: int):
        self.cfg = cfg
        self.opts = options if options is not None else self.Options()
        self.k = cfg.rollouts_per_prompt
        self.source = PromptSource(prompts, seed, cfg, cfg.prompts_per_step * self.k * self.opts.stages)
        self.store: dict[str, Rollout] = {}  # prompt id -> newest correct rollout
        self._stages: dict[str, int] = {}  # this step: unfinished prompt id -> stages run
        self._reused: dict[str, Rollout] = {}  # this step: prompt id -> the rollout appended
        self.metrics: dict[str, float] = {}

    @property
    def budget(self) -> int:
        return self.step_budget.rollouts

    def select(self, state) -> list[Prompt]:
        self._stages = {}
        return self.stream.take(self.cfg.prompts_per_step)

    def plan(self, prompts: list[Prompt], state) -> Plan:
        plan = self.source.cap([Request(p, self.k) for p in prompts])
        for r in plan.requests:
            self._stages[r.prompt.id] = 1
        return plan

    def next_round(self, groups: list[Group], state) -> Plan:
        """The next stage's requests; prompts whose staging ends here are rescued in ``groups``
        (in place, see the module docstring)."""
        at = {g.prompt.id: i for i, g in enumerate(groups)}
        wanted = []
        for pid, s in list(self._stages.items()):
            if pid not in at or has_correct(groups[at[pid]]):
                del self._stages[pid]  # finished (or never generated)
            elif s < self.opts.stages:
                wanted.append(Request(groups[at[pid]].prompt, self.k))
        plan = self.source.cap(wanted, groups)
        going_on = {r.prompt.id for r in plan.requests}
        for pid in list(self._stages):
            if pid in going_on:
                self._stages[pid] += 1
            else:  # staging over with no correct response: reuse, if the store can
                del self._stages[pid]
                groups[at[pid]] = self.rescue(groups[at[pid]], state)
        return plan

    def rescue(self, group: Group, state) -> Group:
        """``group`` plus the stored correct response of its prompt, when there is one, reuse is
        on, the group has a verified rollout and was not rescued yet; else ``group`` unchanged."""
        stored = self.store.get(group.prompt.id)
        if (
            not self.opts.reuse
            or stored is None
            or group.prompt.id in self._reused
            or has_correct(group)
            or not group.verified_rewards()
        ):
            return group
        age = state.policy_version - stored.policy_version
        if self.opts.max_reuse_age is not None and age > self.opts.max_reuse_age:
            return group
        self._reused[group.prompt.id] = stored
        return Group(group.prompt, group.rollouts + (stored,))

    def fresh(self, group: Group) -> Group:
        """``group`` without the rollout reused this step (if any)."""
        stored = self._reused.get(group.prompt.id)
        if stored is None:
            return group
        return Group(group.prompt, tuple(r for r in group.rollouts if r is not stored))

    def observe(self, groups: list[Group], state) -> None:
        fresh = [self.fresh(g) for g in groups]
        self.source.record(fresh, state.step)
        for g in fresh:
            correct = [r for r in g.rollouts if is_correct(r) and r.finish in ("stop", "length")]
            if correct:
                self.store[g.prompt.id] = correct[-1]
        version = state.policy_version
        reused = list(self._reused.values())
        n_fresh = sum(g.size for g in fresh)
        self.metrics = {
            "control/ar3po_fresh_per_prompt": n_fresh / max(1, len(fresh)),
            "control/ar3po_reused": float(len(reused)),
            "control/ar3po_reused_frac": len(reused) / max(1, n_fresh + len(reused)),
            "control/ar3po_reuse_staleness": sum(version - r.policy_version for r in reused) / max(1, len(reused)),
            "control/ar3po_unrescued": float(
                sum(1 for g in fresh if g.verified_rewards() and not has_correct(g) and g.prompt.id not in self._reused)
            ),
            "control/ar3po_store_size": float(len(self.store)),
        }
        self._stages, self._reused = {}, {}

    def state_dict(self) -> dict:
        return {**self.source.state_dict(), "store": dict(self.store)}

    def load_state_dict(self, s: dict) -> None:
        self.source.load_state_dict(s)
        self.store = dict(s["store"])
        self._stages, self._reused = {}, {}
