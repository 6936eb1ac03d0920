"""``scope``: SCOPE step-wise correction of near-miss rollouts [RECON — the whole algorithm].

Paper: "Recycling Failures: Salvaging Exploration in RLVR via Fine-Grained Off-Policy Guidance"
(SCOPE), arXiv 2602.24110 (Ren et al., Feb 2026; no code found); guidance.md §4. ABSTRACT ONLY:
the paper's idea is to find the *first erroneous step* of a failed rollout with a process verifier,
keep the policy's own correct prefix, and rectify from that step on with off-policy guidance. Every
concrete choice below is the spec's reconstruction or ours, and is unverified.

Per step (prompts and rollouts drawn as ``uniform`` does), after the filters (``finish_batch``):

1. candidates: rollouts with reward below ``success_at``;
2. a step verifier names the first erroneous step k* (0-based): ``detector``, one of the FAPO flaw
   detectors (:mod:`rollwise.flaws`; ``"rule"`` = first false equation, for the built-in
   task with ``cot = true``; the paper uses a PRM);
3. "largely correct" gate: rectify only if ``k* >= 1`` and ``k* / K >= kappa`` (K = the rollout's
   number of steps; spec ``(k*-1)/K >= kappa`` with 1-based k*), ``kappa = 0.5``;
4. rectification: the rectified trajectory is the rollout's own tokens before step k* followed by a
   guide's suffix. The guide here is the **reference solution** (``task.target``, the warm start's
   reference, whose steps align with the policy's for the built-in traces): its steps k*, k*+1, ...
   (tokenised, then EOS). The spec's guide is a stronger model or the policy conditioned on a
   reference, sampling up to m = 2 continuations; ours is deterministic, so one try;
5. the rectified trajectory is verified; if it succeeds it **replaces** the failed rollout in its
   group (``mode = "replace"``, group size kept) or is added to it (``"append"``); otherwise the
   failure stays;
6. suffix tokens are off-policy: their behaviour log-prob is 0 (the guide emits them with
   probability 1), so the objective's ratio on them is ``pi_theta / 1`` (the spec's truncated
   ratio ``min(pi_theta / pi_g, 1)`` with ``pi_g = 1``); prefix tokens keep the sampler's
   log-probs and versions (on-policy). ``mask_prefix`` (optional, as R³L's pivot masking) takes the
   shared prefix out of the loss of the rectified rollout and, in ``"append"`` mode, of its source.

Properties (§4.4): rectified rollouts share exactly the prefix before k* with their source; k* is
the first erroneous step; no rectification for successes or k* = 0; ``"replace"`` keeps the group
size; suffix tokens carry the guide's log-probs, prefix tokens the sampler's; ``kappa = 1`` is plain
GRPO. Costs: guide suffixes are not generated tokens (not in ``cost/generated_tokens``); their
verifier calls are counted in ``control/scope_verifier_calls``, not in ``cost/verifier_calls``.
Metrics: ``control/scope_candidates``, ``control/scope_rectified``, ``control/scope_gated_out``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rollwise.control.r3l import _mask_prefix, pivot_offset, token_cut
from rollwise.control.uniform import Uniform
from rollwise.flaws import DETECTORS
from rollwise.registry import Compat, UserError
from rollwise.types import Group, Prompt, Rollout

_STEPS = re.compile(r"[^,;\n]*(?:[,;\n]|$)")


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    detector: str = Field(
        "rule",
        description="Step verifier naming the first erroneous step: a flaw detector name ('rule') or "
        "'package.module:attr' (prompt, completion) -> step index, -1, or None.",
    )
    kappa: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="Gate: rectify only if (correct steps before the error) / (steps) >= kappa "
        "(spec [RECON] 0.5; 1 = never, plain GRPO).",
    )
    mode: str = Field(
        "replace",
        pattern="^(replace|append)$",
        description="'replace' the failed rollout in its group (size kept) or 'append' the rectified one.",
    )
    mask_prefix: bool = Field(
        False,
        description="Take the shared prefix out of the loss of the rectified rollout (and of its "
        "source in 'append' mode) [RECON].",
    )
    success_at: float = Field(1.0, description="Rollouts with reward >= this are successes and are left alone.")

    @field_validator("detector")
    @classmethod
    def _known(cls, v: str) -> str:
        DETECTORS.resolve(v)
        return v


def steps_of(text: str) -> list[str]:
    """The text's steps, each with its trailing separator. Example: "a=1,b=2;=3" -> ["a=1,", "b=2;", "=3"]."""
    return [s for s in _STEPS.findall(text) if s]


class SCOPE(Uniform):
    Options = Options
    compat = Compat(batch_statistics=True, dynamic_sampling=False)  # finish_batch changes the kept groups

    def __init__(self, prompts: Sequence[Prompt], cfg, options: Options | None, seed: int):
        super().__init__(prompts, cfg, options, seed)
        self.opts = options or Options()
        self.detect = DETECTORS.get(self.opts.detector)
        self.task = self.codec = None
        self._verify_calls = 0
        self.metrics: dict[str, float] = {}

    def bind(self, services) -> None:
        task, codec = services.task, services.codec
        if not hasattr(task, "target"):
            raise UserError(
                f"control.name = 'scope' needs reference solutions (the guide): task {getattr(task, 'name', task)!r} "
                "has no target()"
            )
        self.task, self.codec = task, codec

    def rectify(self, prompt: Prompt, r: Rollout) -> tuple[Rollout | None, str, int]:
        """The rectified rollout of a failed ``r`` (or None), why ('no_error', 'gated', 'no_guide', 'failed',
        'rectified') and the number of prefix tokens it shares with ``r``."""
        k = self.detect(prompt, r.text)
        if k is None or k < 0:
            return None, "no_error", 0
        n_steps = len(steps_of(r.text))
        if k < 1 or k / max(n_steps, 1) < self.opts.kappa:
            return None, "gated", 0
        ref_steps = steps_of(self.task.target(prompt))
        offset = pivot_offset(r.text, k)
        if k >= len(ref_steps) or offset is None:
            return None, "no_guide", 0
        j = token_cut(r.completion_ids, self.codec.decode, offset, r.text)
        suffix = tuple(self.codec.encode_text("".join(ref_steps[k:]))) + (self.codec.tokenizer.eos_token_id,)
        ids = tuple(r.completion_ids[:j]) + suffix
        text = self.codec.decode(ids)
        verdict = self.task.verify(prompt, text)
        self._verify_calls += 1
        if verdict.score is None or verdict.score < self.opts.success_at:
            return None, "failed", j
        versions = tuple(r.token_versions or (r.policy_version,) * len(r.completion_ids))
        out = Rollout(
            r.prompt_id,
            r.prompt_ids,
            ids,
            tuple(r.logprobs[:j]) + (0.0,) * len(suffix),
            "stop",
            r.policy_version,
            text,
            verdict,
            token_versions=versions[:j] + (r.policy_version,) * len(suffix),
        )
        if self.opts.mask_prefix and j:
            out = _mask_prefix(out, j)
        return out, "rectified", j

    def finish_batch(self, groups: list[Group], kept: list[Group], dropped) -> list[Group]:
        if self.task is None:
            raise RuntimeError("SCOPE.bind(services) was not called (the assembler binds it)")
        counts = {"no_error": 0, "gated": 0, "no_guide": 0, "failed": 0, "rectified": 0}
        self._verify_calls = 0
        out = []
        for g in kept:
            rows, extra = list(g.rollouts), []
            for i, r in enumerate(g.rollouts):
                if r.reward is None or r.reward >= self.opts.success_at:
                    continue
                fixed, why, j = self.rectify(g.prompt, r)
                counts[why] += 1
                if fixed is None:
                    continue
                if self.opts.mode == "replace":
                    rows[i] = fixed
                else:
                    extra.append(fixed)
                    if self.opts.mask_prefix and j:
                        rows[i] = _mask_prefix(r, j)
            out.append(Group(g.prompt, tuple(rows + extra)))
        self.metrics = {
            "control/scope_candidates": float(sum(counts.values()) - counts["no_error"]),
            "control/scope_rectified": float(counts["rectified"]),
            "control/scope_gated_out": float(counts["gated"]),
            "control/scope_verifier_calls": float(self._verify_calls),
        }
        return out
