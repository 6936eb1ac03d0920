"""``sampling.branching.mode = "portool"``: PORTool's tree rollouts, forking at tool calls (issue #44).

Paper: Wu et al., "PORTool: Tool-Use LLM Training with Rewarded Tree", arXiv 2510.26020; the working
specification is the PORTool entry of the project's agentic specifications (issue #44). Its rollout
half, on the branching primitive of ``rollwise.generate.branching`` (its credit half is the advantage
``portool``, ``objectives/portool.py``): a group's episodes grow as a tree whose branches split where
the policy called a tool, so sibling branches share everything before the tool's output and differ in
what the policy did with it; that is what the fork-relative advantage compares.

- ``n / fork_factor`` of a group's ``n`` episodes start fresh (rounded, at least 1);
- after each turn, every episode that called a tool and goes on forks ``fork_factor - 1`` branches,
  in episode order, while the tree has room for them (the tree ends with ``n`` episodes, topped up
  with fresh ones when there were too few tool calls to fork at).

**Reconstruction** [RECON]: the paper keeps ``n - n_done`` forks at each depth of an unbounded tree;
here the tree has exactly the ``n`` episodes a controller planned (so budgets and group sizes match
independent episodes) and forks in episode order until it is full.
"""

from __future__ import annotations

from collections.abc import Sequence

from rollwise.generate.branching import Candidate, fresh_share


class PortoolRule:
    """The branching rule of ``sampling.branching.mode = "portool"`` (module docstring)."""

    needs_entropy = False

    def __init__(self, fork_factor: int = 2):
        self.factor = fork_factor

    @classmethod
    def for_config(cls, b) -> PortoolRule:
        """From ``sampling.branching``."""
        return cls(b.fork_factor)

    def fresh(self, n: int) -> int:
        return fresh_share(n, 1.0 / self.factor)

    def rank(self, candidates: Sequence[Candidate]) -> list[Candidate]:
        return sorted(candidates, key=lambda c: c.index)

    def observe(self, episodes) -> None:
        return None
