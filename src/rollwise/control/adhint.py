"""``adhint``: ADHint's difficulty-scheduled hint prefixes (controller half; the advantage half is
``advantage.name = "adhint"``, :mod:`rollwise.objectives.adhint`).

Paper: "Adaptive Hints with Difficulty Priors for Reinforcement Learning" (ADHint),
arXiv 2512.13095 (Alibaba / BIT / PKU / CUHK-SZ; code "upon acceptance"); guidance.md §7b.
PARTIAL: one formula comes from a research note [SEC]; the rest is the spec's [RECON].

Per step, for each of ``prompts_per_step`` prompts (drawn as ``uniform`` does):

1. round 1, naive rollouts: ``n_N = rollouts_per_prompt - n_hinted`` (spec [RECON]: G/2 each);
2. sample difficulty prior ``Diff_N = 1 - mean(naive rewards)`` [SEC];
3. hint ratio ``w = (w_max - w_min) * Diff_N + w_min + noise`` [SEC], noise ~ U(-noise, noise),
   clipped to [0, w_max] [RECON: w_min 0, w_max 0.8, noise 0.05] (:func:`hint_ratio`);
4. round 2, ``n_hinted`` hinted rollouts: the first ``floor(w * |y*|)`` tokens of the reference
   solution ``y*`` (the task's ``target(prompt)``, the same reference the warm start uses) are a
   completion *prefix* the policy continues (``Request.prefix``), so the verifier judges hint +
   continuation. The hint tokens carry behaviour log-prob 0 (probability 1: they are off-policy,
   not sampled), and the policy version of the step. A hint of 0 tokens is a plain rollout.

Hinted rollouts join their prompt's group; before training (``finish_batch``) each is marked with
its hint length in ``Verdict.details["hint_tokens"]``, which the ``adhint`` advantage reads to
normalise naive and hinted rollouts separately (AE-RDP) and to mask the hint tokens of a hinted
rollout with a negative advantage (selective masking).

Deviations / not built: the hint is cut at a token count, not at a sentence or step boundary;
the prior comes from this step's naive rollouts (the two-pass design), not from history. Hint tokens of positive
hinted rollouts get the objective's plain ratio ``pi_theta / 1``, weighted per token by CGM when the
advantage option ``cgm = true`` (entropy-consistency modulation, the spec's [RECON] formula,
:mod:`rollwise.objectives.adhint`; ``configs/adhint_cgm.toml``); ``train_hint_tokens = false`` masks
them always (SEELE's choice). Metrics: ``control/adhint_hint_ratio_mean``,
``control/adhint_hint_tokens_mean``, ``control/adhint_diff_naive_mean``.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollwise.control.source import restore_rng
from rollwise.control.uniform import Uniform
from rollwise.registry import Compat, UserError
from rollwise.types import Group, Plan, Prompt, Request


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    n_hinted: int | None = Field(
        None,
        ge=1,
        description="Hinted rollouts per prompt (default rollouts_per_prompt // 2, spec [RECON]); the rest are naive.",
    )
    w_min: float = Field(0.0, ge=0.0, le=1.0, description="Hint ratio at Diff_N = 0 (spec [RECON] 0).")
    w_max: float = Field(0.8, ge=0.0, le=1.0, description="Hint ratio at Diff_N = 1, and its cap (spec [RECON] 0.8).")
    noise: float = Field(
        0.05, ge=0.0, description="Half-width of the uniform noise added to the hint ratio (spec [RECON] 0.05)."
    )

    @model_validator(mode="after")
    def _order(self):
        if self.w_min > self.w_max:
            raise ValueError(f"w_min ({self.w_min}) exceeds w_max ({self.w_max})")
        return self


def hint_ratio(diff: float, w_min: float, w_max: float, noise: float = 0.0) -> float:
    """``clip((w_max - w_min) * diff + w_min + noise, 0, w_max)``. Example: diff 0.5, w in [0, 0.8] -> 0.4."""
    return min(max((w_max - w_min) * diff + w_min + noise, 0.0), w_max)


def hint_length(w: float, reference_len: int) -> int:
    """``floor(w * |y*|)`` (never more than ``|y*|``)."""
    return min(reference_len, int(math.floor(w * reference_len + 1e-9)))


class ADHint(Uniform):
    Options = Options
    # finish_batch marks the hinted rollouts of the kept groups; naive and hinted rollouts are normalised separately by
    # its advantage (plain GRPO would pool them); hinted rounds continue prefixes of their own
    compat = Compat(
        batch_statistics=True, pairs_with=("advantage", "adhint"), dynamic_sampling=False, continues_prefixes=True
    )

    def __init__(self, prompts: Sequence[Prompt], cfg, options: Options | None, seed: int):
        super().__init__(prompts, cfg, options, seed)
        self.opts = options or Options()
        self.n_hinted = self.opts.n_hinted or cfg.rollouts_per_prompt // 2
        if not 1 <= self.n_hinted < cfg.rollouts_per_prompt:
            raise UserError(
                f"control.options.n_hinted ({self.n_hinted}) must be between 1 and control.rollouts_per_prompt - 1 "
                f"({cfg.rollouts_per_prompt - 1}); adhint needs naive and hinted rollouts of each prompt"
            )
        self.rng = random.Random(seed + 7919)
        self.task = self.codec = None
        self._round = 0
        self._hints: dict[str, tuple[int, ...]] = {}
        self.metrics: dict[str, float] = {}

    def bind(self, services) -> None:
        """The run's task (reference solutions, ``task.target``) and token codec (hint token ids)."""
        task, codec = services.task, services.codec
        if not hasattr(task, "target"):
            raise UserError(
                f"control.name = 'adhint' needs reference solutions: task {getattr(task, 'name', task)!r} has no "
                "target()"
            )
        self.task, self.codec = task, codec

    def plan(self, prompts: list[Prompt], state) -> Plan:
        self._round, self._hints = 0, {}
        naive = self.cfg.rollouts_per_prompt - self.n_hinted
        return self.source.cap([Request(p, naive) for p in prompts])

    def next_round(self, groups: list[Group], state) -> Plan:
        self._round += 1
        if self._round > 1:
            return Plan()
        if self.task is None:
            raise RuntimeError("ADHint.bind(services) was not called (the assembler binds it)")
        requests, ratios, lengths, diffs = [], [], [], []
        for g in groups:
            scores = g.verified_rewards()
            if not scores:
                continue
            diff = 1.0 - sum(scores) / len(scores)
            w = hint_ratio(diff, self.opts.w_min, self.opts.w_max, self.rng.uniform(-self.opts.noise, self.opts.noise))
            ref = tuple(self.codec.encode_text(self.task.target(g.prompt)))
            k = hint_length(w, len(ref))
            diffs.append(diff), ratios.append(w), lengths.append(k)
            if k == 0:
                requests.append(Request(g.prompt, self.n_hinted))
                continue
            hint = ref[:k]
            self._hints[g.prompt.id] = hint
            requests.append(
                Request(
                    g.prompt,
                    self.n_hinted,
                    prefix=hint,
                    prefix_logprobs=(0.0,) * k,
                    prefix_versions=(state.policy_version,) * k,
                )
            )
        n = max(len(ratios), 1)
        self.metrics = {
            "control/adhint_hint_ratio_mean": sum(ratios) / n,
            "control/adhint_hint_tokens_mean": sum(lengths) / n,
            "control/adhint_diff_naive_mean": sum(diffs) / n,
        }
        return self.source.cap(requests, groups)  # the naive round's groups count against the budget

    def finish_batch(self, groups: list[Group], kept: list[Group], dropped) -> list[Group]:
        """Mark each hinted rollout of the kept groups with ``Verdict.details["hint_tokens"]``."""
        out = []
        for g in kept:
            hint = self._hints.get(g.prompt.id)
            if not hint:
                out.append(g)
                continue
            rows = []
            for r in g.rollouts:
                if r.token_versions is not None and r.completion_ids[: len(hint)] == hint and r.verdict is not None:
                    r = dataclasses.replace(
                        r,
                        verdict=dataclasses.replace(r.verdict, details={**r.verdict.details, "hint_tokens": len(hint)}),
                    )
                rows.append(r)
            out.append(Group(g.prompt, tuple(rows)))
        return out

    def state_dict(self) -> dict:
        return {**super().state_dict(), "hint_rng": self.rng.getstate()}

    def load_state_dict(self, s: dict) -> None:
        super().load_state_dict(s)
        restore_rng(self.rng, s["hint_rng"])
