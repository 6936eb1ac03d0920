"""Turn budgets for multi-turn episodes: a cap on turns read from the observed turn distribution,
extended while an episode still moves (issue #44 item 6; ``task.turn_budget``).

Paper: "More with Less: An Empirical Study of Turn-Control Strategies for Efficient Coding Agents",
arXiv 2510.16786. Its findings, on SWE-bench agents: a fixed turn limit at the 75th percentile of
the turns an unrestricted agent takes cuts cost by 24-68% with little loss of solve rate, and a
dynamic limit that grants extensions only to the episodes that need them cuts a further 12-24%.
Rollwise applies that to the episodes it generates for training (the episode pool,
``rollwise.generate.episodes``; evaluation always runs to ``task.max_turns``):

1. **Warm-up.** The first ``warmup_episodes`` training episodes run to ``task.max_turns``. Every
   training episode's turns are recorded (the last ``window`` episodes), an episode the budget ended
   as *censored*: it would have taken more turns than it did.
2. **Cap.** Each later pool call caps its episodes at the ``quantile`` of the turn distribution, at
   least 1 and at most ``task.max_turns``; the cap is fixed for the whole call, so a ``lockstep`` run
   stays reproducible for a seed. The distribution is the Kaplan-Meier estimate over the recorded
   episodes (Kaplan & Meier 1958), so capped episodes count as "longer than t", never as "ended at
   t": reading only the episodes that ended under the cap, or counting capped ones as ended, would
   see ever shorter episodes and lower the cap step after step (measured: a median cap fell from 6
   to 3 turns within three steps, docs/results.md). Without censoring the quantile is the nearest
   rank, the ``ceil(q n)``-th smallest; when the estimate never reaches ``q`` (too many episodes
   censored below it) the cap is ``task.max_turns``.
3. **Extension.** An episode that reaches its cap without ending gets ``extension`` more turns, up to
   ``max_extensions`` times and never past ``task.max_turns``, while it still *moves*
   (:func:`moving`); otherwise it ends ``"turn_cap"`` (``Episode.end``).
4. **Ledger** (``metrics.jsonl``, through the step's ``StepCost.metrics``): ``turn_budget/cap``, the
   cap of the step's last call (``task.max_turns`` during warm-up); ``turn_budget/capped``,
   episodes ended ``"turn_cap"``; ``turn_budget/extensions``, extensions granted;
   ``turn_budget/saved_turns_est``, ``turn_budget/saved_tokens_est`` and ``turn_budget/saved_s_est``:
   an estimate of what the capped episodes would have spent (:meth:`TurnBudget.expected_more`).

**Reconstructions** [RECON] (the paper's agent asks for an extension itself and its limits are set
from a baseline run; a training run has no baseline run and its policy asks for nothing):

- the distribution is the run's own, observed online after a warm-up at ``task.max_turns``, with
  capped episodes as censored observations (2.);
- "needs an extension" is :func:`moving`: the episode's last turn ran tool calls that all returned
  ``"ok"``, or its last two turns acted in different states (``Turn.anchor``): an episode repeating
  itself in one state, or whose tools fail, is not extended;
- the savings are estimates: a capped episode at ``t`` turns would have taken
  ``E[T - t | T > t] = sum_{u >= t} S(u) / S(t)`` more turns, ``S(u) = P(T > u)`` the estimated
  distribution's survival, ``S(task.max_turns) = 0`` (0 when ``S(t) = 0``), each
  costing the call's mean policy tokens per turn and its per-turn share of the generation and
  environment-waiting seconds.

The recorded turns are the pool's own: they are not saved in checkpoints (a resumed run warms up
again), and with Ray workers each worker's pool records and caps its own episodes (the step's
``turn_budget/*`` fields then add up over the workers, ``turn_budget/cap`` included).
"""

from __future__ import annotations

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
        self.seen: deque[tuple[int, bool]] = deque(maxlen=opts.window)  # (turns, censored)

    def survival(self) -> list[float]:
        """``S(u) = P(T > u)`` for u = 0..``task.max_turns`` (Kaplan-Meier over the recorded episodes;
        ``S(task.max_turns) = 0``: no episode runs longer).

        Example: ended (1, 2, 2, 3, 5, 6), capped at 3 twice: u = 1: 7/8 (8 at risk, 1 ended);
        u = 2: 7/8 * 5/7 = 5/8; u = 3: 5/8 * 4/5 = 1/2 (the capped pair is at risk at 3, not ended);
        u = 5: 1/2 * 1/2 = 1/4; u = 6: 0."""
        s, out = 1.0, [1.0]
        for u in range(1, self.max_turns + 1):
            at_risk = sum(n >= u for n, _ in self.seen)
            ended = sum(n == u and not c for n, c in self.seen)
            if at_risk:
                s *= 1.0 - ended / at_risk
            out.append(s)
        out[self.max_turns] = 0.0
        return out

    def cap(self) -> int:
        """The cap of the next call: ``task.max_turns`` until ``warmup_episodes`` were recorded, then
        the smallest u with ``1 - S(u) >= quantile`` (within 1..``task.max_turns``).

        Example: ended (1, 2, 2, 3, 5, 8), quantile 0.75, max_turns 8 -> S(3) = 1/3, S(5) = 1/6:
        cap 5, the ceil(4.5) = 5th smallest."""
        if len(self.seen) < self.opts.warmup_episodes:
            return self.max_turns
        s = self.survival()
        return next(
            (u for u in range(1, self.max_turns + 1) if 1.0 - s[u] >= self.opts.quantile - 1e-12), self.max_turns
        )

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
        """Record the call's episodes; those the budget ended are censored."""
        self.seen.extend((min(n, self.max_turns), end == CAPPED) for n, end in turns_and_ends)

    def expected_more(self, t: int) -> float:
        """``E[T - t | T > t]`` under the estimated distribution (module docstring), 0.0 when no
        episode is expected to last longer than ``t``.

        Example: ended (1, 2, 4, 6), max_turns 6, t = 3 -> S(3), S(4), S(5), S(6) = 1/2, 1/4, 1/4, 0:
        (1/2 + 1/4 + 1/4) / (1/2) = 2.0."""
        s = self.survival()
        if t >= self.max_turns or s[t] <= 0.0:
            return 0.0
        return sum(s[u] for u in range(t, self.max_turns)) / s[t]
