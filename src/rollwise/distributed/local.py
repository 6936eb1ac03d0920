"""``local`` worker pool: generate and score the rollouts of a plan in this process.

``generate(plan, groups, version) -> groups``: runs every request through the backend in
calls of at most ``max_batch`` sequences (``model.max_batch``; None = one call), so the memory
a backend needs per call does not grow with the plan (BroRL's hundreds of rollouts per prompt;
the HF backend also chunks internally, at the same size, so results are unchanged); decodes,
verifies, and merges the new rollouts into ``groups`` (a request for a prompt that already has
a group tops that group up, e.g. DARS's second stage). Costs are
accumulated in ``cost`` (a ``StepCost``) that the loop hands to the ledger once per step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from rollwise.tokens import Codec
from rollwise.types import Group, Plan, Prompt, Rollout, Sampling, Verdict


@dataclass
class StepCost:
    generated_tokens: int = 0
    rollouts: int = 0
    verifier_calls: int = 0
    unverified: int = 0
    generate_s: float = 0.0
    verify_s: float = 0.0


class LocalPool:
    def __init__(self, backend, codec: Codec, verify: Callable[[Prompt, str], Verdict], sampling: Sampling,
                 max_batch: int | None = None):
        self.backend, self.codec, self.verify, self.sampling = backend, codec, verify, sampling
        self.max_batch = max_batch
        self.cost = StepCost()

    def take_cost(self) -> StepCost:
        cost, self.cost = self.cost, StepCost()
        return cost

    def rollouts(self, plan: Plan, version: int, sampling: Sampling | None = None, generator=None, charge: bool = True) -> list[tuple[Prompt, Rollout]]:
        """Generate and score every request of ``plan`` (``charge=False`` for evaluation)."""
        sampling = sampling or self.sampling
        jobs, seqs = [], []
        for req in plan.requests:
            pids = self.codec.encode_prompt(req.prompt)
            prefix = tuple(req.prefix or ())
            for _ in range(req.n):
                jobs.append((req, pids, prefix))
                seqs.append(pids + prefix)
        t0 = time.perf_counter()
        step = self.max_batch or max(1, len(seqs))
        comps = []
        for start in range(0, len(seqs), step):
            comps.extend(self.backend.generate(seqs[start:start + step], sampling, generator))
        t1 = time.perf_counter()
        out = []
        for (req, pids, prefix), c in zip(jobs, comps):
            text = self.codec.decode(prefix + c.token_ids)
            verdict = self.verify(req.prompt, text)
            out.append((req.prompt, make_rollout(req, pids, c, version, text, verdict)))
        t2 = time.perf_counter()
        if charge:
            cost = self.cost
            cost.generated_tokens += sum(len(c.token_ids) for c in comps)
            cost.rollouts += len(comps)
            cost.verifier_calls += len(comps)
            cost.unverified += sum(r.verdict.score is None for _, r in out)
            cost.generate_s += t1 - t0
            cost.verify_s += t2 - t1
        return out

    def generate(self, plan: Plan, groups: list[Group], version: int) -> list[Group]:
        merged: dict[str, Group] = {g.prompt.id: g for g in groups}
        for prompt, rollout in self.rollouts(plan, version):
            g = merged.get(prompt.id) or Group(prompt, ())
            merged[prompt.id] = Group(g.prompt, g.rollouts + (rollout,))
        return list(merged.values())


def make_rollout(req, pids, c, version: int, text: str, verdict: Verdict) -> Rollout:
    """A rollout from a completion; a continued prefix keeps its own log-probs and versions."""
    if not req.prefix:
        return Rollout(req.prompt.id, pids, c.token_ids, c.logprobs, c.finish, version, text, verdict)
    if req.prefix_logprobs is None or len(req.prefix_logprobs) != len(req.prefix):
        raise ValueError(f"request for {req.prompt.id!r} continues a prefix without its log-probs")
    versions = tuple(req.prefix_versions or (version,) * len(req.prefix)) + (version,) * len(c.token_ids)
    return Rollout(req.prompt.id, pids, req.prefix + c.token_ids, req.prefix_logprobs + c.logprobs, c.finish,
                   versions[0], text, verdict, token_versions=versions)
