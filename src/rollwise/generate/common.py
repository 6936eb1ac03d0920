"""What every generator shares, below the pools that drive them (issue #41): the cost of a step's
generation (``StepCost``, what the loop hands to the ledger; ``outcome_counts``, its per-outcome
verifier counters) and ``merge_groups``, the one way new rollouts join their prompt's group (a
request for a prompt that already has a group tops it up, e.g. DARS's second stage).

The local pool, the Ray workers, the asynchronous generator, the data-parallel pool and the rollout
wrappers (ARRoL, APRIL, SPEC-RL, episodes) all charge a ``StepCost`` and merge through
``merge_groups``; here, in the generation stage, the wrappers need not import a pool to do so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from rollwise.types import Group, Verdict


@dataclass
class StepCost:
    generated_tokens: int = 0
    rollouts: int = 0
    verifier_calls: int = 0
    unverified: int = 0
    generate_s: float = 0.0
    verify_s: float = 0.0
    reused_tokens: int = 0  # completion tokens taken from earlier rollouts, not generated (SPEC-RL)
    verify_tokens: int = 0  # tokens scored by a verification forward pass (SPEC-RL)
    # Multi-turn episodes (rollwise.generate.episodes; 0 for single-turn rollouts): ``generated_tokens``
    # stays the policy tokens decoded; observation tokens are appended, never decoded.
    episodes: int = 0
    turns: int = 0
    tool_calls: int = 0
    tool_s: float = 0.0  # seconds of the tool calls (summed over episodes; they run concurrently)
    observation_tokens: int = 0
    env_s: float = 0.0  # seconds of environment steps (summed over episodes)
    waiting_s: float = 0.0  # wall seconds generation waited for environment steps
    metrics: dict = field(default_factory=dict)  # per-step metrics of a rollout strategy (april/*, spec_rl/*)

    def charge(
        self,
        generated_tokens: int,
        rollouts: int,
        verdicts: Sequence[Verdict | None],
        generate_s: float,
        verify_s: float,
    ) -> None:
        """Add one generation call: tokens decoded (pruned and unfinished ones included), rollouts
        started or finished as the caller counts them, one verifier call per verdict (``None`` or
        a ``None`` score is "could not verify") and the seconds spent."""
        self.generated_tokens += generated_tokens
        self.rollouts += rollouts
        self.verifier_calls += len(verdicts)
        self.unverified += sum(v is None or v.score is None for v in verdicts)
        self.generate_s += generate_s
        self.verify_s += verify_s
        self.count(**outcome_counts(verdicts))

    def add(self, other: StepCost, seconds: bool = True) -> None:
        """Add ``other`` (a worker's, a rank's or a plan's cost) to this one, its metrics counted.
        ``seconds = False`` leaves ``generate_s`` to the caller: parallel workers' generation
        overlaps, so the caller charges the wall-clock of the parallel call instead."""
        for f in dataclasses.fields(self):
            if f.name != "metrics" and (seconds or f.name != "generate_s"):
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        self.count(**other.metrics)

    def count(self, **values: float) -> None:
        """Accumulate strategy counters in ``metrics`` (``count(**{"april/resumed": 3})``)."""
        for key, v in values.items():
            self.metrics[key] = self.metrics.get(key, 0) + v


def outcome_counts(verdicts: Sequence[Verdict | None]) -> dict[str, int]:
    """Per-outcome verifier counters of one call: ``verify/<reason>`` per verdict (``verify/none``
    for a missing verdict), ``verify/isolation_<name>`` for sandboxed checks (code verifier) and
    ``verify/cached`` for verdicts served from a verifier's cache."""
    out: dict[str, int] = {}
    for v in verdicts:
        keys = [f"verify/{v.reason or 'unknown'}"] if v is not None else ["verify/none"]
        if v is not None and v.details.get("isolation"):
            keys.append(f"verify/isolation_{v.details['isolation']}")
        if v is not None and v.details.get("cached"):
            keys.append("verify/cached")
        for k in keys:
            out[k] = out.get(k, 0) + 1
    return out


def merge_groups(groups: list[Group], pairs) -> list[Group]:
    """Append ``(prompt, rollout)`` pairs to the groups of their prompt ids (new groups at the end)."""
    merged: dict[str, Group] = {g.prompt.id: g for g in groups}
    for prompt, rollout in pairs:
        g = merged.get(prompt.id) or Group(prompt, ())
        merged[prompt.id] = Group(g.prompt, g.rollouts + (rollout,))
    return list(merged.values())
