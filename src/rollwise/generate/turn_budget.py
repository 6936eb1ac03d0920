"""Turn budgets for multi-turn episodes: a cap on turns read from the observed turn distribution,
extended while an episode still moves (issue #44 item 6; ``task.turn_budget``).

Paper: "More with Less: An Empirical Study of Turn-Control Strategies for Efficient Coding Agents",
arXiv 2510.16786. Its findings, on SWE-bench agents: a fixed turn limit at the 75th percentile of
the turns an unrestricted agent takes cuts cost by 24-68% with little loss of solve rate, and a
dynamic limit that grants extensions only to the episodes that need them cuts a further 12-24%.
Rollwise applies that to the episodes it generates for training (the episode pool,
``rollwise.generate.episodes``; evaluation always runs to ``task.max_turns``):

1. **Warm-up.** The first ``warmup_episodes`` training episodes run to ``task.max_turns``; the turns
   of every episode that the budget did not end are recorded (the last ``window`` of them).
2. **Cap.** Each later pool call caps its episodes at the ``quantile`` (nearest rank: the
   ``ceil(q n)``-th smallest) of the recorded turns, at least 1 and at most ``task.max_turns``. The
   cap is fixed for the whole call, so a ``lockstep`` run stays reproducible for a seed.
3. **Extension.** An episode that reaches its cap without ending gets ``extension`` more turns, up to
   ``max_extensions`` times and never past ``task.max_turns``, while it still *moves*
   (:func:`moving`); otherwise it ends ``"turn_cap"`` (``Episode.end``). An extended episode that ends
   on its own is recorded with its full turns, so the cap can grow again.
4. **Ledger** (``metrics.jsonl``, through the step's ``StepCost.metrics``): ``turn_budget/cap``, the
   cap of the step's last call (``task.max_turns`` during warm-up); ``turn_budget/capped``,
   episodes ended ``"turn_cap"``; ``turn_budget/extensions``, extensions granted;
   ``turn_budget/saved_turns_est``, ``turn_budget/saved_tokens_est`` and ``turn_budget/saved_s_est``:
   an estimate of what the capped episodes would have spent (:meth:`TurnBudget.expected_more`).

**Reconstructions** [RECON] (the paper's agent asks for an extension itself and its limits are set
from a baseline run; a training run has no baseline run and its policy asks for nothing):

- the distribution is the run's own, observed online after a warm-up at ``task.max_turns``, from the
  episodes the budget did not end (counting capped ones would only ever lower the cap);
- "needs an extension" is :func:`moving`: the episode's last turn ran tool calls that all returned
  ``"ok"``, or its last two turns acted in different states (``Turn.anchor``): an episode repeating
  itself in one state, or whose tools fail, is not extended;
- the savings are estimates: a capped episode at ``t`` turns would have taken
  ``E[T - t | T > t]`` more turns under the recorded distribution (0 when none was longer), each
  costing the call's mean policy tokens per turn and its per-turn share of the generation and
  environment-waiting seconds.

The recorded turns are the pool's own: they are not saved in checkpoints (a resumed run warms up
again), and with Ray workers each worker's pool records and caps its own episodes (the step's
``turn_budget/*`` fields then add up over the workers, ``turn_budget/cap`` included).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

from rollwise.sections.task import TurnBudgetConfig
from rollwise.types import Turn

CAPPED = "turn_cap"  # Episode.end of an episode the budget ended


def moving(turns: Sequence[Turn]) -> bool:
    """Whether an episode at its cap still moves (module docstring, 3.): its last turn's tool calls
    all ran ("ok", at least one), or its last two turns acted in different known states.

    Example: anchors ("1-16", "9-16") -> True; ("9-16", "9-16") -> False (the last guess told it
    nothing new); one turn without tool calls -> False."""
    if not turns:
        return False
    calls = turns[-1].tool_calls
    if calls and all(c.outcome == "ok" for c in calls):
        return True
    if len(turns) < 2:
        return False
    a, b = turns[-2].anchor, turns[-1].anchor
    return a is not None and b is not None and a != b


class TurnBudget:
    """The recorded turns and the cap they give (module docstring)."""

    def __init__(self, opts: TurnBudgetConfig, max_turns: int):
        self.opts, self.max_turns = opts, max_turns
        self.seen: deque[int] = deque(maxlen=opts.window)

    def cap(self) -> int:
        """The cap of the next call: ``task.max_turns`` until ``warmup_episodes`` were recorded, then
        the nearest-rank ``quantile`` of the recorded turns (within 1..``task.max_turns``).

        Example: recorded (1, 2, 2, 3, 5, 8), quantile 0.75 -> ceil(4.5) = 5th smallest = 5."""
        n = len(self.seen)
        if n < self.opts.warmup_episodes:
            return self.max_turns
        rank = max(1, math.ceil(self.opts.quantile * n))
        return max(1, min(self.max_turns, sorted(self.seen)[rank - 1]))

    def limit(self, turns: Sequence[Turn], limit: int, extensions: int) -> tuple[int, int]:
        """``(limit, extensions)`` of an episode that has taken ``len(turns)`` turns under ``limit``:
        raised by ``extension`` (at most ``task.max_turns``) when it reached it, may still be
        extended and :func:`moving`; unchanged otherwise."""
        if len(turns) < limit or limit >= self.max_turns or extensions >= self.opts.max_extensions:
            return limit, extensions
        if not moving(turns):
            return limit, extensions
        return min(self.max_turns, limit + self.opts.extension), extensions + 1

    def record(self, turns_and_ends: Sequence[tuple[int, str]]) -> None:
        """Record the turns of the call's episodes that the budget did not end."""
        self.seen.extend(n for n, end in turns_and_ends if end != CAPPED)

    def expected_more(self, t: int) -> float:
        """``E[T - t | T > t]`` under the recorded turns, 0.0 when none is longer than ``t``.

        Example: recorded (1, 2, 4, 6), t = 3 -> ((4 - 3) + (6 - 3)) / 2 = 2.0."""
        longer = [n - t for n in self.seen if n > t]
        return sum(longer) / len(longer) if longer else 0.0
