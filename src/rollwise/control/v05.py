"""``v05``: V0.5's value prior with a real-time test and on-demand extra rollouts (controller half;
the fused baseline is ``advantage.name = "v05"``, :mod:`rollwise.objectives.v05`).

Paper: "Generalist Value Model as a Prior for Sparse RL Rollouts" (V0.5), arXiv 2603.10848
(project page now-join-us.github.io/V0_5; no code found); allocation.md §11. Structure from the
abstract [PAPER-ABS]; every equation is the spec's reconstruction [RECON] (a standard shrinkage
estimator and z-test; the paper's "four steps" were not recovered).

Per step, for each of ``prompts_per_step`` prompts (drawn as ``uniform`` does):

1. read the prompt's prior ``v in [0, 1]`` (its expected reward under the current policy);
2. round 1: ``n_0 = rollouts_per_prompt`` rollouts;
3. test H0: p = v with ``z = (r_bar - v) / sqrt(v (1 - v) / n)`` (:func:`rejects`); a prior of
   exactly 0 or 1 is rejected by any disagreeing rollout;
4. each rejected prompt gets ``delta_n`` more rollouts (another round, merged into its group),
   up to ``cap`` rollouts per prompt and ``extra_budget`` extra rollouts per step; the test is
   redone after each round until no prompt is rejected or the caps are reached;
5. the ``v05`` advantage fuses v with the group mean (:func:`rollwise.objectives.v05.fuse`).

Deviation (the large one): the paper's prior is a *generalist value model* (V0) that predicts a
prompt's success in-context for the current policy. No such model is available here, so the prior
is pluggable (``prior``):

- ``"history"`` (default; ours, not the paper's): the prompt's mean verified reward over its last
  ``history_window`` steps, shrunk toward the mean of all prompts seen so far with
  ``history_strength`` pseudo-rollouts (0.5 before any data) — an empirical-Bayes stand-in that
  is biased the way V0 can be (it lags the policy);
- ``"metadata"``: ``Prompt.metadata["value_prior"]`` (a float in [0, 1]; every train prompt must
  have one, checked at construction);
- ``"learned"``: the run's pass-rate predictor (``value.enabled``, :mod:`rollwise.value`): a V0-style
  state-zero prediction from the policy's own prefill state and a context of recently observed
  prompts, trained online (issue #31) — the closest rollwise has to the paper's V0;
- ``"package.module:attr"``: a callable ``(prompt) -> float in [0, 1]`` (a V0 service, say).

Metrics: ``control/v05_rejected_frac`` (first test), ``control/v05_extra_rollouts``,
``control/v05_prior_mean``.

**Priors are kept per plan** (asynchronous rollouts, ``train.async.max_staleness`` = η >= 1, draw
plans k+1 .. k+η before step k's rounds): each ``plan`` call queues the priors of its prompts; the
step's rounds and the ``v05`` advantage read the oldest queued plan, the one the step trains, and
``observe`` takes it off the queue (the advantage reads it after ``observe``; periodic asynchrony
reads it before). So at η >= 1 step k tests and fuses plan k's priors, computed when plan k was
drawn (from the history up to step k - η - 1: a prior that lags η more steps). The queue is in the
checkpoint, with the plans the async pool keeps. Dynamic sampling is refused: its refill rounds call
``plan`` in the middle of a step (which also lost the first round's priors before).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from statistics import NormalDist

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rollwise.control.budget import StepBudget
from rollwise.control.uniform import Uniform
from rollwise.registry import Compat, Registry, UserError
from rollwise.types import AdvantageInputs, Group, Plan, Prompt, Request, Rollout

PRIORS = Registry("value prior")
PRIORS.register("history", None)  # built in the controller (needs its history)
PRIORS.register("metadata", None)  # read from Prompt.metadata
PRIORS.register("learned", None)  # the run's pass-rate predictor (value.enabled, rollwise.value)


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    prior: str = Field(
        "history",
        description="Value prior: 'history' (ours: the prompt's recent mean reward, shrunk to the global "
        "mean), 'metadata' (Prompt.metadata['value_prior']), 'learned' (the pass-rate predictor, value.enabled), "
        "or 'package.module:attr' (prompt) -> float in [0, 1].",
    )
    alpha: float = Field(
        0.05, gt=0.0, lt=1.0, description="Level of the two-sided z-test of H0: p = v (spec [RECON] 0.05)."
    )
    delta_n: int = Field(4, ge=1, description="Extra rollouts per escalation (spec [RECON] 4).")
    cap: int = Field(16, ge=1, description="Most rollouts per prompt including escalations (spec [RECON] 16-32).")
    extra_budget: int | None = Field(
        None,
        ge=0,
        description="Most extra rollouts per step over all prompts (default: prompts_per_step * "
        "(cap - rollouts_per_prompt)).",
    )
    history_window: int = Field(4, ge=1, description="'history' prior: steps of the prompt's own records averaged.")
    history_strength: float = Field(
        4.0, ge=0.0, description="'history' prior: pseudo-rollouts of the global mean it is shrunk toward."
    )

    @field_validator("prior")
    @classmethod
    def _known(cls, v: str) -> str:
        PRIORS.resolve(v)
        return v


def z_statistic(rbar: float, v: float, n: int) -> float:
    """``(r_bar - v) / sqrt(v (1 - v) / n)``; +-inf when v is 0 or 1 and r_bar differs, 0 when equal.
    Example: r_bar 1.0, v 0.5, n 4 -> 0.5 / 0.25 = 2.0."""
    var = v * (1.0 - v) / max(n, 1)
    if var <= 0.0:
        return 0.0 if rbar == v else math.copysign(math.inf, rbar - v)
    return (rbar - v) / math.sqrt(var)


def rejects(rbar: float, v: float, n: int, alpha: float) -> bool:
    """Two-sided z-test of H0: p = v at level ``alpha`` (|z| > z_{1 - alpha/2}; 1.96 at 0.05)."""
    return abs(z_statistic(rbar, v, n)) > NormalDist().inv_cdf(1.0 - alpha / 2.0)


class V05(Uniform):
    Options = Options

    compat = Compat(
        dynamic_sampling=False, needs_value=("prior", "learned")
    )  # a refill round re-plans mid-step: the v05 advantage would lack its priors

    def __init__(self, prompts: Sequence[Prompt], cfg, options: Options | None, seed: int):
        super().__init__(prompts, cfg, options, seed)
        self.opts = options or Options()
        if self.opts.cap < cfg.rollouts_per_prompt:
            raise UserError(
                f"control.options.cap ({self.opts.cap}) is below control.rollouts_per_prompt "
                f"({cfg.rollouts_per_prompt})"
            )
        self.extra_budget = (
            self.opts.extra_budget
            if self.opts.extra_budget is not None
            else cfg.prompts_per_step * (self.opts.cap - cfg.rollouts_per_prompt)
        )
        # the step budget (control.budget_rollouts / budget_tokens) caps every round; by default it
        # allows the first round plus the whole extra budget
        self.step_budget = StepBudget.from_config(
            cfg, cfg.prompts_per_step * cfg.rollouts_per_prompt + self.extra_budget
        )
        self._source: Callable[[Prompt], float] | None = None
        if self.opts.prior == "metadata":
            missing = [
                p.id
                for p in prompts
                if not isinstance(p.metadata.get("value_prior"), (int, float))
                or not 0.0 <= float(p.metadata["value_prior"]) <= 1.0
            ]
            if missing:
                raise UserError(
                    f"control.options.prior = 'metadata' needs metadata['value_prior'] in [0, 1] on every train "
                    f"prompt; missing or out of range on {len(missing)}, e.g. {missing[:3]}"
                )
            self._source = lambda p: float(p.metadata["value_prior"])
        elif self.opts.prior != "history":
            self._source = PRIORS.get(self.opts.prior)
        self._queued: list[dict[str, float]] = []  # priors of the plans drawn and not yet observed, oldest first
        self._observed: dict[str, float] | None = None  # the plan observe just took (None from the next plan on)
        self._extra = 0
        self._first = True
        self.value = None  # the pass-rate predictor (prior = "learned"), bound by the assembler
        self.metrics: dict[str, float] = {}

    def history_prior(self, prompt_id: str) -> float:
        """The 'history' prior: ``(k_own + s * m) / (n_own + s)`` over the prompt's last
        ``history_window`` records, ``m`` the mean verified reward of every record so far
        (0.5 before any). Example: own records 3/4 correct, m = 0.5, s = 4 -> (3 + 2) / 8 = 0.625."""
        recs = [r for rs in self.history.records.values() for r in rs]
        total_n = sum(r.n for r in recs)
        m = sum(r.mean_reward * r.n for r in recs) / total_n if total_n else 0.5
        own = self.history.of(prompt_id)[-self.opts.history_window :]
        n = sum(r.n for r in own)
        s = self.opts.history_strength
        return (sum(r.mean_reward * r.n for r in own) + s * m) / (n + s) if n + s > 0 else m

    def prior(self, prompt: Prompt) -> float:
        v = self.history_prior(prompt.id) if self._source is None else self._source(prompt)
        if v is None or not 0.0 <= float(v) <= 1.0:
            raise ValueError(f"value prior for prompt {prompt.id!r} must be a float in [0, 1], got {v!r}")
        return float(v)

    @property
    def _priors(self) -> dict[str, float]:
        """Priors of the plan this step trains: the one ``observe`` just took, else the oldest queued."""
        if self._observed is not None:
            return self._observed
        return self._queued[0] if self._queued else {}

    def bind(self, services) -> None:
        self.value = services.value  # prior = "learned": the pass-rate predictor (None when value.enabled is off)

    def plan(self, prompts: list[Prompt], state) -> Plan:
        if self.opts.prior == "learned":  # one batched prediction for the plan's prompts
            self._queued.append(self.value.predict(prompts, state.policy_version))
        else:
            self._queued.append({p.id: self.prior(p) for p in prompts})
        self._observed = None
        self._extra, self._first = 0, True  # this step's rounds all come after its plan call(s)
        trained = self._priors
        self.metrics = {
            "control/v05_prior_mean": sum(trained.values()) / max(len(trained), 1),
            "control/v05_rejected_frac": 0.0,
            "control/v05_extra_rollouts": 0.0,
        }
        return super().plan(prompts, state)

    def observe(self, groups: list[Group], state) -> None:
        super().observe(groups, state)
        self._observed = self._queued.pop(0) if self._queued else {}

    def next_round(self, groups: list[Group], state) -> Plan:
        requests, rejected = [], 0
        left = self.source.remaining(groups)
        budget = self.extra_budget - self._extra if left is None else min(self.extra_budget - self._extra, left)
        spent = 0
        for g in groups:
            scores = g.verified_rewards()
            v = self._priors.get(g.prompt.id)
            if v is None or not scores:
                continue
            if not rejects(sum(scores) / len(scores), v, len(scores), self.opts.alpha):
                continue
            rejected += 1
            more = min(self.opts.delta_n, self.opts.cap - g.size, budget - spent)
            if more > 0:
                requests.append(Request(g.prompt, more))
                spent += more
        self._extra += spent
        if self._first:
            self.metrics["control/v05_rejected_frac"] = rejected / max(len(groups), 1)
            self._first = False
        self.metrics["control/v05_extra_rollouts"] = float(self._extra)
        return Plan(tuple(requests))

    def advantage_inputs(self, rows: Sequence[Rollout], needs=()) -> AdvantageInputs:
        """This step's priors, when the estimator reads them (``value_prior``: advantage 'v05')."""
        return AdvantageInputs(priors=self.priors(rows) if "value_prior" in needs else None)

    def priors(self, rows: Sequence[Rollout]):
        """(B,) this step's prior of each row's prompt (the ``value_prior`` advantage input)."""
        import torch

        missing = sorted({r.prompt_id for r in rows} - set(self._priors))
        if missing:
            raise ValueError(
                f"no V0.5 prior for prompts {missing[:3]} (rows must come from this step's prompts; a replay "
                "that mixes in older groups does not combine with advantage 'v05')"
            )
        return torch.tensor([self._priors[r.prompt_id] for r in rows], dtype=torch.float32)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "queued": [dict(q) for q in self._queued]}

    def load_state_dict(self, s: dict) -> None:
        super().load_state_dict(s)
        self._queued = [dict(q) for q in s.get("queued", [])]
        self._observed = None
