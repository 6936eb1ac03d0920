"""``wise2``: rollwise's own controller, v2 — pick each step's prompts by their *predicted* chance
of a mixed group, before generating anything, and spend exactly uniform's rollouts on them.

Not a paper: a composition, chosen on regime 1 (``benchmarks/regime_cot.toml``; issue #31):

1. **Predict before generating** (V0, "A Generalist Value Model for Any Policy at State Zero", 2026,
   and POISE's probe on the policy's own states, "Your Language Model is Its Own Critic", 2026; both
   through :mod:`rollwise.value`, which marks its own reconstructions). Every candidate's pass rate
   ``p`` under the current policy is predicted from its prefill state and a context of recently
   observed prompts; first visits included, which GRESO's history skip (``greso``, ``wise`` v1) cannot
   do. The cost is one prefill forward per candidate (``value/forward_tokens``), no rollout.
2. **Skip the confident degenerate ones** (GRESO's idea, arXiv 2506.02177, on the prediction
   instead of a streak): a candidate whose predicted probability of a zero-variance group of ``G``
   rollouts, ``d = p^G + (1 - p)^G``, is at least ``skip_above`` is passed over, except with
   probability ``keep_floor`` (exploration; the predictor also learns from what it keeps).
3. **Prefer the informative ones** (the SNR argument of SPEED-RL, arXiv 2506.09016, and VCRL's
   variance curriculum): of the ``oversample x prompts_per_step`` candidates drawn from the shuffled
   stream, the ``prompts_per_step`` with the largest predicted ``1 - d`` are trained; if skipping
   leaves fewer, the best of the skipped fill the step.

Why no screening (``wise`` v1 screens with ``n_init`` rollouts and continues mixed prompts): in
regime 1 screening cost ~19k tokens per step against uniform's ~9.6k, so at an equal token budget
v1 got about half of uniform's optimizer steps and lost (docs/results.md, "Regime 1"). v2 keeps
uniform's step shape exactly: ``prompts_per_step x rollouts_per_prompt`` rollouts, one round, every
group trained (no filter), so its optimizer steps per generated token stay uniform's; the only
change is *which* prompts fill the step. A candidate not chosen goes back to nothing: it waits for
its next turn in the stream (the stream moves ``oversample`` times faster than uniform's).

Options: ``oversample`` (candidates per trained prompt), ``skip_above``, ``keep_floor``, ``rank``
(false: no preference, the first non-skipped candidates in stream order, so the step keeps uniform's
mix of prompts minus the confident degenerate ones). Needs
``value.enabled = true``. Metrics: ``control/wise2_candidates``, ``control/wise2_skipped``,
``control/wise2_pred_mean`` (predicted p of the trained prompts), ``control/wise2_pred_mixed``
(their mean predicted ``1 - d``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from rollwise.control.source import restore_rng
from rollwise.control.uniform import Uniform
from rollwise.outcomes import degenerate_prob
from rollwise.registry import Compat
from rollwise.types import Prompt


class Wise2Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    oversample: float = Field(3.0, ge=1.0, description="Candidates drawn from the stream per trained prompt.")
    skip_above: float = Field(
        0.8, gt=0.0, le=1.0, description="Skip a candidate whose predicted zero-variance probability is at least this."
    )
    keep_floor: float = Field(
        0.05, ge=0.0, le=1.0, description="Chance that a candidate to skip is kept (exploration)."
    )
    rank: bool = Field(
        True,
        description="Train the candidates most likely to give a mixed group (true), or the first ones in stream "
        "order that are not skipped (false: uniform's mix minus the confident degenerate ones).",
    )


class Wise2(Uniform):
    """Predicted-informativeness prompt choice at uniform's step shape (see the module)."""

    Options = Wise2Options
    compat = Compat(needs_value=True)

    def __init__(self, prompts: Sequence[Prompt], cfg, options: Wise2Options | None, seed: int):
        super().__init__(prompts, cfg, options, seed)
        self.opts = options if options is not None else Wise2Options()
        self.rng = random.Random(f"wise2-{seed}")  # skip decisions; separate from the stream's shuffle
        self.metrics: dict[str, float] = {}
        self.value = None  # the pass-rate predictor, bound by the assembler

    def bind(self, services) -> None:
        self.value = services.value

    def select(self, state) -> list[Prompt]:
        b, g = self.cfg.prompts_per_step, self.cfg.rollouts_per_prompt
        seen: dict[str, Prompt] = {}
        for p in self.source.take(math.ceil(self.opts.oversample * b)):
            seen.setdefault(p.id, p)  # the stream may wrap an epoch: a prompt once
        candidates = list(seen.values())
        pred = self.value.predict(candidates, state.policy_version)
        mixed = {p.id: 1.0 - degenerate_prob(pred[p.id], g) for p in candidates}
        order = range(len(candidates))  # stream order
        if self.opts.rank:
            order = sorted(order, key=lambda i: -mixed[candidates[i].id])  # stable: stream order on ties
        kept, skipped = [], []
        for i in order:
            p = candidates[i]
            skip = 1.0 - mixed[p.id] >= self.opts.skip_above and self.rng.random() >= self.opts.keep_floor
            (skipped if skip else kept).append(p)
        chosen = (kept + skipped)[:b]
        self.metrics = {
            "control/wise2_candidates": float(len(candidates)),
            "control/wise2_skipped": float(len(skipped)),
            "control/wise2_pred_mean": sum(pred[p.id] for p in chosen) / max(1, len(chosen)),
            "control/wise2_pred_mixed": sum(mixed[p.id] for p in chosen) / max(1, len(chosen)),
        }
        return chosen

    def state_dict(self) -> dict:
        return {**super().state_dict(), "rng": self.rng.getstate()}

    def load_state_dict(self, s: dict) -> None:
        super().load_state_dict(s)
        restore_rng(self.rng, s["rng"])
