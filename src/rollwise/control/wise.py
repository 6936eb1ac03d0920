"""``wise``: rollwise's own composed controller (issue #18) — skip prompts whose history predicts a
degenerate group, screen the rest with a few rollouts, complete only the mixed ones.

Not a paper: a composition of two anchors already in rollwise, chosen on the first realistic
regime (``benchmarks/regime_cot.toml``) and run unchanged on the second:

1. **Skip from history** (GRESO, arXiv 2506.02177; :mod:`rollwise.control.greso`). Before any
   rollout, a prompt whose last ``z`` visits were all correct (or all wrong) is skipped with
   probability ``1 - max(p^z, keep_floor)`` (:func:`~rollwise.control.greso.skip_probability`,
   streaks from :func:`~rollwise.control.greso.streaks` over the shared
   :class:`~rollwise.control.history.PromptHistory`). Where the pool recurs, solved prompts stop
   costing anything; the floor keeps a chance that they come back.
2. **Screen, then continue** (SPEED-RL, arXiv 2506.09016; :mod:`rollwise.control.speed`, whose
   rounds, budget and filter this class inherits). A surviving prompt gets ``n_init`` rollouts;
   only a mixed screen is continued to the baseline's group size. What the skip cannot predict
   (a first visit, a prompt that changed) costs ``n_init`` rollouts instead of a whole group.

Why these two: in a regime where many groups are degenerate and the degenerate ones persist from
visit to visit (regime.md §1.5: P(still ZV | ZV earlier) 0.77-0.80), the skip removes the known
ones for free and screening removes most of the rest for ``n_init / G`` of their cost; both
keep every trained group the baseline's size with a non-zero advantage, so the objective and
the advantage estimator are untouched. Screening rollouts are part of the trained group (as in
SPEED), so nothing generated is thrown away except rejected screens.

What it does not compose, and why [ours]: top-ups for hard prompts (DARS) spend more rollouts
per prompt, which at an equal token budget competes with breadth; partial rollouts (APRIL) only
pay where lengths have a long tail and rollout is batched across many workers; neither was
chosen on regime 1 (the closing note of issue #18 gives the figures).

No new math: the skip rule, the streaks and SPEED's rounds are the anchors' own functions. The
difference from both papers is the composition itself, and that the skip probabilities are
fixed (``p_easy``, ``p_hard``) rather than tuned online towards a target ZV share: with
screening, ZV groups that slip through cost ``n_init`` rollouts, not ``G``, so GRESO's tuning
target has no clear meaning here.

Use it with ``filter.names = ["speed_complete"]`` (``configs/wise.toml``). Logs SPEED's
``control/speed_*`` counters plus ``control/wise_skipped_easy``, ``control/wise_skipped_hard``
and ``control/wise_skip_frac`` (skipped / candidates looked at).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from pydantic import Field

from rollwise.control.greso import skip_probability, streaks
from rollwise.control.source import restore_rng
from rollwise.control.speed import SPEED, SPEEDOptions
from rollwise.types import Prompt


class WiseOptions(SPEEDOptions):
    p_easy: float = Field(
        0.5,
        gt=0,
        le=1,
        description="A prompt whose last z visits were all correct is kept with "
        "probability max(p_easy^z, keep_floor) (GRESO's base probability, fixed here).",
    )
    p_hard: float = Field(0.5, gt=0, le=1, description="The same for all-wrong streaks.")
    keep_floor: float = Field(
        0.05, ge=0, le=1, description="Smallest keep probability of any prompt (exploration floor)."
    )
    easy_threshold: float = Field(
        1.0, description="A visit is 'easy' when its mean reward is >= this (binary rewards: 1)."
    )
    hard_threshold: float = Field(
        0.0, description="A visit is 'hard' when its mean reward is <= this (binary rewards: 0)."
    )


class Wise(SPEED):
    """GRESO's pre-rollout skip in front of SPEED's screen-and-continue rounds (see the module)."""

    Options = WiseOptions

    def __init__(self, prompts: Sequence[Prompt], cfg, options: WiseOptions | None, seed: int):
        super().__init__(
            prompts, cfg, options if options is not None else WiseOptions(), seed
        )  # its _new_step sets _skips
        self.rng = random.Random(f"wise-{seed}")  # skip decisions; separate from the stream's shuffle

    def _new_step(self) -> None:
        super()._new_step()
        self._skips = {"candidates": 0, "easy": 0, "hard": 0}

    def skip(self, prompt_id: str) -> str | None:
        """ "easy" / "hard" when the prompt is skipped this time, None when it is screened."""
        o = self.opts
        z_easy, z_hard = streaks(
            [r.mean_reward for r in self.history.of(prompt_id)], o.easy_threshold, o.hard_threshold
        )
        for kind, p, z in (("easy", o.p_easy, z_easy), ("hard", o.p_hard, z_hard)):
            prob = skip_probability(p, z, o.keep_floor)
            if prob > 0 and self.rng.random() < prob:  # z = 0 draws nothing: never skipped
                return kind
        return None

    def admit(self, prompt: Prompt) -> bool:
        """A stream prompt passes the skip (queued surplus prompts, mixed last time, never meet it)."""
        self._skips["candidates"] += 1
        kind = self.skip(prompt.id)
        if kind is not None:
            self._skips[kind] += 1
        return kind is None

    def observe(self, groups, state) -> None:
        super().observe(groups, state)
        s = self._skips
        self.metrics.update(
            {
                "control/wise_skipped_easy": float(s["easy"]),
                "control/wise_skipped_hard": float(s["hard"]),
                "control/wise_skip_frac": (s["easy"] + s["hard"]) / max(1, s["candidates"]),
            }
        )

    def state_dict(self) -> dict:
        return {**super().state_dict(), "rng": self.rng.getstate()}

    def load_state_dict(self, s: dict) -> None:
        super().load_state_dict(s)
        restore_rng(self.rng, s["rng"])
