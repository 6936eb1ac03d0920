"""``gdro``: Multi-Adversary Group DRO over online difficulty bins: the online difficulty
classifier, Prompt-GDRO (EMA-debiased EXP3P weights on the advantages) and Rollout-GDRO
(per-bin rollout counts under a mean budget, with a shadow price), each usable alone.

Paper: "Group Distributionally Robust Optimization-Driven Reinforcement Learning for LLM
Reasoning", Panaganti et al. (Tencent AI Lab), arXiv 2601.19280 (ICML 2026); code
kishanpb/verl-gdro @ b391899; docs/specs/guidance.md §1. The paper's equations are the default; the
released code's behaviour is an option where the spec says so.

**Classifier** (§1.1). A prompt's estimate ``p_hat`` is the mean of its last ``window`` (H) any-
correct indicators ``1{some rollout of the visit has reward >= 0.5}`` from the shared
:class:`~rollwise.control.history.PromptHistory` (all visits when H = 0); an unseen prompt has
``p_hat = 0`` (the code's rule), so it starts in bin 0. Bin ``b`` holds ``[a_{b-1}, a_b)`` for the
edges ``a`` (default 0.1 ... 0.9: 10 bins; ``len(edges) + 1`` bins in all). Hysteresis ``delta``: a
prompt leaves its previous bin upwards only if ``p_hat >= edges[prev] + delta``, downwards only if
``p_hat <= edges[raw] - delta`` (the code's boundary ``edges[min(prev, raw)]``). With
``exclude_extremes`` a prompt with ``p_hat`` 0 or 1 gets one extra class (its own weight, not
dropped). Prompts are classified once per step, in ``plan``, from the history *before* this
step's indicators (added by ``observe``).

**Prompt-GDRO** (§1.3; ``prompt_gdro = true``). Per bin a score ``S(b)``; over the bins present
in the batch (P, m = |P|):

- ``weights = "code"`` (default): ``q(b) = (1 - gamma) exp(eta S(b)) / sum_P exp(eta S) + gamma / m``;
  each row gets ``q(b_i)``, the row weights are rescaled to mean 1 and capped at ``weight_cap``;
- ``weights = "paper"`` (eq. 16): ``w_i = min(exp(eta clip(S(b_i), -C, C)), weight_cap)``.

The step's advantages (any estimator, per row and per token) are multiplied by ``w_i``
(``row_weights``, given as ``AdvantageInputs.weights`` before the estimator into the advantage
context; the batch builder, ``rollwise.batches``, multiplies them in). After the optimizer step
(``after_update``) the per-response losses ``l_i`` (below) give bin losses ``l_bar(b)``, divided by
the bin's share of the batch's rows when ``share_normalise``; then ``S(b) <- (1 - beta) S(b) + beta
l_tilde(b)`` (first observation: ``S = l_tilde``; absent bins unchanged). ``scores = "mean"`` keeps a
cumulative mean and ``"sum"`` the cumulative sum (the frequency-biased baseline the paper argues
against). Worked numbers (eta 0.65, gamma 0.01, S = (0.5, 0, -0.5), rows in bins [0, 0, 1, 2]):
q = (0.4444, 0.3220, 0.2336), code weights (1.2307, 1.2307, 0.8918, 0.6469).

**Loss signal** (§1.2). ``l_i`` = token mean of ``max(-A r_t, -A clip(r_t, 1 - eps_low, 1 + eps_high))``
with the *unweighted* advantage and ``r_t = pi_theta / mu`` **evaluated after the optimizer step**
(one no-grad forward; ``loss_signal = "surrogate_kl"`` adds ``kl_coef`` times the token-mean k3 KL to
the frozen reference, the paper's definition, and needs a reference model). [RECON] The code
collects the loss during the update, where the first mini-batch has ``r = 1`` and the on-policy
loss of every GRPO group is exactly 0 (the spec's [DERIVED] identity); with one optimizer step per
batch here, the post-update ratio is what the code's later mini-batches see.

**Rollout-GDRO** (§1.4.6; ``rollout_gdro = true``). Arms ``n in [n_min, n_max]`` per bin, arm
probabilities ``p_b(a) = (1 - gamma) softmax(eta s_b)(a) + gamma / |A|``; budget ``n_bar =
control.rollouts_per_prompt``. ``allocation``:

- ``"exact"`` (paper): dynamic programming over the active bins maximising ``sum_b log p_b(a_b)``
  subject to ``sum_b c_b a_b = B n_bar``; if no exact total is reachable, the closest one, then
  one rollout at a time is added to (removed from) the prompt whose bin has the most probable next
  arm, within [n_min, n_max] [RECON]: every allocation has ``sum_i n_i = B n_bar`` and, as the spec
  derives, mu cannot move;
- ``"soft"`` [RECON, the spec's recommendation when mu is wanted]: ``a_b ~ p_b`` independently (seeded);
  the budget holds in expectation through mu, between ``B n_min`` and ``B n_max``;
- ``"sqrt"`` (Theorem 4.2, deterministic): ``v_b = max(p_b (1 - p_b), 1e-3)`` from the bin's mean
  ``p_hat``, ``n_b = clip(n_bar sqrt(v_b) / sum_j q_j sqrt(v_j), n_min, n_max)``, rounded by largest
  remainder to ``B n_bar``.

After the update the played arm of each bin is scored with ``J_b = -l_bar(b)``:
``arm_update = "paper"``: ``s_b(n_b) -= (-J_b + mu n_b) / p_b(n_b)`` (EXP3 with importance weight);
``"code"``: ``s_b(n_b) += l_bar(b) - mu (n_b - n_bar)`` (no 1/p; rewards high-loss arms). Dual step
``mu <- clip(mu + dual_lr (n_realised - n_bar), 0, mu_max)``.

Differences (besides the [RECON] marks above): the code's Rollout-GDRO defects (dead arm/mu
update, labels of the previous batch) are not replicated: each prompt is classified from its own
history and the updates run. The code's focus maps and eta/gamma schedules are not built.
Advantages are multiplied after the estimator; the spec's advantage clip [-5, 5] is not applied
(the patched code does not read it either). Not with D3S down-sampling (its rows would no longer
match the step's rows): refused at load.

Logs ``control/gdro_*``: ``mu``, ``bins`` (present), ``weight_min/max``, ``loss_mean``,
``lead`` (sum_b b w(b) - sum_b b q_hat(b), the lead-lag statistic), ``n_mean``. State
(checkpointed): stream, history, previous bins, scores, arm scores, mu, the step's context.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Sequence
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollwise.control.source import PromptSource, SourceController, restore_rng
from rollwise.objectives.common import clipped_surrogate, kl_penalty, safe_exp, sequence_mean
from rollwise.registry import Compat, UserError
from rollwise.types import AdvantageInputs, Plan, Prompt, Request

DEFAULT_EDGES = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]


class GdroOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # classifier
    edges: list[float] = Field(
        default_factory=lambda: list(DEFAULT_EDGES),
        description="Bin edges inside (0, 1), increasing; "
        "len(edges) + 1 bins (paper: 10 equal bins; scripts also use [0.4, 0.75] and [0.1, 0.2, 0.4, 0.6, 0.8, 0.9]).",
    )
    window: int = Field(
        50,
        ge=0,
        description="H: p_hat is the mean of the last H any-correct indicators (0 = all visits; scripts 50 or 100).",
    )
    hysteresis: float = Field(
        0.03,
        ge=0.0,
        description="delta: margin a prompt's p_hat must cross a boundary by to change bin (scripts 0.03).",
    )
    exclude_extremes: bool = Field(False, description="Prompts with p_hat 0 or 1 form one extra class (code option).")
    # Prompt-GDRO
    prompt_gdro: bool = Field(True, description="Prompt-GDRO: multiply advantages by EXP3P bin weights.")
    eta: float = Field(0.65, gt=0.0, description="eta_q of the exponential weights (also the arm eta; paper 0.65).")
    gamma: float = Field(0.01, ge=0.0, le=1.0, description="Uniform exploration mass (bins and arms; paper 0.01).")
    ema: float = Field(
        0.12, gt=0.0, le=1.0, description="beta of the EMA of bin scores (paper 0.12; Rollout-GDRO scripts 0.4)."
    )
    scores: Literal["ema", "mean", "sum"] = Field(
        "ema",
        description="Bin score: EMA (paper), cumulative 'mean', or cumulative 'sum' (the frequency-biased baseline).",
    )
    share_normalise: bool = Field(
        True, description="Divide a bin's mean loss by its share of the batch's rows (Appendix A)."
    )
    weights: Literal["code", "paper"] = Field(
        "code",
        description="'code': q(b) over present bins, rescaled to mean 1; "
        "'paper': min(exp(eta clip(S, -C, C)), cap) (eq. 16).",
    )
    score_clip: float = Field(
        3.0, gt=0.0, description="C of the 'paper' weights (value not given by the paper) [RECON]."
    )
    weight_cap: float = Field(15.0, gt=0.0, description="omega_max: largest advantage multiplier (paper 15).")
    # loss signal
    loss_signal: Literal["surrogate", "surrogate_kl"] = Field(
        "surrogate",
        description="Per-response loss: the clipped surrogate "
        "(code), or plus kl_coef x KL to the reference (paper; needs a reference).",
    )
    kl_coef: float = Field(0.001, ge=0.0, description="beta_KL of 'surrogate_kl' (paper 0.001).")
    eps_low: float = Field(0.2, gt=0.0, description="Lower clip of the loss signal's surrogate (paper 0.2).")
    eps_high: float = Field(0.28, gt=0.0, description="Upper clip of the loss signal's surrogate (paper 0.28).")
    # Rollout-GDRO
    rollout_gdro: bool = Field(
        False, description="Rollout-GDRO: per-bin rollout counts with mean control.rollouts_per_prompt."
    )
    n_min: int = Field(2, ge=1, description="Smallest arm (paper 2).")
    n_max: int = Field(12, ge=1, description="Largest arm (paper 12 = 3 x 4).")
    allocation: Literal["exact", "soft", "sqrt"] = Field(
        "exact",
        description="'exact' budget DP (paper), 'soft' sampled arms "
        "with a working shadow price [RECON], 'sqrt' square-root rule.",
    )
    arm_update: Literal["paper", "code"] = Field(
        "paper",
        description="Arm score update: 'paper' EXP3 on L = -J + mu n with 1/p, 'code' s += loss - mu (n - n_bar).",
    )
    dual_lr: float = Field(0.05, ge=0.0, description="alpha_mu of the dual ascent on mu (paper 0.05).")
    mu_max: float = Field(1.0, ge=0.0, description="mu is projected onto [0, mu_max] (value not recovered) [RECON].")

    @model_validator(mode="after")
    def _check(self):
        e = self.edges
        if not e or any(not 0.0 < x < 1.0 for x in e) or any(b <= a for a, b in zip(e, e[1:])):
            raise ValueError(f"edges must be increasing values inside (0, 1), got {e}")
        if not (self.prompt_gdro or self.rollout_gdro):
            raise ValueError("at least one of prompt_gdro and rollout_gdro must be true")
        if self.n_min > self.n_max:
            raise ValueError(f"n_min ({self.n_min}) exceeds n_max ({self.n_max})")
        return self


# ---------------------------------------------------------------------------- pure pieces


def raw_bin(p: float, edges: Sequence[float]) -> int:
    """Bin of ``p``: b with edges[b-1] <= p < edges[b]. Edges (0.1, 0.2, 0.4, 0.6, 0.8, 0.9): 0.5 -> 3, 0.95 -> 6."""
    return bisect.bisect_right(list(edges), p)


def classify(p: float, prev: int | None, edges: Sequence[float], delta: float) -> int:
    """Bin with hysteresis (module docstring). prev 2, p 0.41, delta 0.03 -> 2; p 0.44 -> 3."""
    raw = raw_bin(p, edges)
    if prev is None or delta <= 0 or raw == prev or prev > len(edges):
        return raw
    if raw > prev:
        return raw if p >= edges[prev] + delta else prev
    return raw if p <= edges[raw] - delta else prev


def exp_weights(scores: Sequence[float], eta: float, gamma: float) -> list[float]:
    """``(1 - gamma) softmax(eta s) + gamma / len(s)``."""
    z = [eta * s for s in scores]
    top = max(z)
    e = [math.exp(v - top) for v in z]
    tot = sum(e)
    return [(1 - gamma) * v / tot + gamma / len(e) for v in e]


def code_row_weights(
    row_bins: Sequence[int], scores: dict[int, float], eta: float, gamma: float, cap: float
) -> list[float]:
    """Rows' Prompt-GDRO multipliers, code form: q over the present bins, mean-1 rescaled, capped."""
    present = sorted(set(row_bins))
    q = dict(zip(present, exp_weights([scores.get(b, 0.0) for b in present], eta, gamma)))
    w = [q[b] for b in row_bins]
    mean = sum(w) / len(w)
    return [min(x / mean, cap) for x in w]


def paper_row_weights(
    row_bins: Sequence[int], scores: dict[int, float], eta: float, clip: float, cap: float
) -> list[float]:
    """eq. 16: ``min(exp(eta clip(S, -C, C)), cap)`` per row."""
    return [min(math.exp(eta * max(-clip, min(clip, scores.get(b, 0.0)))), cap) for b in row_bins]


def ema_update(prev: float | None, value: float, beta: float) -> float:
    """``(1 - beta) prev + beta value``; the first observation initialises. 0, 0.3, 0.12 -> 0.036."""
    return value if prev is None else (1 - beta) * prev + beta * value


def response_loss(
    new_lp: torch.Tensor,
    old_lp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
    ref_lp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> torch.Tensor:
    """(B,) per-response loss: token mean of the clipped surrogate loss (+ kl_coef x k3 KL to the
    reference). With ``new == old`` it is ``-A`` per row, so GRPO groups sum to 0."""
    ratio = safe_exp(new_lp - old_lp)
    per_token, _ = clipped_surrogate(ratio, adv[:, None].expand_as(ratio), eps_low, eps_high)
    if ref_lp is not None and kl_coef:
        per_token = per_token + kl_coef * kl_penalty(new_lp, ref_lp, "k3")
    return sequence_mean(per_token, mask)


def sqrt_rule(share: Sequence[float], var: Sequence[float], n_bar: float) -> list[float]:
    """Theorem 4.2: ``n_b = n_bar sqrt(v_b) / sum_j q_j sqrt(v_j)``. q (0.5, 0.3, 0.2), v (0.01, 0.25,
    0.16), n_bar 4 -> (1.4286, 7.1429, 5.7143)."""
    norm = sum(q * math.sqrt(v) for q, v in zip(share, var))
    return [n_bar * math.sqrt(v) / norm if norm > 0 else n_bar for v in var]


def exact_dp(counts: Sequence[int], logp: Sequence[Sequence[float]], arms: Sequence[int], total: int) -> list[int]:
    """Arms per bin maximising ``sum_b logp[b][a_b]`` with ``sum_b counts[b] a_b`` equal to ``total``,
    or, if unreachable, closest to it (ties to the higher log-probability)."""
    best: dict[int, tuple[float, list[int]]] = {0: (0.0, [])}
    for c, lp in zip(counts, logp):
        nxt: dict[int, tuple[float, list[int]]] = {}
        for t, (score, path) in best.items():
            for j, a in enumerate(arms):
                key, val = t + c * a, score + lp[j]
                if key not in nxt or val > nxt[key][0]:
                    nxt[key] = (val, path + [a])
        best = nxt
    key = min(best, key=lambda t: (abs(t - total), -best[t][0]))
    return best[key][1]


def fit_total(n: list[int], total: int, lo: int, hi: int, up_key, down_key) -> list[int]:
    """Add (remove) one rollout at a time, to the prompt with the largest ``up_key(i)``
    (``down_key(i)``) among those below ``hi`` (above ``lo``), until ``sum(n) == total``."""
    n = list(n)
    while sum(n) < total:
        cand = [i for i in range(len(n)) if n[i] < hi]
        if not cand:
            break
        n[max(cand, key=lambda i: (up_key(i, n), -i))] += 1
    while sum(n) > total:
        cand = [i for i in range(len(n)) if n[i] > lo]
        if not cand:
            break
        n[max(cand, key=lambda i: (down_key(i, n), -i))] -= 1
    return n


# ---------------------------------------------------------------------------- the controller


class GDRO(SourceController):
    """Multi-Adversary GDRO (module docstring)."""

    Options = GdroOptions
    # batch_statistics: row_weights weighs and scores the whole batch's rows; keeps_plan_state=True: plan() sets
    # the bins, arms and counts that row_weights and after_update credit
    compat = Compat(batch_statistics=True, keeps_plan_state=True)

    def __init__(self, prompts: Sequence[Prompt], cfg, options: GdroOptions | None, seed: int):
        self.cfg = cfg
        self.opts = o = options if options is not None else GdroOptions()
        self.n_bar = cfg.rollouts_per_prompt
        if o.rollout_gdro and not o.n_min <= self.n_bar <= o.n_max:
            raise UserError(
                f"control.rollouts_per_prompt ({self.n_bar}) must lie in [n_min, n_max] = [{o.n_min}, {o.n_max}] "
                "for Rollout-GDRO (it is the mean budget n_bar)"
            )
        self.arms = list(range(o.n_min, o.n_max + 1))
        self.excl = len(o.edges) + 1  # label of the excluded extremes
        self.source = PromptSource(
            prompts,
            seed,
            cfg,
            cfg.prompts_per_step * (o.n_max if o.rollout_gdro and o.allocation == "soft" else self.n_bar),
        )
        self.rng = random.Random(f"gdro-{seed}")
        self.prev_bin: dict[str, int] = {}
        self.scores: dict[int, float] = {}  # S(b)
        self.cum: dict[int, list[float]] = {}  # b -> [sum of l_tilde, count]
        self.arm_scores: dict[int, list[float]] = {}  # b -> s_b over arms
        self.mu = 0.0
        self.ctx: dict = {"bins": {}, "arms": {}, "n": {}}
        self.raw_adv: torch.Tensor | None = None
        self.trainer = None  # bind(services)
        self.metrics: dict[str, float] = {}

    @staticmethod
    def check_config(cfg, opts) -> None:
        if cfg.batch.d3s.enabled:
            raise UserError(
                "control.name = 'gdro' weighs and scores the step's rows, which batch.d3s down-samples; "
                "turn one of them off"
            )
        o = opts or GdroOptions()
        if o.loss_signal == "surrogate_kl" and not (cfg.objective.options.get("kl_coef") or cfg.reward.kl.coef):
            raise UserError(
                "control.options.loss_signal = 'surrogate_kl' needs a reference model: set "
                "objective.options.kl_coef > 0 or reward.kl.coef > 0 (or use loss_signal = 'surrogate')"
            )

    @property
    def budget(self) -> int | None:
        return self.step_budget.rollouts

    # -------------------------------------------------------------- classifier
    def p_hat(self, pid: str) -> float:
        recs = self.history.of(pid)
        if self.opts.window:
            recs = recs[-self.opts.window :]
        return sum(r.k > 0 for r in recs) / len(recs) if recs else 0.0

    def bin_of(self, pid: str) -> int:
        o = self.opts
        p = self.p_hat(pid)
        if o.exclude_extremes and (p <= 0.0 or p >= 1.0):
            return self.excl
        b = classify(p, self.prev_bin.get(pid), o.edges, o.hysteresis)
        if o.hysteresis > 0:
            self.prev_bin[pid] = b
        return b

    # -------------------------------------------------------------- the step
    def select(self, state) -> list[Prompt]:
        return self.stream.take(self.cfg.prompts_per_step)

    def arm_probs(self, b: int) -> list[float]:
        return exp_weights(self.arm_scores.get(b, [0.0] * len(self.arms)), self.opts.eta, self.opts.gamma)

    def plan(self, prompts: list[Prompt], state) -> Plan:
        self.metrics = {"control/gdro_mu": self.mu}
        bins = {p.id: self.bin_of(p.id) for p in prompts}
        n = [self.n_bar] * len(prompts)
        arms: dict[int, int] = {}
        if self.opts.rollout_gdro and prompts:
            n, arms = self._allocate([bins[p.id] for p in prompts], [self.p_hat(p.id) for p in prompts])
        self.ctx = {"bins": bins, "arms": arms, "n": {p.id: k for p, k in zip(prompts, n)}}
        return self.source.cap([Request(p, k) for p, k in zip(prompts, n)])

    def _allocate(self, row_bins: list[int], p_hat: list[float]) -> tuple[list[int], dict[int, int]]:
        o, total = self.opts, self.n_bar * len(row_bins)
        order = list(dict.fromkeys(row_bins))  # bins in first-appearance order
        counts = [row_bins.count(b) for b in order]
        probs = {b: self.arm_probs(b) for b in order}
        idx = {a: j for j, a in enumerate(self.arms)}
        if o.allocation == "soft":
            chosen = {b: self.rng.choices(self.arms, weights=probs[b])[0] for b in order}
            return [chosen[b] for b in row_bins], chosen
        if o.allocation == "exact":
            picked = exact_dp(counts, [[math.log(p) for p in probs[b]] for b in order], self.arms, total)
            chosen = dict(zip(order, picked))
            n = [chosen[b] for b in row_bins]
            pb = lambda i, k: probs[row_bins[i]][idx[k]] if k in idx else -1.0  # noqa: E731
            n = fit_total(n, total, o.n_min, o.n_max, lambda i, m: pb(i, m[i] + 1), lambda i, m: pb(i, m[i] - 1))
            return n, chosen
        # sqrt: Bernoulli variance of each bin's mean p_hat, floored at 1e-3
        share = [c / len(row_bins) for c in counts]
        mean_p = {b: sum(p for p, rb in zip(p_hat, row_bins) if rb == b) / c for b, c in zip(order, counts)}
        var = [max(mean_p[b] * (1 - mean_p[b]), 1e-3) for b in order]
        target = dict(zip(order, (min(max(x, o.n_min), o.n_max) for x in sqrt_rule(share, var, self.n_bar))))
        n = [max(o.n_min, min(o.n_max, math.floor(target[b]))) for b in row_bins]
        frac = lambda i, m: target[row_bins[i]] - m[i]  # noqa: E731  (largest remainder first)
        n = fit_total(n, total, o.n_min, o.n_max, frac, lambda i, m: -frac(i, m))
        return n, {b: round(target[b]) for b in order}

    def _row_bins(self, rows) -> list[int]:
        return [
            self.ctx["bins"][r.prompt_id] if r.prompt_id in self.ctx["bins"] else self.bin_of(r.prompt_id) for r in rows
        ]

    def bind(self, services) -> None:
        """The trainer whose forward scores the step's per-response losses (``after_update``)."""
        self.trainer = services.trainer

    def advantage_inputs(self, rows, needs=()) -> AdvantageInputs:
        """Prompt-GDRO's row weights, the one advantage input this controller gives (no weights when
        ``prompt_gdro`` is off)."""
        return AdvantageInputs(weights=self.row_weights(rows))

    def row_weights(self, rows):
        """Prompt-GDRO: (B,) the rows' bin weights that multiply the step's advantages (None when off),
        computed before the estimator (``rollwise.batches.apply_row_weights`` multiplies them in)."""
        if not self.opts.prompt_gdro or not rows:
            return None
        o, row_bins = self.opts, self._row_bins(rows)
        w = (
            code_row_weights(row_bins, self.scores, o.eta, o.gamma, o.weight_cap)
            if o.weights == "code"
            else paper_row_weights(row_bins, self.scores, o.eta, o.score_clip, o.weight_cap)
        )
        share = {b: row_bins.count(b) / len(row_bins) for b in set(row_bins)}
        mass: dict[int, float] = {}
        for b, x in zip(row_bins, w):
            mass[b] = mass.get(b, 0.0) + x / sum(w)
        self.metrics = {
            "control/gdro_weight_min": min(w),
            "control/gdro_weight_max": max(w),
            "control/gdro_bins": float(len(share)),
            "control/gdro_lead": sum(b * m for b, m in mass.items()) - sum(b * q for b, q in share.items()),
        }
        return torch.tensor(w, dtype=torch.float64)  # exact: converted to the advantages' dtype where applied

    @torch.no_grad()
    def losses(self, batch, trainer) -> torch.Tensor:
        """(B,) per-response losses at the trainer's current weights (module docstring)."""
        from rollwise.trainer.trainer import token_logprobs

        o = self.opts
        adv = self.raw_adv if self.raw_adv is not None and self.raw_adv.shape[0] == batch.size else batch.advantages
        out = torch.zeros(batch.size)
        dtype = getattr(trainer, "compute_dtype", None)  # as the trainer's own forward passes
        for rows, mb in trainer.micro_batches(batch):
            new = token_logprobs(trainer.model, mb, trainer.temperature, compute_dtype=dtype)[0]
            ref = None
            if o.loss_signal == "surrogate_kl":
                if trainer.ref_model is None:
                    raise ValueError("loss_signal 'surrogate_kl' needs the trainer's reference model")
                ref = token_logprobs(trainer.ref_model, mb, trainer.temperature, compute_dtype=dtype)[0]
            loss = response_loss(
                new,
                mb.old_logprobs.to(new.dtype),
                adv[rows].to(new.device, new.dtype),
                mb.loss_mask.to(new.dtype),
                o.eps_low,
                o.eps_high,
                ref,
                o.kl_coef,
            )
            out[rows] = loss.float().cpu()
        return out

    def after_update(self, batch, rows, metrics: dict, advantages) -> None:
        """Bin losses -> Prompt-GDRO scores, Rollout-GDRO arm scores and the dual step; ``advantages``:
        the estimator's, before the bin weights (the surrogate loss's)."""
        self.raw_adv = advantages.values.detach().clone()
        if not rows:
            return
        o = self.opts
        has_loss = (batch.loss_mask.sum(dim=1) > 0).tolist()  # rows an estimator excluded carry no loss
        ell = [x for x, keep in zip(self.losses(batch, self.trainer).tolist(), has_loss) if keep]
        row_bins = [b for b, keep in zip(self._row_bins(rows), has_loss) if keep]
        if not ell:
            return
        by_bin: dict[int, list[float]] = {}
        for b, x in zip(row_bins, ell):
            by_bin.setdefault(b, []).append(x)
        mean_loss = {b: sum(v) / len(v) for b, v in by_bin.items()}
        self.update_scores(mean_loss, {b: len(v) / len(ell) for b, v in by_bin.items()})
        self.metrics["control/gdro_loss_mean"] = sum(ell) / len(ell)
        if o.rollout_gdro:
            self.update_arms(mean_loss)
        self.metrics["control/gdro_mu"] = self.mu

    def update_scores(self, mean_loss: dict[int, float], share: dict[int, float]) -> None:
        o = self.opts
        for b, loss in mean_loss.items():
            lt = loss / share[b] if o.share_normalise else loss
            acc = self.cum.setdefault(b, [0.0, 0])
            acc[0], acc[1] = acc[0] + lt, acc[1] + 1
            self.scores[b] = (
                ema_update(self.scores.get(b), lt, o.ema)
                if o.scores == "ema"
                else acc[0] / acc[1]
                if o.scores == "mean"
                else acc[0]
            )

    def update_arms(self, mean_loss: dict[int, float]) -> None:
        o, idx = self.opts, {a: j for j, a in enumerate(self.arms)}
        played = {b: a for b, a in self.ctx["arms"].items() if b in mean_loss and a in idx}
        for b, a in played.items():
            s = self.arm_scores.setdefault(b, [0.0] * len(self.arms))
            if o.arm_update == "paper":
                s[idx[a]] -= (mean_loss[b] + self.mu * a) / self.arm_probs(b)[idx[a]]
            else:
                s[idx[a]] += mean_loss[b] - self.mu * (a - self.n_bar)
        counts = list(self.ctx["n"].values())
        if counts:
            realised = sum(counts) / len(counts)
            self.mu = min(max(self.mu + o.dual_lr * (realised - self.n_bar), 0.0), o.mu_max)
            self.metrics["control/gdro_n_mean"] = realised

    # -------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        return {
            **self.source.state_dict(),
            "rng": self.rng.getstate(),
            "prev_bin": dict(self.prev_bin),
            "scores": dict(self.scores),
            "cum": {b: list(v) for b, v in self.cum.items()},
            "arm_scores": {b: list(v) for b, v in self.arm_scores.items()},
            "mu": self.mu,
            "ctx": {"bins": dict(self.ctx["bins"]), "arms": dict(self.ctx["arms"]), "n": dict(self.ctx["n"])},
        }

    def load_state_dict(self, s: dict) -> None:
        self.source.load_state_dict(s)
        restore_rng(self.rng, s["rng"])
        self.prev_bin = dict(s["prev_bin"])
        self.scores = {int(b): x for b, x in s["scores"].items()}
        self.cum = {int(b): list(v) for b, v in s["cum"].items()}
        self.arm_scores = {int(b): list(v) for b, v in s["arm_scores"].items()}
        self.mu = s["mu"]
        c = s["ctx"]
        self.ctx = {"bins": dict(c["bins"]), "arms": {int(b): a for b, a in c["arms"].items()}, "n": dict(c["n"])}
