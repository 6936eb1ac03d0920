"""``wise3``: rollwise's own controller, v3 (issue #43 item 4) — the levers that saved separately,
composed, each one switchable so that an ablation is a set of option lines.

Not a paper: a composition of four anchors already in rollwise, at uniform's step shape. Every
lever is off by default except the skip, and a lever switched off leaves exactly the arm without it
(with every lever off this *is* ``uniform``: the same prompts, in the same order, the same plan).

1. **Skip the predicted-degenerate prompts, and refill** (``skip``). ``"history"``: GRESO's
   pre-rollout skip (arXiv 2506.02177; :func:`~rollwise.control.greso.streaks`,
   :func:`~rollwise.control.greso.skip_probability`, as ``wise`` v1): a prompt whose last ``z``
   visits were all correct (all wrong) is skipped with probability ``1 - max(p_easy^z, keep_floor)``
   (``p_hard``). ``"value"``: the value prior (V0 / POISE through :mod:`rollwise.value`, as
   ``wise2``): skipped when the predicted chance of a zero-variance group of ``G``,
   :func:`~rollwise.outcomes.degenerate_prob`, is at least ``skip_above`` (kept with probability
   ``keep_floor``). Where we differ from GRESO: its skip *shrinks* the step and dynamic sampling's
   rounds fill it afterwards (fewer optimizer steps per token, regime 1's lesson:
   docs/results.md "Regime 1"); here a skipped prompt is *replaced before generating* by the next
   prompt of the stream (REFILL), so every step trains ``prompts_per_step`` groups of ``G``. At most
   ``oversample x prompts_per_step`` candidates are looked at; if skipping leaves fewer, the first
   skipped ones fill the step. GRESO's online tuning of ``p`` is not used (fixed, as in ``wise``).
2. **Allocate rollouts per prompt** (``allocate``): DARS's equal-treatment schedule (arXiv
   2508.13755; :func:`~rollwise.control.dars.extra_rollouts`) gives a prompt whose last visit
   solved ``p_hat < 0.5`` of its rollouts ``G + ΔN``; the step's requests are then shrunk in
   proportion (:func:`~rollwise.control.budget.scale_plan`, through the step budget) to uniform's
   ``prompts_per_step x G`` rollouts. Where we differ from DARS: DARS adds its top-ups to the step
   (more rollouts per step) in a second round after observing stage 1; here ``p_hat`` is the last
   visit's accuracy (no first visit: ``ΔN = 0``), everything goes out in one round, and the total
   stays uniform's, so easy prompts give up rollouts to hard ones instead of the step growing.
3. **Stop hopeless rollouts**: not an option of this class, because stopping happens inside
   generation: ARRoL's online pruning (arXiv 2603.24840; :mod:`rollwise.generate.arrol`, the hf
   backend's decode hook), switched by ``sampling.arrol.enabled`` (``configs/wise3.toml``). It
   differs from the paper as that module says.
4. **Reuse past rollouts** (``reuse``): rollout replay (Sun et al., arXiv 2506.05316;
   :mod:`rollwise.replay.rollout_replay`): only ``round((1 - reuse) x prompts_per_step)`` prompts
   are generated, and the replay buffer supplies the rest of the batch, so a step costs
   ``1 - reuse`` of uniform's tokens while it trains as many groups. Set
   ``replay.name = "rollout_replay"`` with ``replay.options.replay_fraction`` equal to ``reuse``
   (and the replay-aware clip, ``objective.options = {tis_level = "token", tis_cap = 1e9}``); with
   ``reuse = 0`` the step is uniform's. Where we differ: the paper pairs replay with DOTS's
   attention-based difficulty selection; here it sits behind the skip above.

So the optimizer steps per generated token are at least uniform's: levers 1 and 2 keep the step's
``prompts_per_step x G`` rollouts, lever 4 divides a step's generation by ``1 / (1 - reuse)``;
only lever 3 spends extra tokens (ARRoL's over-sampled prefixes, ``check_tokens`` each) on rollouts
it then drops. No new math: each lever calls its anchor's own function.

Metrics: ``control/wise3_candidates`` (prompts looked at), ``control/wise3_skipped`` (of which
skipped), ``control/wise3_left_out`` (skipped and replaced by a refill), and with
``allocate`` ``control/wise3_topped_up`` (prompts given more than ``G``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rollwise.control.dars import extra_rollouts
from rollwise.control.greso import skip_probability, streaks
from rollwise.control.source import PromptSource, restore_rng
from rollwise.control.uniform import Uniform
from rollwise.outcomes import degenerate_prob
from rollwise.registry import Compat, UserError
from rollwise.types import Plan, Prompt, Request


class Wise3Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    skip: Literal["off", "history", "value"] = Field(
        "history",
        description="Skip prompts predicted degenerate and refill the step from the stream: 'history' (GRESO's "
        "streaks), 'value' (the pass-rate predictor; needs value.enabled) or 'off'.",
    )
    p_easy: float = Field(
        0.5, gt=0, le=1, description="skip = 'history': a prompt solved in its last z visits is kept with p_easy^z."
    )
    p_hard: float = Field(0.5, gt=0, le=1, description="skip = 'history': the same for all-wrong streaks.")
    skip_above: float = Field(
        0.8, gt=0, le=1, description="skip = 'value': skip when the predicted zero-variance chance is at least this."
    )
    keep_floor: float = Field(0.05, ge=0, le=1, description="Smallest chance that a prompt to skip is kept.")
    oversample: float = Field(
        3.0, ge=1.0, description="Most candidates looked at per trained prompt when skipping (the refill's reach)."
    )
    allocate: bool = Field(
        False,
        description="DARS's equal-treatment top-ups from the last visit's accuracy, scaled back to the step's "
        "prompts_per_step x G rollouts.",
    )
    n_max: int = Field(16, ge=1, description="allocate: most rollouts one prompt asks for before the scaling.")
    reuse: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Share of each batch left to the replay buffer: generate round((1 - reuse) x prompts_per_step) "
        "prompts; set replay.name = 'rollout_replay' with replay.options.replay_fraction equal to it.",
    )


def fresh_prompts(prompts_per_step: int, reuse: float) -> int:
    """Prompts generated per step when ``reuse`` of the batch is replayed: ``round((1 - reuse) B)``,
    at least 1 (B 32: reuse 0.5 -> 16, 0.25 -> 24, 0 -> 32). Rollout replay then adds
    ``round(16 x 0.5 / 0.5) = 16`` old groups, so the batch is B again."""
    return max(1, round((1.0 - reuse) * prompts_per_step))


class Wise3(Uniform):
    """Skip + refill, per-prompt allocation and reuse, each switchable (see the module)."""

    Options = Wise3Options
    compat = Compat(needs_value=("skip", "value"))

    @staticmethod
    def check_config(cfg, opts) -> None:
        """``reuse`` and rollout replay's ``replay_fraction`` describe one batch from two sides (the
        share this controller does not generate, the share the replay source fills): unequal, the batch
        is not ``prompts_per_step`` groups (0.5 against 0.25: 16 fresh + 5 replayed = 21 instead of 32),
        so both must be stated and equal."""
        reuse = (opts or Wise3Options()).reuse
        replayed = cfg.replay.name == "rollout_replay"
        fraction = cfg.replay.options.get("replay_fraction") if replayed else None
        if (reuse > 0 or replayed) and (fraction is None or not math.isclose(float(fraction), reuse)):
            raise UserError(
                f"control.options.reuse = {reuse} must equal replay.options.replay_fraction "
                f"(now {'unset' if fraction is None else fraction}, replay.name = {cfg.replay.name!r}): the share of "
                "each batch wise3 does not generate is the share rollout replay fills; set replay.name = "
                f"'rollout_replay' with replay.options.replay_fraction = {reuse}"
                + (" (or control.options.reuse to the replay's fraction)" if replayed else "")
            )

    def __init__(self, prompts: Sequence[Prompt], cfg, options: Wise3Options | None, seed: int):
        self.cfg = cfg
        self.opts = options if options is not None else Wise3Options()
        self.fresh = fresh_prompts(cfg.prompts_per_step, self.opts.reuse)
        self.source = PromptSource(prompts, seed, cfg, self.fresh * cfg.rollouts_per_prompt)
        self.rng = random.Random(f"wise3-{seed}")  # skip decisions; separate from the stream's shuffle
        self.metrics: dict[str, float] = {}
        self.value = None  # the pass-rate predictor (skip = "value"), bound by the assembler

    def bind(self, services) -> None:
        self.value = services.value

    # ------------------------------------------------------------------ lever 1: skip + refill

    def skipped(self, candidates: list[Prompt], state) -> list[bool]:
        """Which ``candidates`` are skipped this time (each draws from ``self.rng`` only when its
        prediction says degenerate, so a prompt without a streak costs no draw)."""
        o, g = self.opts, self.cfg.rollouts_per_prompt
        out = []
        if o.skip == "value":
            pred = self.value.predict(candidates, state.policy_version)
            for p in candidates:
                skip = degenerate_prob(pred[p.id], g) >= o.skip_above and self.rng.random() >= o.keep_floor
                out.append(skip)
            return out
        for p in candidates:
            z_easy, z_hard = streaks([r.mean_reward for r in self.history.of(p.id)])
            prob = max(
                skip_probability(o.p_easy, z_easy, o.keep_floor), skip_probability(o.p_hard, z_hard, o.keep_floor)
            )
            out.append(prob > 0 and self.rng.random() < prob)
        return out

    def select(self, state) -> list[Prompt]:
        if self.opts.skip == "off":
            self.metrics = {}
            return self.source.take(self.fresh)
        limit = math.ceil(self.opts.oversample * self.fresh)
        kept: list[Prompt] = []
        skipped: list[Prompt] = []
        seen: set[str] = set()
        looked = 0
        while len(kept) < self.fresh and looked < limit:  # refill: draw only as many as are missing
            batch = self.source.take(min(self.fresh - len(kept), limit - looked))
            looked += len(batch)
            batch = [p for p in dict((p.id, p) for p in batch).values() if p.id not in seen]  # wraps: once
            seen.update(p.id for p in batch)
            for p, skip in zip(batch, self.skipped(batch, state)):
                (skipped if skip else kept).append(p)
        fill = skipped[: self.fresh - len(kept)]
        self.metrics = {
            "control/wise3_candidates": float(looked),
            "control/wise3_skipped": float(len(skipped)),
            "control/wise3_left_out": float(len(skipped) - len(fill)),
        }
        return kept + fill

    # ------------------------------------------------------------------ lever 2: allocation

    def plan(self, prompts: list[Prompt], state) -> Plan:
        g = self.cfg.rollouts_per_prompt
        if not self.opts.allocate:
            return self.source.cap([Request(p, g) for p in prompts])
        sizes = []
        for p in prompts:
            last = self.history.last(p.id)
            dn = 0 if last is None or last.n == 0 else extra_rollouts(last.k / last.n, g, self.opts.n_max, "et", False)
            sizes.append(g + dn)
        self.metrics["control/wise3_topped_up"] = float(sum(n > g for n in sizes))
        return self.source.cap([Request(p, n) for p, n in zip(prompts, sizes)], how="scale")

    def state_dict(self) -> dict:
        return {**super().state_dict(), "rng": self.rng.getstate()}

    def load_state_dict(self, s: dict) -> None:
        super().load_state_dict(s)
        restore_rng(self.rng, s["rng"])
