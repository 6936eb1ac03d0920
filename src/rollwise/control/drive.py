"""``drive``: difficulty-aware prompt curation for code RL, after DRIVE.

Paper: "DRIVE: Data Curation Best Practices for Reinforcement Learning with Verifiable Reward in
Competitive Code Generation" (Tencent Hunyuan, 2025, arXiv 2511.06307). Its recipe has two RL
stages: stage 1 trains on a broad, uniformly drawn problem set with a moderate rollout count;
stage 2 is a "hard-focus curriculum" on a small set of the most difficult problems with a large
rollout budget, which keeps retaining the hardest instances as training goes on. Difficulty is
the empirical pass rate.

[RECON] There is no DRIVE section in the project's specs (``docs/specs/``); this module
reconstructs the recipe from the paper's abstract at the level of prompt selection only:

- Pass rate of a prompt = correct / verified rollouts over its last ``window`` visits, read from
  the shared :class:`~rollwise.control.history.PromptHistory` records; no copy of them here.
- Both stages skip a *solved* prompt: one with at least ``min_rollouts`` verified rollouts and a
  pass rate >= ``solved_rate`` (difficulty-aware filtering; skipped prompts are counted in
  ``control/drive_skipped``). If the whole pool is solved, the step takes solved prompts
  rather than none.
- Stage 1 (steps < ``stage2_step``): the seeded epoch-wise stream over all train prompts
  (:class:`~rollwise.control.source.PromptStream`), ``rollouts_per_prompt`` rollouts each.
- Stage 2 (from ``stage2_step``; None = never): the pool becomes the ``stage2_pool`` hardest train
  prompts (lowest pass rate; a prompt never seen counts as pass rate 0, i.e. hard), each drawn
  with ``stage2_rollouts`` rollouts. At the end of every stage-2 epoch the pool keeps its hardest
  ``retain`` share (at least ``min_pool`` prompts): the hard-focus curriculum.

What differs from the paper: no response-length schedule (the paper's 24k-token stage 1), no
entropy-oriented data selection, and the problem pools come from the task's train split, not a
separately curated competitive-programming corpus. Every stage's plan is capped by the per-step
budget (:mod:`rollwise.control.budget`; default ``prompts_per_step * max(rollouts_per_prompt,
stage2_rollouts)``).

Logs: ``control/drive_stage`` (1 or 2), ``control/drive_pool`` (prompts in the active pool),
``control/drive_skipped`` (solved prompts passed over this step).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from rollwise.control.source import PromptSource, PromptStream, SourceController
from rollwise.types import Plan, Prompt, Request


class DRIVEOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    solved_rate: float = Field(
        1.0,
        gt=0.0,
        le=1.0,
        description="a prompt with at least min_rollouts verified rollouts and "
        "this pass rate or more is skipped as solved",
    )
    min_rollouts: int = Field(
        8, ge=1, description="verified rollouts (in the window) before a prompt can count as solved"
    )
    window: int = Field(2, ge=1, description="pass rate over the prompt's last this-many visits")
    stage2_step: int | None = Field(
        None, ge=0, description="step at which the hard-focus stage begins (None = stage 1 only)"
    )
    stage2_pool: int = Field(64, ge=1, description="hardest train prompts kept when stage 2 begins")
    stage2_rollouts: int | None = Field(
        None, ge=1, description="rollouts per prompt in stage 2 (default 2 x rollouts_per_prompt)"
    )
    retain: float = Field(
        0.75, gt=0.0, le=1.0, description="share of the stage-2 pool kept (the hardest) after each stage-2 epoch"
    )
    min_pool: int = Field(8, ge=1, description="the stage-2 pool never shrinks below this many prompts")


class DRIVE(SourceController):
    Options = DRIVEOptions

    def __init__(self, prompts: Sequence[Prompt], cfg, options: DRIVEOptions | None, seed: int):
        self.cfg, self.seed = cfg, seed
        self.opts = options if options is not None else DRIVEOptions()
        self.prompts = list(prompts)
        self.n1 = cfg.rollouts_per_prompt
        self.n2 = self.opts.stage2_rollouts or 2 * cfg.rollouts_per_prompt
        self.stage = 1
        self.source = PromptSource(self.prompts, seed, cfg, cfg.prompts_per_step * max(self.n1, self.n2))
        self.metrics: dict[str, float] = {}

    @property
    def budget(self) -> int | None:
        return self.step_budget.rollouts

    # -------------------------------------------------------------- difficulty
    def counts(self, prompt_id: str) -> tuple[int, int]:
        """(verified, correct) rollouts over the prompt's last ``window`` visits."""
        recs = self.history.of(prompt_id)[-self.opts.window :]
        return sum(r.n for r in recs), sum(r.k for r in recs)

    def pass_rate(self, prompt_id: str) -> float | None:
        """Correct / verified rollouts over the window; None before any."""
        n, k = self.counts(prompt_id)
        return k / n if n else None

    def solved(self, prompt_id: str) -> bool:
        n, k = self.counts(prompt_id)
        return n >= self.opts.min_rollouts and k / n >= self.opts.solved_rate

    def hardest(self, prompts: Sequence[Prompt], m: int) -> list[Prompt]:
        """The ``m`` prompts of lowest pass rate (unseen = 0; ties keep the given order)."""
        order = sorted(range(len(prompts)), key=lambda i: (self.pass_rate(prompts[i].id) or 0.0, i))
        return [prompts[i] for i in order[:m]]

    # -------------------------------------------------------------- stages
    def _enter_stage2(self) -> None:
        self.stage = 2
        pool = self.hardest(self.prompts, min(self.opts.stage2_pool, len(self.prompts)))
        self.stream = PromptStream(pool, self.seed + 1)

    def _shrink(self) -> None:
        """End of a stage-2 epoch: keep the hardest ``retain`` share of the pool."""
        pool = self.stream.prompts
        keep = max(min(self.opts.min_pool, len(pool)), round(len(pool) * self.opts.retain))
        self.stream = PromptStream(self.hardest(pool, keep), self.seed + 1 + self.stream.epoch)

    def select(self, state) -> list[Prompt]:
        if self.stage == 1 and self.opts.stage2_step is not None and state.step >= self.opts.stage2_step:
            self._enter_stage2()
        want, pool = self.cfg.prompts_per_step, len(self.stream.prompts)
        out, skipped = [], []
        for _ in range(max(want, pool) + want):  # at most one pass over the pool beyond what is wanted
            if len(out) == want:
                break
            if self.stage == 2 and self.stream.index >= len(self.stream.order):  # a stage-2 epoch ended
                self._shrink()
            p = self.stream.take(1)[0]
            (skipped if self.solved(p.id) else out).append(p)
        out += skipped[: want - len(out)]  # a solved pool still yields a batch
        self.metrics = {
            "control/drive_stage": float(self.stage),
            "control/drive_pool": float(len(self.stream.prompts)),
            "control/drive_skipped": float(len(skipped)),
        }
        return out

    def plan(self, prompts: list[Prompt], state) -> Plan:
        n = self.n2 if self.stage == 2 else self.n1
        return self.source.cap([Request(p, n) for p in prompts])

    def state_dict(self) -> dict:
        return {"stage": self.stage, "pool": [p.id for p in self.stream.prompts], **self.source.state_dict()}

    def load_state_dict(self, s: dict) -> None:
        self.stage = s["stage"]
        by_id = {p.id: p for p in self.prompts}
        self.stream = PromptStream([by_id[i] for i in s["pool"]], self.seed)  # the pool of the checkpoint's stage
        self.source.load_state_dict(s)
