"""``PromptHistory``: per-prompt records shared by every controller (selection.md §0.3).

Keyed by the stable ``Prompt.id``. After every step the loop's ``observe`` call hands the
controller *all* generated groups (before filtering); ``record`` appends one
``Record(step, epoch, n, k, mean_reward, is_zv)`` per group. Controllers derive what they need
(trailing zero-variance streaks for GRESO, accepted/all counters for CurES, Beta posteriors for
VADE, last accuracy for DARS/DOTS) from these records instead of keeping their own copies.

``k`` is the number of rollouts with reward >= 0.5 (binary rewards); ``mean_reward`` the mean
verified reward; rollouts that could not be verified are left out of ``n``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from rollwise.types import Group


@dataclass(frozen=True)
class Record:
    step: int
    epoch: int
    n: int  # verified rollouts
    k: int  # of which correct (reward >= 0.5)
    mean_reward: float
    is_zv: bool


class PromptHistory:
    def __init__(self) -> None:
        self.records: dict[str, list[Record]] = {}

    def record(self, groups: list[Group], step: int, epoch: int = 0) -> None:
        for g in groups:
            scores = g.verified_rewards()
            if not scores:
                continue
            rec = Record(step, epoch, len(scores), sum(s >= 0.5 for s in scores), sum(scores) / len(scores), g.is_zero_variance())
            self.records.setdefault(g.prompt.id, []).append(rec)

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

    def dump(self) -> dict:
        """Per-prompt summary for inspection (``control/prompt_stats.json``)."""
        out = {}
        for pid, recs in self.records.items():
            n, k = self.totals(pid)
            out[pid] = {"visits": len(recs), "rollouts": n, "correct": k, "last_mean": recs[-1].mean_reward,
                        "zv_streak": self.zv_streak(pid)}
        return out
