"""``greso``: skip prompts before rollout from their zero-variance history, with adaptive rounds.

Paper: "Act Only When It Pays: Efficient Reinforcement Learning for LLM Reasoning via Selective
Rollouts" (GRESO), arXiv 2506.02177; code Infini-AI-Lab/GRESO at ``b2778431`` (a verl fork:
``presampling_selector.py``, ``ray_trainer.py``); docs/specs/selection.md §1.

Whether a prompt's group is zero-variance (ZV: all rewards equal, no GRPO signal) is strongly
correlated across epochs, so GRESO skips a prompt *before* paying for its rollouts, with a
probability that grows with its current run of ZV visits, keeps a floor of exploration, and
retunes the base probabilities online. Everything after rollout is DAPO dynamic sampling.

1. **Streaks** (:func:`streaks`, §1.1). From the prompt's records in the shared
   :class:`~rollwise.control.history.PromptHistory` (one per rollout of the prompt, written by
   ``observe`` before any filter): ``z_easy`` = trailing records with mean reward
   ``>= easy_threshold``, ``z_hard`` = trailing records with mean ``<= hard_threshold`` (at most
   one is non-zero). An unseen prompt has ``z = 0``; a skipped prompt gets no record, so its
   streak is frozen until it is rolled out again.
2. **Skip** (:func:`skip_probability`, §1.2). Each candidate is skipped with probability
   ``1 - max(p_easy^z_easy, keep_floor)``, else with ``1 - max(p_hard^z_hard, keep_floor)``, else
   kept. ``z = 0`` is never skipped; the keep probability never falls below ``keep_floor`` (0.01,
   the paper's "minimum exploration probability").
3. **Online tuning** (:func:`tune`, §1.3), once per step in ``observe`` over every group the
   step rolled out (all rounds, before filtering): ``r_easy`` / ``r_hard`` = share of groups with
   mean ``>= easy_threshold`` / ``<= hard_threshold``; ``p_hard <- max(p_hard - step, p_min)`` if
   ``r_hard >= 2 alpha / 3`` else ``min(p_hard + step, p_max)``, and the same for ``p_easy``
   against ``alpha / 3`` (``alpha = target_zero_variance``). Only from epoch ``tune_from_epoch``
   (the code: ``epoch > 0``) of the prompt stream on. A lower p skips more.
4. **Rounds** (:func:`round_size`, §1.4). Round 1 draws candidates from the seeded shuffled
   stream (as ``uniform``) and keeps the survivors of step 2 until it holds ``S_round =
   round_prompts`` prompts (``sampling_batch_size``), each with ``n = control.rollouts_per_prompt``
   rollouts. After a round, with ``pool`` = non-ZV groups of the step so far (the shared
   ``Group.is_zero_variance``) and ``zeta`` = ZV share of the round just finished: if ``pool >= B``
   the step is done; otherwise ``S_next = int((B - pool) n / (1 - zeta) / n * 1.25)``, the round
   after is the **last** when ``S_next <= round_prompts``, and it draws ``S_round =
   max(min(S_next, round_prompts), min_round_prompts)`` survivors. After a last round the step
   trains on what it has. ``B`` is ``control.dynamic_sampling.target_groups`` (default
   ``control.prompts_per_step``).

Use it with ``filter.names = ["zero_variance"]`` and ``control.dynamic_sampling.enabled = true``
(``configs/greso.toml``). Dynamic sampling (:mod:`rollwise.control.rounds`) then supplies the
ZV-filter check and the truncation of the batch to the first ``B`` passing groups in generation
order (``filter/surplus``), as the paper's "take the first B"; its own refill never adds a round
after GRESO's (GRESO closes its stream when it stops, see :class:`GresoStream`). Without dynamic
sampling every passing group is trained (possibly more than ``B``).

**Budget.** Every round is fitted into the per-step :class:`~rollwise.control.budget.StepBudget`
(``control.budget_rollouts`` / ``control.budget_tokens``; the last prompts of a round lose
rollouts first); without ``budget_rollouts`` the rollout cap is the most the rounds can ask for,
``max_rounds * round_prompts * n``, so it never binds. The step stops when the budget is spent.

Differences from the paper / code:

- Candidates are drawn one at a time until exactly ``S_round`` survive (the code applies the skip
  to 32-prompt loader chunks until at least ``S_round`` survive and trims the count to a multiple
  of the GPUs; trimmed prompts are lost for the epoch). A round looks at most one pass over the
  train split of candidates [ours], so a split where nearly everything is skipped gives a smaller
  round instead of an endless draw. A prompt already rolled out this step (possible when the
  stream wraps around an epoch) is passed over.
- Rounds per step are bounded by ``control.dynamic_sampling.max_rounds`` (the code: unbounded;
  it stops only after a round marked last) and by the step budget [ours].
- ``zeta`` is clamped to ``zeta_cap = 0.95`` before dividing by ``1 - zeta`` **[RECON]** (the code
  divides by zero when a round is all ZV).
- Thresholds default to the binary-reward reading ``mean >= 1`` / ``mean <= 0`` (the code's 0.98 /
  0.11 are for its 1 / 0.1 / 0 reward scale; with binary rewards and n > 9 they would call one
  success "hard"). ``easy_threshold = 0.98, hard_threshold = 0.11`` reproduces the code.
- The hard share counts every group at or below ``hard_threshold``. The code counts groups whose
  rewards all equal 0.1 (boxed but wrong) and so leaves all-0 groups out of both shares; with
  binary rewards that quirk would never lower ``p_hard``, so it is not reproduced.
- ``round_prompts`` defaults to ``ceil(1.5 B)`` and ``min_round_prompts`` to ``max(1, B // 4)``
  (the released scripts: 384 / 256 and 192 / 128 = 1.5; minimum 64 at B = 256) [ours: scaled].
- Rewards need not be binary: streaks and shares use mean rewards, ``pool`` / ``zeta`` the
  verified-reward ZV test with tolerance 0 (not the configured filter chain's ``tol``).

Logs (``metrics``): ``control/greso_p_easy``, ``control/greso_p_hard`` (after this step's update),
``control/greso_r_easy``, ``control/greso_r_hard``, ``control/greso_candidates``,
``control/greso_skipped_easy``, ``control/greso_skipped_hard``, ``control/greso_skip_frac``
(skipped / candidates), ``control/greso_zv_frac`` (ZV share of the step's groups) and
``control/greso_pool`` (non-ZV groups), and with ``first_visit = "predicted"``
``control/greso_skipped_predicted``; the loop adds ``control/rounds`` and
``control/budget_used`` (rollouts planned over all rounds: ZV groups included).

State (checkpointed): the stream (position, shuffle RNG), the skip RNG, ``p_easy``, ``p_hard`` and
the per-prompt history; the round context is per step and empty between steps.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollwise.control.rounds import target_groups
from rollwise.control.source import PromptSource, PromptStream, SourceController, restore_rng
from rollwise.outcomes import degenerate_prob
from rollwise.registry import Compat
from rollwise.types import Group, Plan, Prompt, Request

# ------------------------------------------------------------------------- the pure parts


def streaks(means: Sequence[float], easy_threshold: float = 1.0, hard_threshold: float = 0.0) -> tuple[int, int]:
    """``(z_easy, z_hard)``: trailing records (oldest first in ``means``) with mean
    ``>= easy_threshold`` / ``<= hard_threshold``; at most one of the two is non-zero.

    Example (thresholds 0.98 / 0.11): ``[1.0, 0.1, 1.0, 1.0]`` -> (2, 0); ``[0.0, 0.1, 0.1]`` ->
    (0, 3); ``[0.1, 0.1, 0.5]`` -> (0, 0).
    """
    z_easy = z_hard = 0
    for m in reversed(means):
        if m >= easy_threshold and not z_hard:
            z_easy += 1
        elif m <= hard_threshold and not z_easy:
            z_hard += 1
        else:
            break
    return z_easy, z_hard


def keep_probability(p: float, z: int, floor: float = 0.01) -> float:
    """``max(p^z, floor)`` for ``z >= 1``; 1 for ``z = 0`` (a prompt without a streak is kept)."""
    return 1.0 if z <= 0 else max(p**z, floor)


def skip_probability(p: float, z: int, floor: float = 0.01) -> float:
    """``1 - keep_probability``. With p = 0.5: 0.5, 0.75, 0.875 at z = 1, 2, 3; 0.99 for z >= 7
    (0.5^7 = 0.0078 < 0.01)."""
    return 1.0 - keep_probability(p, z, floor)


def tune(p: float, share: float, target: float, step: float = 0.01, lo: float = 0.05, hi: float = 0.95) -> float:
    """One step of the fixed-step controller: ``share >= target`` -> ``max(p - step, lo)`` (skip
    more), else ``min(p + step, hi)``. Rounded to 10 decimals so repeated steps do not drift."""
    p = max(p - step, lo) if share >= target else min(p + step, hi)
    return round(p, 10)


def round_size(
    pool: int, target: int, n: int, zeta: float, s_max: int, s_min: int, safety: float = 1.25, zeta_cap: float = 0.95
) -> tuple[int, bool]:
    """``(S_round, last)`` of the next round when the step holds ``pool`` of ``target`` groups and
    the round just finished had ZV share ``zeta``:
    ``S_next = int((target - pool) n / (1 - min(zeta, zeta_cap)) / n * safety)``,
    ``last = S_next <= s_max``, ``S_round = max(min(S_next, s_max), s_min)``.

    Example (B = 256, n = 8, 384 / 64): pool 128, zeta 0.6 -> 1024 / 0.4 / 8 * 1.25 = 400 ->
    (384, False); pool 224, zeta 0.5 -> 256 / 0.5 / 8 * 1.25 = 80 -> (80, True); pool 250,
    zeta 0.5 -> 15 -> (64, True).
    """
    missing = max(0, target - pool) * n
    s_next = int(missing / (1.0 - min(zeta, zeta_cap)) / n * safety)
    return max(min(s_next, s_max), s_min), s_next <= s_max


# ------------------------------------------------------------------------- options


class GRESOOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    p_easy: float = Field(
        0.5,
        gt=0,
        le=1,
        description="Initial base probability p_easy: a prompt with z_easy consecutive "
        "all-correct visits is kept with probability max(p_easy^z, keep_floor) (code: 0.5).",
    )
    p_hard: float = Field(
        0.5, gt=0, le=1, description="Initial base probability p_hard, the same for all-wrong streaks (code: 0.5)."
    )
    target_zero_variance: float = Field(
        0.25,
        gt=0,
        lt=1,
        description="alpha: target ZV share of rolled-out prompts, split "
        "alpha/3 (easy) and 2 alpha/3 (hard) (code: 0.25).",
    )
    adjust_step: float = Field(
        0.01, ge=0, description="Change of p_easy / p_hard per step of online tuning (code: 0.01)."
    )
    p_min: float = Field(0.05, gt=0, le=1, description="Lower bound of p_easy / p_hard (code: 0.05).")
    p_max: float = Field(0.95, gt=0, le=1, description="Upper bound of p_easy / p_hard (code: 0.95).")
    keep_floor: float = Field(
        0.01, ge=0, le=1, description="Minimum keep probability of any prompt, the exploration floor (code: 0.01)."
    )
    easy_threshold: float = Field(
        1.0,
        description="A visit is 'easy' when its mean reward is >= this (1.0 for binary rewards; "
        "the code's 0.98 is for its 1 / 0.1 / 0 reward scale).",
    )
    hard_threshold: float = Field(
        0.0,
        description="A visit is 'hard' when its mean reward is <= this (0.0 for binary rewards; "
        "the code's 0.11 is for its 1 / 0.1 / 0 reward scale).",
    )
    tune_from_epoch: int = Field(
        1, ge=0, description="Online tuning runs from this epoch of the prompt stream on (code: epoch > 0, i.e. 1)."
    )
    round_prompts: int | None = Field(
        None,
        ge=1,
        description="S_max, prompts rolled out in the first round and at most in any "
        "round (sampling_batch_size; default ceil(1.5 B), the released scripts' ratio).",
    )
    min_round_prompts: int | None = Field(
        None, ge=1, description="Smallest later round (default max(1, B // 4); code: 64 at B = 256)."
    )
    safety: float = Field(1.25, gt=0, description="Safety factor of the next round's size (code: 1.25).")
    first_visit: Literal["keep", "predicted"] = Field(
        "keep",
        description="A prompt with no record yet: 'keep' it (the paper) or skip it with the predicted probability "
        "p^n + (1-p)^n that its group is zero-variance, p from the pass-rate predictor (value.enabled) [ours].",
    )
    zeta_cap: float = Field(
        0.95,
        ge=0,
        lt=1,
        description="The previous round's ZV share is clamped to this before dividing "
        "by 1 - zeta [RECON: the code divides by zero at 1].",
    )

    @model_validator(mode="after")
    def _consistent(self) -> GRESOOptions:
        if self.p_min > self.p_max:
            raise ValueError(f"p_min ({self.p_min}) must not exceed p_max ({self.p_max})")
        if self.hard_threshold >= self.easy_threshold:
            raise ValueError(
                f"hard_threshold ({self.hard_threshold}) must be below easy_threshold ({self.easy_threshold})"
            )
        if (
            self.round_prompts is not None
            and self.min_round_prompts is not None
            and self.min_round_prompts > self.round_prompts
        ):
            raise ValueError("min_round_prompts must not exceed round_prompts")
        return self


class GresoStream(PromptStream):
    """The seeded shuffled prompt stream, closed for the rest of a step once GRESO stops it.

    ``take`` returns nothing while closed, so :class:`~rollwise.control.rounds.DynamicSampling`
    (which refills from ``controller.stream``) never adds a round after GRESO's last one; GRESO's
    own draws use :meth:`draw`.
    """

    closed = False

    def take(self, n: int) -> list[Prompt]:
        return [] if self.closed else super().take(n)

    def draw(self) -> Prompt:
        return super().take(1)[0]


# ------------------------------------------------------------------------- the controller


class GRESO(SourceController):
    """GRESO (arXiv 2506.02177): probabilistic pre-rollout skipping from ZV streaks, online
    tuning of (p_easy, p_hard), DS rounds of adaptive size."""

    Options = GRESOOptions
    # GRESO runs its own rounds inside DAPO refill; 'replace' would redraw whole batches through select mid-step.
    # keeps_plan_state=True: select() starts the round context (round prompts, counters) that next_round reads
    compat = Compat(dynamic_sampling="refill", needs_value=("first_visit", "predicted"), keeps_plan_state=True)

    def __init__(self, prompts: Sequence[Prompt], cfg, options: GRESOOptions | None, seed: int):
        self.cfg = cfg
        self.opts = options if options is not None else self.Options()
        self.n_prompts = len(prompts)
        self.n = cfg.rollouts_per_prompt
        self.target = target_groups(cfg) or cfg.prompts_per_step  # B
        self.s_max = self.opts.round_prompts or math.ceil(1.5 * self.target)
        self.s_min = min(self.opts.min_round_prompts or max(1, self.target // 4), self.s_max)
        self.max_rounds = cfg.dynamic_sampling.max_rounds
        self.source = PromptSource(
            prompts, seed, cfg, self.max_rounds * self.s_max * self.n, stream=GresoStream(prompts, seed)
        )
        self.rng = random.Random(f"greso-{seed}")  # skip decisions; separate from the stream's shuffle
        self.p_easy, self.p_hard = self.opts.p_easy, self.opts.p_hard
        self.metrics: dict[str, float] = {}
        self.value, self._version = None, 0  # the pass-rate predictor (first_visit = "predicted") and its policy
        self._new_step()

    @property
    def budget(self) -> int | None:
        return self.step_budget.rollouts

    def _new_step(self) -> None:
        self.stream.closed = False
        self._step_ids: set[str] = set()  # prompts rolled out this step
        self._round_ids: list[str] = []  # prompts of the round just generated
        self._rounds = 0
        self._last = False  # the round just generated was marked last
        self._count = {"candidates": 0, "skipped_easy": 0, "skipped_hard": 0}
        self._skipped_predicted = 0  # first visits skipped on the prediction (first_visit = "predicted")

    # -------------------------------------------------------------- skip
    def streaks(self, prompt_id: str) -> tuple[int, int]:
        return streaks(
            [r.mean_reward for r in self.history.of(prompt_id)], self.opts.easy_threshold, self.opts.hard_threshold
        )

    def bind(self, services) -> None:
        self.value = services.value  # first_visit = "predicted": the pass-rate predictor

    def skip(self, prompt_id: str, prompt: Prompt | None = None) -> str | None:
        """ "easy" / "hard" when the prompt is skipped this time, None when it is kept (§1.2). With
        ``first_visit = "predicted"`` a prompt never rolled out is skipped with probability
        ``min(p^n + (1-p)^n, 1 - keep_floor)``, p its predicted pass rate [ours]."""
        if self.opts.first_visit == "predicted" and prompt is not None and not self.history.of(prompt_id):
            p = self.value.predict([prompt], self._version)[prompt_id]
            prob = min(degenerate_prob(p, self.n), 1.0 - self.opts.keep_floor)
            if self.rng.random() < prob:
                self._skipped_predicted += 1
                return "easy" if p >= 0.5 else "hard"
            return None
        z_easy, z_hard = self.streaks(prompt_id)
        floor = self.opts.keep_floor
        for kind, p, z in (("easy", self.p_easy, z_easy), ("hard", self.p_hard, z_hard)):
            prob = skip_probability(p, z, floor)
            if prob > 0 and self.rng.random() < prob:  # z = 0 draws nothing: never skipped
                return kind
        return None

    def draw(self, k: int) -> list[Prompt]:
        """Up to ``k`` survivors of the skip, looking at most one pass over the split of candidates."""
        out: list[Prompt] = []
        looked = 0
        while len(out) < k and looked < self.n_prompts:
            p = self.stream.draw()
            looked += 1
            if p.id in self._step_ids or any(q.id == p.id for q in out):
                continue
            self._count["candidates"] += 1
            kind = self.skip(p.id, p)
            if kind is None:
                out.append(p)
            else:
                self._count[f"skipped_{kind}"] += 1
        return out

    # -------------------------------------------------------------- rounds
    def select(self, state) -> list[Prompt]:
        self._new_step()
        self._version = state.policy_version  # the policy the predictions are made for
        return self.draw(self.s_max)

    def _round(self, prompts: list[Prompt], groups: Sequence[Group]) -> Plan:
        plan = self.source.cap([Request(p, self.n) for p in prompts], groups)
        if not plan:
            return self._stop()
        self._round_ids = [r.prompt.id for r in plan.requests]
        self._step_ids.update(self._round_ids)
        self._rounds += 1
        return plan

    def _stop(self) -> Plan:
        self.stream.closed = True
        return Plan()

    def plan(self, prompts: list[Prompt], state) -> Plan:
        fresh = list({p.id: p for p in prompts if p.id not in self._step_ids}.values())
        return self._round(fresh, ())

    def next_round(self, groups: list[Group], state) -> Plan:
        if self.stream.closed:
            return Plan()
        by_id = {g.prompt.id: g for g in groups}
        done = [by_id[i] for i in self._round_ids if i in by_id]
        zeta = sum(g.is_zero_variance() for g in done) / len(done) if done else 1.0
        pool = sum(not g.is_zero_variance() for g in groups)
        if pool >= self.target or self._last or self._rounds >= self.max_rounds:
            return self._stop()
        size, self._last = round_size(
            pool, self.target, self.n, zeta, self.s_max, self.s_min, self.opts.safety, self.opts.zeta_cap
        )
        return self._round(self.draw(size), groups)

    # -------------------------------------------------------------- online tuning
    def shares(self, groups: Sequence[Group]) -> tuple[float, float]:
        """``(r_easy, r_hard)`` over the groups with a verified reward."""
        means = [sum(s) / len(s) for s in (g.verified_rewards() for g in groups) if s]
        if not means:
            return 0.0, 0.0
        easy = sum(m >= self.opts.easy_threshold for m in means)
        hard = sum(m <= self.opts.hard_threshold for m in means)
        return easy / len(means), hard / len(means)

    def observe(self, groups: list[Group], state) -> None:
        o = self.opts
        r_easy, r_hard = self.shares(groups)
        if self.stream.epoch >= o.tune_from_epoch and groups:
            a = o.target_zero_variance
            self.p_easy = tune(self.p_easy, r_easy, a / 3, o.adjust_step, o.p_min, o.p_max)
            self.p_hard = tune(self.p_hard, r_hard, 2 * a / 3, o.adjust_step, o.p_min, o.p_max)
        self.source.record(groups, state.step)
        c = self._count
        skipped = c["skipped_easy"] + c["skipped_hard"]
        zv = sum(g.is_zero_variance() for g in groups)
        self.metrics = {
            "control/greso_p_easy": self.p_easy,
            "control/greso_p_hard": self.p_hard,
            "control/greso_r_easy": r_easy,
            "control/greso_r_hard": r_hard,
            "control/greso_candidates": float(c["candidates"]),
            "control/greso_skipped_easy": float(c["skipped_easy"]),
            "control/greso_skipped_hard": float(c["skipped_hard"]),
            "control/greso_skip_frac": skipped / max(1, c["candidates"]),
            "control/greso_zv_frac": zv / max(1, len(groups)),
            "control/greso_pool": float(len(groups) - zv),
        }
        if self.opts.first_visit == "predicted":  # first visits skipped on the predictor's word (in easy/hard too)
            self.metrics["control/greso_skipped_predicted"] = float(self._skipped_predicted)

    # -------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        return {**self.source.state_dict(), "rng": self.rng.getstate(), "p_easy": self.p_easy, "p_hard": self.p_hard}

    def load_state_dict(self, s: dict) -> None:
        self.source.load_state_dict(s)
        restore_rng(self.rng, s["rng"])
        self.p_easy, self.p_hard = float(s["p_easy"]), float(s["p_hard"])
        self._new_step()
