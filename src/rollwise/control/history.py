"""``PromptHistory``: per-prompt records shared by every controller (selection.md §0.3).

Keyed by the stable ``Prompt.id``. After every step the loop's ``observe`` call hands the
controller *all* generated groups (before filtering); ``record`` appends one
``Record(step, epoch, n, k, mean_reward, is_zv)`` per group. Controllers derive what they need
(trailing zero-variance streaks for GRESO, accepted/all counters for CurES, Beta posteriors for
VADE, last accuracy for DARS/DOTS) from these records instead of keeping their own copies.

``k`` is the number of rollouts with reward >= 0.5 (binary rewards); ``mean_reward`` the mean
verified reward; rollouts that could not be verified are left out of ``n``. ``rollouts`` and
``tokens`` count *every* rollout of the group and its completion tokens (the per-step budget's
length estimate, :mod:`rollwise.control.budget`, reads them through ``recent_lengths``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from rollwise.types import CORRECT, Group


@dataclass(frozen=True)
class Record:
    step: int
    epoch: int
    n: int  # verified rollouts
    k: int  # of which correct (reward >= 0.5)
    mean_reward: float
    is_zv: bool
    rollouts: int = 0  # all rollouts of the group (verified or not)
    tokens: int = 0  # their completion tokens


class PromptHistory:
    def __init__(self) -> None:
        self.records: dict[str, list[Record]] = {}
        self._lengths: dict[int, list[int]] = {}  # step -> [rollouts, tokens], derived from records

    def record(self, groups: list[Group], step: int, epoch: int = 0) -> None:
        for g in groups:
            scores = g.verified_rewards()
            if not scores:
                continue
            rec = Record(
                step,
                epoch,
                len(scores),
                sum(s >= CORRECT for s in scores),
                sum(scores) / len(scores),
                g.is_zero_variance(),
                g.size,
                sum(len(r.completion_ids) for r in g.rollouts),
            )
            self.records.setdefault(g.prompt.id, []).append(rec)
            self._count_lengths(rec)

    def _count_lengths(self, rec: Record) -> None:
        tally = self._lengths.setdefault(rec.step, [0, 0])
        tally[0] += rec.rollouts
        tally[1] += rec.tokens

    def recent_lengths(self, steps: int) -> tuple[int, int]:
        """(rollouts, completion tokens) recorded in the last ``steps`` distinct steps."""
        recent = sorted(self._lengths)[-steps:] if steps > 0 else []
        return sum(self._lengths[s][0] for s in recent), sum(self._lengths[s][1] for s in recent)

    def of(self, prompt_id: str) -> list[Record]:
        return self.records.get(prompt_id, [])

    def last(self, prompt_id: str) -> Record | None:
        recs = self.records.get(prompt_id)
        return recs[-1] if recs else None

    def totals(self, prompt_id: str) -> tuple[int, int]:
        """(all rollouts, correct rollouts) over the prompt's whole history."""
        recs = self.of(prompt_id)
        return sum(r.n for r in recs), sum(r.k for r in recs)

    def zv_streak(self, prompt_id: str) -> int:
        """Number of most recent consecutive records that were zero-variance."""
        n = 0
        for r in reversed(self.of(prompt_id)):
            if not r.is_zv:
                break
            n += 1
        return n

    def state_dict(self) -> dict:
        return {pid: [asdict(r) for r in recs] for pid, recs in self.records.items()}

    def load_state_dict(self, s: dict) -> None:
        self.records = {pid: [Record(**r) for r in recs] for pid, recs in s.items()}
        self._lengths = {}
        for recs in self.records.values():
            for rec in recs:
                self._count_lengths(rec)

    def dump(self) -> dict:
        """Per-prompt summary for inspection (``control/prompt_stats.json``)."""
        out = {}
        for pid, recs in self.records.items():
            n, k = self.totals(pid)
            out[pid] = {
                "visits": len(recs),
                "rollouts": n,
                "correct": k,
                "last_mean": recs[-1].mean_reward,
                "zv_streak": self.zv_streak(pid),
            }
        return out
