"""``brorl``: very many rollouts per prompt (broadened exploration).

Paper: "BroRL: Scaling Reinforcement Learning via Broadened Exploration", arXiv 2510.01180
(NVIDIA; no code released), docs/specs/allocation.md §6. BroRL is a *setting*, not a new estimator:
the rollouts per prompt N go from 16 (ProRL) to 512, uniformly (no per-prompt adaptivity); the
advantage and loss are unchanged. Its argument: as N grows, the "unsampled coupling" term of the
one-step mass balance shrinks, so probability mass on correct tokens grows reliably, and the
share of groups that dynamic sampling discards (``1 - P(mixed) = p^N + (1-p)^N``) falls.

What this controller does: each step draws prompts from the seeded stream and gives each
``n`` rollouts (default 512) in one round, within the per-step budget
(:class:`~rollwise.control.budget.StepBudget`; the last prompt loses rollouts first).

- ``keep_samples_per_step = true`` (default): the number of prompts is
  ``max(1, floor(B / n))`` where ``B`` is the step's rollout allowance
  (``control.budget_rollouts``, default ``prompts_per_step * rollouts_per_prompt``, i.e. the
  samples per step of ``uniform``, and ``control.budget_tokens`` if set), so BroRL and uniform
  compare at equal samples per step. When ``B < n`` the single prompt gets ``B`` rollouts.
- ``keep_samples_per_step = false``: ``control.prompts_per_step`` prompts of ``n`` rollouts each
  (the rollout budget then defaults to ``prompts_per_step * n``).

Whether the paper reduced the prompt batch to hold samples per step constant is **unverified**
(docs/specs/allocation.md §6.1); both are offered, and the ledger records samples
(``cost/rollouts``) and wall time per step either way. Not reproduced: the ProRL recipe around it
(starting from a saturated ProRL checkpoint, KL with periodic reference resets); combine with
``objective = "dapo"`` and ``control.dynamic_sampling`` for the DAPO parts.

**Memory.** Peak memory does not grow with ``n``: the worker pool sends the backend at most
``model.max_batch`` sequences per call (``distributed/local.py``; the HF backend also decodes in
chunks of ``max_batch`` rows with its own KV cache per chunk), and the trainer runs forward and
backward passes of at most ``train.micro_batch`` rows, accumulating gradients exactly
(``trainer/trainer.py``; reference log-probs for a KL term are micro-batched too). What does grow
with the step's rollouts is host memory for their token ids and the padded CPU batch
(``batch.collate.collate``), a few integers per token.

State (checkpointed): the prompt stream and the per-prompt history.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from rollwise.control.source import PromptSource, SourceController
from rollwise.types import Plan, Prompt, Request


class BroRLOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int = Field(512, ge=1, description="Rollouts per prompt (the paper raises N from 16 to 512).")
    keep_samples_per_step: bool = Field(
        True,
        description="Draw max(1, budget // n) prompts so the rollouts per step equal "
        "the step budget (default prompts_per_step * rollouts_per_prompt); false: "
        "prompts_per_step prompts of n rollouts each.",
    )


class BroRL(SourceController):
    """BroRL (arXiv 2510.01180): a uniform, very large number of rollouts per prompt."""

    Options = BroRLOptions

    def __init__(self, prompts: Sequence[Prompt], cfg, options: BroRLOptions | None, seed: int):
        self.cfg = cfg
        self.opts = options if options is not None else self.Options()
        self.n = self.opts.n
        per_step = cfg.rollouts_per_prompt if self.opts.keep_samples_per_step else self.n
        self.source = PromptSource(prompts, seed, cfg, cfg.prompts_per_step * per_step)

    @property
    def budget(self) -> int:
        return self.step_budget.rollouts

    def prompts_per_step(self) -> int:
        if not self.opts.keep_samples_per_step:
            return self.cfg.prompts_per_step
        return max(1, (self.source.remaining() or 0) // self.n)

    def select(self, state) -> list[Prompt]:
        return self.stream.take(self.prompts_per_step())

    def plan(self, prompts: list[Prompt], state) -> Plan:
        return self.source.cap([Request(p, self.n) for p in prompts])
