"""``cures``: rollout quotas proportional to a per-prompt gradient-noise estimate, a Bayesian
posterior of prompt accuracy, and the posterior-weighted prompt sampler.

Paper: "From Gradient Analysis to Efficient Curriculum Learning for Reasoning LLMs" (CurES),
arXiv 2510.01037 (allocation.md §3); official code ZexuSun/CurES ("EPIC") at ``eccf2983``.

Per step:

1. ``select`` — the **sampler** (``EpicSampler``). Each train prompt i has the posterior mean
   accuracy ``p_i = E[Beta(1 + c_i, 1 + n_i - c_i)] = (c_i + 1)/(n_i + 2)`` from its whole
   :class:`~rollwise.control.history.PromptHistory` (``n_i`` verified rollouts, ``c_i`` correct,
   i.e. reward >= 0.5); an unseen prompt has ``p = 1/2``. Weights ``w_i = exp(sqrt(p_i (1 - p_i)) / tau_i)``;
   ``prompts_per_step`` distinct prompts are drawn with probability proportional to ``w``
   (successive draws without replacement, Efraimidis–Spirakis keys), independently every step.
   ``sampler="code"``: ``tau_i = 100 (c_i + 1)`` as released, which makes the distribution
   almost uniform (max/min ratio <= exp(0.005) = 1.005); ``sampler="paper"`` **[RECON]**: one
   ``tau`` for all prompts, so the curriculum bites; ``sampler="uniform"``: all weights 1.
2. ``plan`` — the **probe**: ``probe_rollouts`` (n_min, 4) rollouts per selected prompt.
3. ``next_round`` — the **quotas** (Neyman-style). From the probe, ``a_i = c_i / n_i`` and
   ``sigma_i = sqrt(a_i (1 - a_i))``; the rest of the step budget ``R`` is split as
   ``m_i ∝ sigma_i`` by largest remainders, so ``Sum m_i = R`` exactly (the code's ``round``
   can miss by a few). A prompt whose probe is all correct or all wrong has ``sigma = 0`` and
   gets no more rollouts: CurES's implicit skipping of saturated prompts. If every sigma is 0
   the rest of the budget is not spent. The budget is the per-step
   :class:`~rollwise.control.budget.StepBudget` (``control.budget_rollouts``, default
   ``prompts_per_step * rollouts_per_prompt``, and ``control.budget_tokens``); ``R`` is what it
   still allows after the probe.
4. ``observe`` — the **online Bayesian update**: every rollout of the step (probe and quota)
   is recorded in the history, so the next step's posteriors include it.

Gradient-noise estimate. The code computes ``sigma_i^2 = a b^2 E[g_c^2] + a^2 b E[g_w^2] -
a^2 b^2 (E[g_c] - E[g_w])^2`` (``a = c_i/n``, ``b = 1 - a``; ``g`` the embedding-gradient norms
of correct/wrong rollouts; :func:`gradient_noise`) with one backward pass per probe rollout.
A controller sees no gradients, so this uses unit norms (``g = 1``), which reduces the formula
exactly to ``sigma_i^2 = a b (a + b) = a b`` — the cheap proxy the spec allows (§3.3,
**[RECON]**). With ``probe_rollouts = 0`` there is no probe and ``sigma_i = sqrt(p_i (1 - p_i))``
comes from the posterior (never 0: no skipping), all in one round.

Differences from the released code: the probe runs per step on the selected prompts (the code
probes a whole data shard once per 10-step "iteration" and normalises quotas over the shard,
``Sum m_i = B * n_max``); here ``Sum m_i`` is the step's remaining budget. Probe rollouts are
trained on (they are real rollouts of the step; the code discards them), and a prompt gets
``probe + m_i`` rollouts (the code gives ``4 m_i``). The online update runs (the released
scripts leave it off because it sits in a disabled DAPO branch; the paper describes it).
"Correct" is reward >= 0.5 (the code: > 0.5). The code pads totals to a GPU-count multiple; not
needed here.

State: the sampler RNG, the history and the in-step context; all go into checkpoints.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rollwise.control.budget import StepBudget
from rollwise.control.history import PromptHistory
from rollwise.control.source import restore_rng
from rollwise.quota import proportional_quota
from rollwise.registry import Compat
from rollwise.types import Controller, Group, Plan, Prompt, Request


def posterior_mean(c: int, n: int) -> float:
    """``(c + 1) / (n + 2)``, the mean of Beta(1 + c, 1 + n - c) (uniform prior)."""
    return (c + 1) / (n + 2)


def sampling_weight(p: float, tau: float) -> float:
    """``exp(sqrt(p (1 - p)) / tau)``; largest at p = 1/2."""
    return math.exp(math.sqrt(max(0.0, p * (1.0 - p))) / tau)


def code_tau(c: int) -> float:
    """The released sampler's per-prompt temperature ``(c + 1) / 0.01``."""
    return (c + 1) / 0.01


def gradient_noise(a: float, gc2: float = 1.0, gw2: float = 1.0, gc: float = 1.0, gw: float = 1.0) -> float:
    """``sigma = sqrt(a b^2 E[g_c^2] + a^2 b E[g_w^2] - a^2 b^2 (E[g_c] - E[g_w])^2)``, ``b = 1 - a``
    (CurES code, "eq. 127"). With the default unit norms it is ``sqrt(a (1 - a))``.

    Example: a = 0.5, E[g_c^2] = 4, E[g_w^2] = 1, E[g_c] = 2, E[g_w] = 1 -> 0.5 + 0.125 - 0.0625
    = 0.5625 -> sigma = 0.75.
    """
    b = 1.0 - a
    var = a * b * b * gc2 + a * a * b * gw2 - a * a * b * b * (gc - gw) ** 2
    return math.sqrt(max(0.0, var))


class CuresOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    probe_rollouts: int = Field(
        4,
        ge=0,
        description="n_min: probe rollouts per selected prompt before the quotas "
        "(code: num_rollout_min = 4); 0 = no probe, sigma from the posterior.",
    )
    sampler: Literal["code", "paper", "uniform"] = Field(
        "code",
        description="Prompt sampler weights exp(sqrt(p(1-p))/tau): 'code' tau_i = 100(c_i+1) as released "
        "(almost uniform), 'paper' one tau [RECON], 'uniform' all equal.",
    )
    tau: float = Field(0.1, gt=0.0, description="tau of the 'paper' sampler (spec suggests 0.05-0.2) [RECON].")
    rates: Literal["posterior", "predicted"] = Field(
        "posterior",
        description="Without a probe (probe_rollouts = 0), sigma_i = sqrt(p_i (1 - p_i)) from the Beta 'posterior' "
        "(the paper) or from the pass-rate predictor's 'predicted' p_i (value.enabled) [ours]: a prompt predicted "
        "saturated gets few rollouts before any of its own.",
    )


class CurES(Controller):
    Options = CuresOptions
    # keeps_plan_state=True: plan() replaces the round context (probe phase, allocation) that next_round reads
    compat = Compat(needs_value=("rates", "predicted"), keeps_plan_state=True)

    def __init__(self, prompts: Sequence[Prompt], cfg, options: CuresOptions | None, seed: int):
        self.cfg = cfg
        self.opts = options or CuresOptions()
        self.prompts = list(prompts)
        self.by_id = {p.id: p for p in self.prompts}
        self.rng = random.Random(seed)
        self.history = PromptHistory()
        self.counts: dict[str, tuple[int, int]] = {}  # derived from history: id -> (n, c); rebuilt on load
        self.ctx = self._empty_ctx()
        self.metrics: dict[str, float] = {}
        self.step_budget = StepBudget.from_config(cfg, cfg.prompts_per_step * cfg.rollouts_per_prompt)
        self.value = None  # the pass-rate predictor (rates = "predicted"), bound by the assembler

    @staticmethod
    def _empty_ctx() -> dict:
        return {"ids": [], "alloc": {}, "phase": "done"}

    @property
    def budget(self) -> int:
        """Most rollouts per step (``budget_rollouts`` or ``prompts_per_step * rollouts_per_prompt``)."""
        return self.step_budget.rollouts

    # -------------------------------------------------------------- posterior and sampler
    def posterior(self, prompt_id: str) -> float:
        n, c = self.counts.get(prompt_id, (0, 0))
        return posterior_mean(c, n)

    def weights(self) -> list[float]:
        o = self.opts
        if o.sampler == "uniform":
            return [1.0] * len(self.prompts)
        out = []
        for p in self.prompts:
            n, c = self.counts.get(p.id, (0, 0))
            tau = code_tau(c) if o.sampler == "code" else o.tau
            out.append(sampling_weight(posterior_mean(c, n), tau))
        return out

    def select(self, state) -> list[Prompt]:
        """``prompts_per_step`` distinct prompts, drawn in proportion to the weights (all of them
        when the split is smaller). Keys ``log(u) / w``, largest first (Efraimidis–Spirakis)."""
        k = min(self.cfg.prompts_per_step, len(self.prompts))
        keys = [(math.log(1.0 - self.rng.random()) / w, i) for i, w in enumerate(self.weights())]
        keys.sort(key=lambda t: (-t[0], t[1]))
        return [self.prompts[i] for _, i in keys[:k]]

    def bind(self, services) -> None:
        self.value = services.value  # rates = "predicted": the pass-rate predictor

    # -------------------------------------------------------------- allocation
    def plan(self, prompts: list[Prompt], state) -> Plan:
        unique = list({p.id: p for p in prompts}.values())
        self.ctx = {"ids": [p.id for p in unique], "alloc": {p.id: 0 for p in unique}, "phase": "done"}
        for p in unique:
            self.by_id.setdefault(p.id, p)
        if self.opts.probe_rollouts > 0:
            plan = self.step_budget.cap([Request(p, self.opts.probe_rollouts) for p in unique], self.history)
            self.ctx["phase"] = "probe"
        else:
            if self.opts.rates == "predicted":
                pred = self.value.predict(unique, state.policy_version)
                rate = [pred[p.id] for p in unique]
            else:
                rate = [self.posterior(p.id) for p in unique]
            sig = [math.sqrt(r * (1 - r)) for r in rate]
            plan = self._quota_plan(unique, sig, [])
        for r in plan.requests:
            self.ctx["alloc"][r.prompt.id] += r.n
        return plan

    def next_round(self, groups: list[Group], state) -> Plan:
        if self.ctx["phase"] != "probe":
            return Plan()
        self.ctx["phase"] = "done"
        by_id = {g.prompt.id: g for g in groups}
        prompts = [self.by_id[pid] for pid in self.ctx["ids"]]
        sig = []
        for pid in self.ctx["ids"]:
            rs = by_id[pid].verified_rewards() if pid in by_id else []
            a = sum(r >= 0.5 for r in rs) / len(rs) if rs else 0.0  # no verified probe: sigma 0, skipped
            sig.append(gradient_noise(a))
        plan = self._quota_plan(prompts, sig, [g for g in groups if g.prompt.id in self.ctx["alloc"]])
        for r in plan.requests:
            self.ctx["alloc"][r.prompt.id] += r.n
        return plan

    def _quota_plan(self, prompts: list[Prompt], sigma: list[float], groups: list[Group]) -> Plan:
        """Split what the step budget still allows (given this step's ``groups``) as m_i ∝ sigma_i."""
        left = self.step_budget.remaining(self.history, groups)
        if left is None:
            left = self.budget - sum(self.ctx["alloc"].values())
        quota = proportional_quota(left, sigma)
        self.metrics = {
            "control/cures_skipped": float(sum(s == 0 for s in sigma)),
            "control/cures_sigma_mean": sum(sigma) / max(1, len(sigma)),
        }
        return Plan(tuple(Request(p, m) for p, m in zip(prompts, quota) if m > 0))

    # -------------------------------------------------------------- online Bayesian update
    def observe(self, groups: list[Group], state) -> None:
        self.history.record(groups, state.step)
        for pid in {g.prompt.id for g in groups}:
            self.counts[pid] = self.history.totals(pid)
        self.ctx = self._empty_ctx()

    # -------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        return {
            "rng": self.rng.getstate(),
            "history": self.history.state_dict(),
            "ctx": {"ids": list(self.ctx["ids"]), "alloc": dict(self.ctx["alloc"]), "phase": self.ctx["phase"]},
        }

    def load_state_dict(self, s: dict) -> None:
        restore_rng(self.rng, s["rng"])
        self.history.load_state_dict(s["history"])
        self.counts = {pid: self.history.totals(pid) for pid in self.history.records}
        c = s["ctx"]
        self.ctx = {"ids": list(c["ids"]), "alloc": dict(c["alloc"]), "phase": c["phase"]}
