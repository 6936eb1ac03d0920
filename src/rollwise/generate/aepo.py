"""``sampling.branching.mode = "aepo"``: AEPO's entropy-balanced rollout on episode trees (issue #44).

Paper: Dong et al., "Agentic Entropy-Balanced Policy Optimization", arXiv 2510.14545 (code:
RUC-NLPIR/ARPO); the working specification is the AEPO entry of the project's agentic
specifications (issue #44). Its rollout half, on the branching primitive of
``rollwise.generate.branching`` (its update half is the objective ``aepo``, ``objectives/aepo.py``):

1. **Entropy pre-monitoring** splits a group's ``n`` episodes between fresh starts and branches:
   ``m = n * sigmoid(beta * (H_root - H_tool))`` fresh (rounded, 1..n), the other ``n - m`` forked at
   tool-call turns. ``H_root`` is the mean sampler entropy of the episodes' first turns, ``H_tool`` that
   of the turns that follow a tool call: when tool feedback leaves the policy more uncertain than the
   question does, more of the budget goes to branching after tool calls, and the other way round.
2. **Branching at tool calls** with a **penalty on consecutive high-entropy branching**: the episodes
   that called a tool and go on are ranked by the mean entropy of that turn minus
   ``penalty * streak``, ``streak`` the consecutive fork points at which the episode's line already
   branched; they fork in that order (``sampling.branching.fork_factor - 1`` branches each) while the tree
   has room. A line that keeps branching is pushed down, so one uncertain chain does not take the
   whole budget (the paper's "entropy collapse" of over-branching).

**Reconstructions** [RECON] (the specification gives no formula for these):

- pre-monitoring reads ``H_root`` and ``H_tool`` from the previous training call's episodes (the
  first call uses ``sigmoid(0) = 1/2``), not from a separate probe rollout of each question;
- the branching score is the entropy of the turn that made the tool call (the paper measures the
  entropy of the first tokens after the tool's output, which are not decoded yet at the fork), and
  the penalty is linear in the streak; branching is deterministic (ranked), not sampled.

Needs the sampler's entropies: refused at load with an engine that does not record them
(``rollwise.compat.check_branching``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rollwise.generate.branching import Candidate, fresh_share, turn_entropy


def fresh_count(n: int, h_root: float | None, h_tool: float | None, beta: float) -> int:
    """Pre-monitoring's fresh episodes of a group of ``n`` (module docstring, 1.). Example: n = 8,
    beta = 1, H_root - H_tool = ln 3: sigmoid = 3/4, so 6 fresh and 2 branches."""
    share = 0.5 if h_root is None or h_tool is None else 1.0 / (1.0 + math.exp(-beta * (h_root - h_tool)))
    return fresh_share(n, share)


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


class AepoRule:
    """The branching rule of ``sampling.branching.mode = "aepo"`` (module docstring)."""

    needs_entropy = True

    def __init__(self, beta: float = 1.0, penalty: float = 0.5):
        self.beta, self.penalty = beta, penalty
        self.h_root: float | None = None
        self.h_tool: float | None = None

    @classmethod
    def for_config(cls, b) -> AepoRule:
        """From ``sampling.branching``."""
        return cls(b.beta, b.penalty)

    def fresh(self, n: int) -> int:
        return fresh_count(n, self.h_root, self.h_tool, self.beta)

    def score(self, c: Candidate) -> float:
        return (c.entropy or 0.0) - self.penalty * c.streak

    def rank(self, candidates: Sequence[Candidate]) -> list[Candidate]:
        return sorted(candidates, key=lambda c: (-self.score(c), c.index))

    def observe(self, episodes) -> None:
        """``H_root`` and ``H_tool`` of this call's episodes, for the next call's split."""
        root = [h for e in episodes if (h := turn_entropy(e, 0)) is not None]
        after = [
            h
            for e in episodes
            for j in range(1, len(e.turns))
            if e.turns[j - 1].tool_calls and (h := turn_entropy(e, j)) is not None
        ]
        self.h_root = _mean(root) if root else self.h_root
        self.h_tool = _mean(after) if after else self.h_tool
