"""``vade``: Beta posteriors per prompt, Thompson-sampling selection, two-scale prior decay.

Paper: "VADE: Variance-Aware Dynamic Sampling via Online Sample-Level Difficulty Estimation"
(multimodal RL), arXiv 2511.18902; project page VADE-RL.github.io, no code found;
docs/specs/allocation.md §5. Only the components are known from the abstract [PAPER-ABS]; the
equations below are **[RECON, unverified]**, following the closely related MoPPS
(arXiv 2507.04632), which documents the same Beta-posterior + Thompson design.

Selection is a non-stationary bandit over prompts, chosen *before* rollout and costing no extra
rollouts (every step generates exactly ``B * G`` rollouts, ``B = control.prompts_per_step``,
``G = control.rollouts_per_prompt``, within the step budget):

1. **Posterior.** Prompt i has ``Beta(a_i, b_i)`` over its success probability, starting at the
   prior ``(a0, b0)``.
2. **Select** (``select``): draw a candidate pool of ``M = pool_factor * B`` prompts from the
   seeded epoch-wise shuffled stream (as ``uniform``; duplicates at an epoch boundary count
   once), draw ``p~_i ~ Beta(a_i, b_i)`` for each and keep the top ``B`` by
   ``u_i = p~_i (1 - p~_i)`` (the Bernoulli variance, proportional to the expected squared GRPO
   advantage), highest first (so a binding budget trims the least informative last). The
   spec's alternative score ``-|p~ - 0.5|`` ranks identically (``u = 1/4 - (p~ - 1/2)^2``), so
   it is not an option.
3. **Update** after each step (``observe``, all generated groups) with decay on two scales:

   - fast, global, every step, all prompts: ``a <- lg * a + (1 - lg) * a0`` (same for b);
   - slow, per visit, for a prompt observed this step with ``k`` of ``n`` verified rollouts
     correct (reward >= 0.5): ``a <- ls * a + k``, ``b <- ls * b + (n - k)``, applied after the
     step's global shrink.

   The exact form of "two-scale" is unverified. The alternative reading (decay by the time since
   the last visit, ``lambda^dt``) is ``visit_decay = 1``: the global shrink applied for ``dt``
   steps is ``a0 + lg^dt (a - a0)``. Note that, as the spec writes it, the visit discount also
   scales the prior's share of ``a, b`` (towards 0, not towards the prior); the global shrink
   pulls it back towards the prior.

**Posteriors are derived, not stored.** They are a fold over the prompt's records in the shared
:class:`~rollwise.control.history.PromptHistory` (``k``, ``n`` and the step of every group), with
the global shrink of the ``dt`` steps between records applied in closed form (``a0 + lg^dt (a -
a0)``): exactly the per-step recursion above, and only the pool's candidates are computed. At
step ``t`` the posterior is the one after the ``observe`` of step ``t - 1``.

Worked example (``a0 = b0 = 1``, ``lg = 0.99``, ``ls = 0.7``): a prompt observed at step 0 with
3 of 4 correct has ``a = 0.7 * 1 + 3 = 3.7``, ``b = 0.7 * 1 + 1 = 1.7`` (the step-0 shrink leaves
the prior unchanged). At step 2 (one more shrink, of step 1): ``a = 1 + 0.99 * 2.7 = 3.673``,
``b = 1 + 0.99 * 0.7 = 1.693``.

Defaults [RECON, the paper's values were not recovered]: ``a0 = b0 = 1``, ``global_decay = 0.99``
per step, ``visit_decay = 0.7`` (the spec's range 0.5-0.9), ``pool_factor = 4``.

Differences from the paper: rewards need not be binary (``k`` counts rewards >= 0.5, the
history's convention); a group with no verified rollout leaves the posterior untouched; the
candidate pool comes from the shuffled stream (each prompt is a candidate once per epoch).

Logs nothing of its own. State (checkpointed): the stream (position, shuffle RNG), the Thompson
RNG and the per-prompt history (from which every posterior is recomputed).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from rollwise.control.history import Record
from rollwise.control.source import PromptSource, SourceController, restore_rng
from rollwise.types import Plan, Prompt, Request


class VADEOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    alpha0: float = Field(1.0, gt=0, description="Prior Beta alpha (a0) [RECON].")
    beta0: float = Field(1.0, gt=0, description="Prior Beta beta (b0) [RECON].")
    global_decay: float = Field(
        0.99,
        gt=0,
        le=1,
        description="Fast scale: every step every posterior shrinks towards the "
        "prior, a <- lg a + (1 - lg) a0 (1 = no decay) [RECON].",
    )
    visit_decay: float = Field(
        0.7,
        gt=0,
        le=1,
        description="Slow scale: a revisited prompt's a, b are multiplied by this "
        "before its new counts are added (1 = the 'time since last visit' reading) [RECON].",
    )
    pool_factor: int = Field(
        4,
        ge=1,
        description="Candidate pool M = pool_factor * control.prompts_per_step prompts per "
        "step, from which the top prompts_per_step by Thompson score are kept [RECON].",
    )


def posterior(records: Sequence[Record], now: int, opts: VADEOptions) -> tuple[float, float]:
    """``(a, b)`` at the selection of step ``now``: the fold of ``records`` (ascending steps, all
    before ``now``) with the global shrink of every step up to ``now - 1`` (module docstring)."""
    a0, b0, lg, ls = opts.alpha0, opts.beta0, opts.global_decay, opts.visit_decay
    a, b, last = a0, b0, None
    for rec in records:
        if rec.step >= now:
            break
        if last is not None:  # the shrinks of steps last+1 .. rec.step (the prior is their fixed point)
            d = lg ** (rec.step - last)
            a, b = a0 + d * (a - a0), b0 + d * (b - b0)
        a, b = ls * a + rec.k, ls * b + (rec.n - rec.k)
        last = rec.step
    if last is not None:
        d = lg ** (now - 1 - last)
        a, b = a0 + d * (a - a0), b0 + d * (b - b0)
    return a, b


class VADE(SourceController):
    """VADE (arXiv 2511.18902) [RECON]: Thompson-sampled top-B by p~(1 - p~) from a candidate pool."""

    Options = VADEOptions

    def __init__(self, prompts: Sequence[Prompt], cfg, options: VADEOptions | None, seed: int):
        self.cfg = cfg
        self.opts = options if options is not None else self.Options()
        self.n_prompts = len(prompts)
        self.source = PromptSource(prompts, seed, cfg, cfg.prompts_per_step * cfg.rollouts_per_prompt)
        self.rng = random.Random(f"vade-{seed}")  # Thompson draws; separate from the stream's shuffle
        self.last_scores: dict[str, float] = {}  # this step's selected prompts -> u (inspection only)

    @property
    def budget(self) -> int | None:
        return self.step_budget.rollouts

    def posterior(self, pid: str, now: int) -> tuple[float, float]:
        return posterior(self.history.of(pid), now, self.opts)

    def select(self, state) -> list[Prompt]:
        b = self.cfg.prompts_per_step
        pool, seen = [], set()
        for p in self.stream.take(min(self.opts.pool_factor * b, self.n_prompts)):
            if p.id not in seen:
                seen.add(p.id)
                pool.append(p)
        scored = []
        for i, p in enumerate(pool):
            a, bb = self.posterior(p.id, state.step)
            draw = self.rng.betavariate(a, bb)
            scored.append((-(draw * (1.0 - draw)), i, p))
        scored.sort(key=lambda t: (t[0], t[1]))
        chosen = scored[:b]
        self.last_scores = {p.id: -u for u, _, p in chosen}
        return [p for _, _, p in chosen]

    def plan(self, prompts: list[Prompt], state) -> Plan:
        return self.source.cap([Request(p, self.cfg.rollouts_per_prompt) for p in prompts])

    def state_dict(self) -> dict:
        return {**self.source.state_dict(), "rng": self.rng.getstate()}

    def load_state_dict(self, s: dict) -> None:
        self.source.load_state_dict(s)
        restore_rng(self.rng, s["rng"])
