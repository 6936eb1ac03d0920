"""``speed``: SPEED-RL screening, then continuation of the prompts with a mixed screen (and the
``complete_filter`` that keeps only finished groups).

Paper: Zhang, Arora, Mei, Zanette, "Faster Training of Reasoning Models via Online Curriculum
Learning" (SPEED-RL: Selective Prompting with Efficient Estimation of Difficulty), arXiv
2506.09016; code Zanette-Labs/speed-rl at ``80e47b5f`` (``data_controller.py``,
``fast_dapo_ray_trainer.py``, Algorithm 1 of the project page); docs/specs/selection.md §2.

The policy-gradient SNR of a prompt vanishes as its pass rate p -> 0 or 1, so SPEED spends a few
rollouts to find out which prompts have 0 < p < 1 and completes only those:

1. **Screen.** Each new prompt gets ``n_init`` rollouts; it is **accepted** iff its verified
   screening rewards are not all equal (``0 < k < n_init`` for binary rewards; the code: std of
   the accuracies > 0; the shared ``Group.is_zero_variance``, so fewer than two verified
   rewards reject).
2. **Continue.** An accepted prompt gets ``n_cont`` more rollouts under the same prompt id; the
   pool merges them into its group, so the **screening rollouts are part of the trained group**
   (N = ``n_init + n_cont``, as in the paper). A finished group is never ZV (its screen is mixed).
3. **One call.** Every generation round (``plan``, then each ``next_round``) holds the
   continuations of the prompts accepted in the previous round **and** the screening of the next
   ``screen_prompts`` prompts, in one :class:`~rollwise.types.Plan`.
4. **Step.** Rounds go on until ``B = control.prompts_per_step`` prompts have been continued.
   Only the missing number is continued each round (first accepted first), so exactly ``B``
   groups finish; screening stops once enough prompts are accepted. With
   ``continue_multiple = g > 1`` the continued count of a round is rounded down to a multiple of
   g (the code's #GPUs) and the rest waits for the next round (e.g. 10 accepted, g = 4: 8 now, 2
   later); it is not rounded down to 0.

Defaults: ``n_init = 4`` (the 7B script), ``n_cont = control.rollouts_per_prompt - n_init`` so a
trained group has the baseline's size (the spec's comparability: same batch shape as RLOO/GRPO at
that group size; the 7B script: 4 + 20 = 24), ``max_calls = 50`` (``max_num_gen_batches``).
``screen_prompts`` defaults to ``B`` [ours; the script screens 64 per call at B = 16, and keeps
what it does not need for later steps, which this loop cannot, see below]. A smaller value means
more rounds per step but fewer surplus screens: with an acceptance rate near 0.7 and B = 32, 32
screens per round leave about 12 surplus prompts per step (48 wasted rollouts at n_init = 4),
16 per round about 1, at the price of a fourth round.

**Use it with the filter** ``speed_complete`` (``rollwise.control.speed:complete_filter``) in ``filter.names``
(``configs/speed.toml``): the step's groups also hold rejected screens and accepted screens that
were not continued (surplus), each of ``n_init`` rollouts. Screening requests carry the finished
group size in ``Prompt.metadata[GROUP_SIZE_KEY]``; the filter drops a smaller group as
``speed_rejected`` (ZV screen) or ``speed_unfinished`` (mixed, not continued). Without it those
groups are trained.

**Budget.** Screening rollouts go through the worker pool, so they are charged to the ledger
(``cost/rollouts``, ``cost/generated_tokens``) and to ``control/budget_used``. Every round fits
the per-step :class:`~rollwise.control.budget.StepBudget` (``control.budget_rollouts`` /
``control.budget_tokens``): continuations first, whole ones only (``n_cont`` each), then whole
screens, and no screening once what is left could not also continue a prompt (``< n_init +
n_cont``). Without ``budget_rollouts`` the cap is the most the rounds can ask for,
``max_calls * screen_prompts * n_init + B * n_cont``, so it never binds.

Cost (§2.2, :func:`speed_cost`): expected rollouts per trained prompt ``n_init / q + n_cont``
with ``q`` the mean screening pass probability ``q_N(p) = 1 - p^N - (1 - p)^N``
(:func:`mixed_probability`).

Differences from the paper / code:

- **No pre-fetching across steps.** The loop generates a step's groups inside the step, so a
  prompt is screened and continued by the same policy version (the code's groups can straddle
  an update, uncorrected). Accepted prompts beyond ``B`` cannot keep their screens for the next
  step: their screening rollouts are dropped (``speed_unfinished``, counted in
  ``control/speed_surplus``) and the prompts go first into the next step's screening (the code
  continues them in the next call and keeps surplus finished groups for the next step). Finished
  groups are never surplus: only the missing number is continued.
- When ``max_calls`` rounds have run, the step trains on the groups finished so far (the code
  raises an error); the last allowed round only continues.
- A continuation is one request of ``n_cont`` rollouts (the code repeats the prompt
  ``n_cont / n_init`` times with ``n_init`` each, so ``n_cont`` must divide by ``n_init``; here it
  need not).
- Rejected prompts are not remembered (as the code); they come round again in a later epoch.
  A prompt already screened this step (stream wrap-around) is passed over.

Logs (``metrics``): ``control/speed_screened`` (prompts screened this step),
``control/speed_screen_rollouts``, ``control/speed_accepted``, ``control/speed_rejected``,
``control/speed_accept_rate`` (accepted / screened), ``control/speed_continued``,
``control/speed_cont_rollouts``, ``control/speed_surplus`` (accepted, not continued),
``control/speed_calls`` (generation rounds) and ``control/speed_queue`` (prompts waiting to be
screened first next step); the loop adds ``control/rounds`` and ``control/budget_used``.

State (checkpointed): the stream, the queue of surplus prompts and the per-prompt history; the
round context is per step and empty between steps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from rollwise.control.source import PromptSource, SourceController
from rollwise.registry import Compat, UserError
from rollwise.types import Decision, Group, Plan, Prompt, Request

GROUP_SIZE_KEY = "speed_group_size"  # Prompt.metadata: rollouts of a finished SPEED group


# ------------------------------------------------------------------------- the pure parts


def accepted(group: Group) -> bool:
    """A screen is accepted iff its verified rewards are not all equal (``0 < k < n`` for binary
    rewards); fewer than two verified rewards reject."""
    return not group.is_zero_variance()


def mixed_probability(p: float, n: int) -> float:
    """``q_N(p) = 1 - p^N - (1 - p)^N``, the chance that N samples at pass rate p are mixed.
    N = 4: 0.875 at p = 0.5, 0.3438 at p = 0.1 or 0.9, 0.6797 at p = 0.25."""
    return 1.0 - p**n - (1.0 - p) ** n


def speed_cost(q: float, n_init: int, n_cont: int) -> float:
    """Expected rollouts per trained prompt, ``n_init / q + n_cont`` (q = mean screening pass
    probability). Half p = 0, half p = 0.5, 4 + 20: q = 0.4375 -> 4 / 0.4375 + 20 = 29.14."""
    return n_init / q + n_cont


def continue_count(need: int, pending: int, multiple: int = 1) -> int:
    """Prompts to continue this round: ``min(need, pending)`` rounded down to a multiple of
    ``multiple`` unless that would be 0. 10 pending, need >= 10, multiple 4 -> 8 (2 wait)."""
    k = min(need, pending)
    if multiple > 1 and k >= multiple:
        k -= k % multiple
    return max(0, k)


def complete_filter(group: Group, opts=None) -> Decision:
    """Filter for ``speed``: drop a SPEED group smaller than its finished size
    (``Prompt.metadata[GROUP_SIZE_KEY]``): ``speed_rejected`` for a ZV screen,
    ``speed_unfinished`` for a mixed screen that was not continued. Other groups are kept."""
    size = group.prompt.metadata.get(GROUP_SIZE_KEY)
    if size is None or group.size >= size:
        return Decision(True, "kept")
    return Decision(False, "speed_rejected" if group.is_zero_variance() else "speed_unfinished")


# ------------------------------------------------------------------------- options


class SPEEDOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n_init: int = Field(
        4, ge=2, description="N_init: screening rollouts per new prompt (7B script: 4; 1.5B script: 8)."
    )
    n_cont: int | None = Field(
        None,
        ge=1,
        description="N_cont: continuation rollouts per accepted prompt (default "
        "control.rollouts_per_prompt - n_init, so a finished group has the baseline's size; "
        "7B script: 20).",
    )
    screen_prompts: int | None = Field(
        None,
        ge=1,
        description="New prompts screened per generation round (default "
        "control.prompts_per_step; the code's gen_batch_size is 64 at B = 16). Fewer "
        "means more rounds but fewer surplus screens (control/speed_surplus).",
    )
    max_calls: int = Field(
        50,
        ge=2,
        description="Most generation rounds per step (max_num_gen_batches; the code raises "
        "an error there, here the step trains on the finished groups).",
    )
    continue_multiple: int = Field(
        1,
        ge=1,
        description="Round the number of prompts continued per round down to a multiple "
        "of this (the code's #GPUs; never down to 0); 1 = continue all that are needed.",
    )


# ------------------------------------------------------------------------- the controller


class SPEED(SourceController):
    """SPEED-RL (arXiv 2506.09016): screen with n_init, continue mixed prompts with n_cont in the
    same call as the next screening, until B groups are finished."""

    Options = SPEEDOptions
    # without its filter the unfinished screens would be trained on; it runs its own rounds.
    # keeps_plan_state=True: select() starts the screen/continue context next_round reads (wise inherits it)
    compat = Compat(needs_filter="speed_complete", dynamic_sampling=False, keeps_plan_state=True)

    def __init__(self, prompts: Sequence[Prompt], cfg, options: SPEEDOptions | None, seed: int):
        self.cfg = cfg
        self.opts = o = options if options is not None else self.Options()
        if cfg.dynamic_sampling.enabled:
            raise UserError("control 'speed' runs its own rounds; set control.dynamic_sampling.enabled = false")
        self.n_init = o.n_init
        self.n_cont = o.n_cont if o.n_cont is not None else cfg.rollouts_per_prompt - o.n_init
        if self.n_cont < 1:
            raise UserError(
                f"control 'speed': control.rollouts_per_prompt ({cfg.rollouts_per_prompt}) must exceed "
                f"control.options.n_init ({o.n_init}), or set control.options.n_cont"
            )
        self.group_size = self.n_init + self.n_cont
        self.target = cfg.prompts_per_step  # B
        self.screen_prompts = o.screen_prompts or self.target
        self.by_id = {p.id: p for p in prompts}
        self.source = PromptSource(
            prompts, seed, cfg, o.max_calls * self.screen_prompts * self.n_init + self.target * self.n_cont
        )
        self.queue: list[str] = []  # surplus accepted prompts, screened first next step
        self.metrics: dict[str, float] = {}
        self._new_step()

    @property
    def budget(self) -> int | None:
        return self.step_budget.rollouts

    def _new_step(self) -> None:
        self._step_ids: set[str] = set()  # prompts screened this step
        self._screening: list[str] = []  # screened in the round just generated, verdict pending
        self._pending: list[str] = []  # accepted, not yet continued (first accepted first)
        self._continued: list[str] = []
        self._calls = 0
        self._done = False
        self._count = {"screened": 0, "accepted": 0, "rejected": 0, "surplus": 0}

    # -------------------------------------------------------------- prompts
    def fresh(self, k: int) -> list[Prompt]:
        """Up to ``k`` prompts not yet screened this step: the queue first, then the stream (at
        most one pass over the split, so a small split cannot loop)."""
        out: list[Prompt] = []
        seen = set(self._step_ids)
        while self.queue and len(out) < k:
            pid = self.queue.pop(0)
            if pid not in seen and pid in self.by_id:
                out.append(self.by_id[pid])
                seen.add(pid)
        looked = 0
        while len(out) < k and looked < len(self.by_id):
            p = self.stream.take(1)[0]
            looked += 1
            if p.id not in seen and self.admit(p):
                out.append(p)
                seen.add(p.id)
        return out

    def admit(self, prompt: Prompt) -> bool:
        """Whether a prompt drawn from the stream is screened (always here; ``wise`` skips some)."""
        return True

    def _screen_request(self, p: Prompt) -> Request:
        return Request(dataclasses.replace(p, metadata={**p.metadata, GROUP_SIZE_KEY: self.group_size}), self.n_init)

    def _screen_room(self, left: int | None) -> int:
        """Whole screens that fit in ``left`` rollouts (none once a prompt could not also be continued)."""
        if left is None:
            return self.screen_prompts
        if left < self.n_init + self.n_cont:
            return 0
        return min(self.screen_prompts, left // self.n_init)

    # -------------------------------------------------------------- rounds
    def select(self, state) -> list[Prompt]:
        self._new_step()
        return self.fresh(self.screen_prompts)

    def plan(self, prompts: list[Prompt], state) -> Plan:
        unique = [p for p in {p.id: p for p in prompts}.values() if p.id not in self._step_ids]
        room = min(len(unique), self._screen_room(self.source.remaining()))
        self.queue = [p.id for p in unique[room:]] + self.queue  # cut by the budget: first next time
        return self._round([], unique[:room])

    def _round(self, cont: list[str], screens: list[Prompt]) -> Plan:
        requests = [Request(self.by_id[pid], self.n_cont) for pid in cont] + [self._screen_request(p) for p in screens]
        if not requests:
            return self._finish()
        self._continued += cont
        self._screening = [p.id for p in screens]
        self._step_ids.update(self._screening)
        self._count["screened"] += len(screens)
        self._calls += 1
        return Plan(tuple(requests))

    def _finish(self) -> Plan:
        if not self._done:
            self._done = True
            self._count["surplus"] = len(self._pending)
            self.queue = [pid for pid in self._pending if pid not in self.queue] + self.queue
            self._pending = []
        return Plan()

    def next_round(self, groups: list[Group], state) -> Plan:
        if self._done:
            return Plan()
        by_id = {g.prompt.id: g for g in groups}
        for pid in self._screening:  # verdicts of the round just generated
            g = by_id.get(pid)
            if g is not None and accepted(g):
                self._pending.append(pid)
                self._count["accepted"] += 1
            else:
                self._count["rejected"] += 1
        self._screening = []
        need = self.target - len(self._continued)
        if need <= 0 or self._calls >= self.opts.max_calls:
            return self._finish()
        left = self.source.remaining(groups)
        k = continue_count(need, len(self._pending), self.opts.continue_multiple)
        if left is not None:
            k = min(k, left // self.n_cont)
            left -= k * self.n_cont
        cont, self._pending = self._pending[:k], self._pending[k:]
        still = need - k - len(self._pending)  # accepted prompts still missing
        screens: list[Prompt] = []
        if still > 0 and self._calls + 1 < self.opts.max_calls:  # a later round can continue them
            screens = self.fresh(self._screen_room(left))
        return self._round(cont, screens)

    # -------------------------------------------------------------- statistics
    def observe(self, groups: list[Group], state) -> None:
        self.source.record(groups, state.step)
        c = self._count
        verdicts = c["accepted"] + c["rejected"]
        self.metrics = {
            "control/speed_screened": float(c["screened"]),
            "control/speed_screen_rollouts": float(c["screened"] * self.n_init),
            "control/speed_accepted": float(c["accepted"]),
            "control/speed_rejected": float(c["rejected"]),
            "control/speed_accept_rate": c["accepted"] / verdicts if verdicts else 0.0,
            "control/speed_continued": float(len(self._continued)),
            "control/speed_cont_rollouts": float(len(self._continued) * self.n_cont),
            "control/speed_surplus": float(c["surplus"]),
            "control/speed_calls": float(self._calls),
            "control/speed_queue": float(len(self.queue)),
        }

    # -------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        return {**self.source.state_dict(), "queue": list(self.queue)}

    def load_state_dict(self, s: dict) -> None:
        self.source.load_state_dict(s)
        self.queue = list(s["queue"])
        self._new_step()
