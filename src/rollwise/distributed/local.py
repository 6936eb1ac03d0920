"""``local`` worker pool: generate and score the rollouts of a plan in this process.

``generate(plan, groups, version) -> groups``: runs every request through the backend in
calls of at most ``max_batch`` sequences (``model.max_batch``; None = one call), so the memory
a backend needs per call does not grow with the plan (BroRL's hundreds of rollouts per prompt;
the HF backend also chunks internally, at the same size, so results are unchanged); decodes,
verifies, and merges the new rollouts into ``groups`` (``generate.common.merge_groups``: a request for a prompt
that already has a group tops that group up, e.g. DARS's second stage). Costs are accumulated in
``cost`` (a ``generate.common.StepCost``) that the loop hands to the ledger once per step.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable, Sequence

import torch

from rollwise.generate.common import StepCost, merge_groups
from rollwise.registry import Compat
from rollwise.tokens import Codec
from rollwise.types import Group, Plan, Prompt, Rollout, Sampling, Verdict

COMPAT = Compat()  # generates with model.backend in this process: it supports what the backend supports


class LocalPool:
    def __init__(
        self,
        backend,
        codec: Codec,
        verify: Callable[[Prompt, str], Verdict],
        sampling: Sampling,
        max_batch: int | None = None,
        tree=None,
        verify_workers: int = 1,
    ):
        self.backend, self.codec, self.verify, self.sampling = backend, codec, verify, sampling
        self.max_batch = max_batch
        self.verify_workers = verify_workers  # verifier calls in parallel (threads; e.g. sandboxed code checks)
        self._verify_pool = None
        self.tree = tree  # a tree sampler (generate/latr.py, etmr.py, ec_tree.py) for training requests, or None
        self.cost = StepCost()

    def close(self) -> None:
        """Nothing to release: the backend and the verifier belong to the run (``types.Pool``)."""

    def take_cost(self) -> StepCost:
        cost, self.cost = self.cost, StepCost()
        return cost

    def rollouts(
        self, plan: Plan, version: int, sampling: Sampling | None = None, generator=None, charge: bool = True
    ) -> list[tuple[Prompt, Rollout]]:
        """Generate and score every request of ``plan`` (``charge=False`` for evaluation)."""
        sampling = sampling or self.sampling
        jobs, seqs, tree_jobs = [], [], []
        for req in plan.requests:
            pids = self.codec.encode_prompt(req.prompt)
            prefix = tuple(req.prefix or ())
            # tree samplers: k of the n rollouts of a fresh training request come from a tree (k = 0: none)
            k = self.tree.tree_size(req.n, version) if self.tree is not None and charge and not prefix else 0
            if k:
                tree_jobs.append((req, pids, k))
            for _ in range(req.n - k):
                jobs.append((req, pids, prefix))
                seqs.append(pids + prefix)
        t0 = time.perf_counter()
        step = self.max_batch or max(1, len(seqs))
        comps = []
        for start in range(0, len(seqs), step):
            comps.extend(self.backend.generate(seqs[start : start + step], sampling, generator))
        decoded = sum(len(c.token_ids) for c in comps)
        paths = [None] * len(comps)
        if tree_jobs:  # tree rollouts after the i.i.d. ones; charged by the tokens actually decoded
            trees, tree_tokens = self.tree.generate(
                [p for _, p, _ in tree_jobs],
                [k for _, _, k in tree_jobs],
                sampling,
                generator,
                max_batch=self.max_batch,
            )  # tree phase in chunks of <= max_batch rows
            for (req, pids, _), out in zip(tree_jobs, trees):
                for c, path in out:
                    jobs.append((req, pids, ()))
                    comps.append(c)
                    paths.append(path)
            decoded += tree_tokens
            if charge:
                st, pre = self.tree.last_stats, getattr(self.tree, "metrics", "latr")  # etmr/*, ec_tree/*
                self.cost.count(
                    **{
                        f"{pre}/tree_rollouts": sum(k for _, _, k in tree_jobs),
                        f"{pre}/branches_born": st.get("branches_born", 0),
                        f"{pre}/branches_pruned": st.get("branches_pruned", 0),
                    }
                )
        t1 = time.perf_counter()
        done = self.finish_rollouts([(req, pids, c) for (req, pids, _), c in zip(jobs, comps)], version)
        out = [
            (req.prompt, r if path is None else dataclasses.replace(r, tree=path))
            for (req, _, _), r, path in zip(jobs, done, paths)
        ]
        t2 = time.perf_counter()
        if charge:
            self.cost.charge(decoded, len(comps), [r.verdict for _, r in out], t1 - t0, t2 - t1)
        return out

    def generate(self, plan: Plan, groups: list[Group], version: int) -> list[Group]:
        return merge_groups(groups, self.rollouts(plan, version))

    def finish_rollout(self, req, pids, c, version: int) -> Rollout:
        """Decode ``req.prefix`` + the completion, verify it and build its rollout (every pool
        wrapper's last step: APRIL, SPEC-RL, ARRoL)."""
        return self.finish_rollouts([(req, pids, c)], version)[0]

    def finish_rollouts(self, items, version: int) -> list[Rollout]:
        """``finish_rollout`` for many ``(req, pids, completion)``: decoded here in order, verified
        ``verify_workers`` at a time (threads: a sandboxed check waits on its own process), built in order."""
        texts = [self.codec.decode(tuple(req.prefix or ()) + c.token_ids) for req, _, c in items]
        prompts = [req.prompt for req, _, _ in items]
        if self.verify_workers > 1 and len(items) > 1:
            if self._verify_pool is None:
                from concurrent.futures import ThreadPoolExecutor

                self._verify_pool = ThreadPoolExecutor(self.verify_workers, thread_name_prefix="rollwise-verify")
            verdicts = list(self._verify_pool.map(self.verify, prompts, texts))
        else:
            verdicts = [self.verify(p, t) for p, t in zip(prompts, texts)]
        return [make_rollout(req, pids, c, version, text, v) for (req, pids, c), text, v in zip(items, texts, verdicts)]


def make_rollout(req, pids, c, version: int, text: str, verdict: Verdict) -> Rollout:
    """A rollout from a completion; a continued prefix keeps its own log-probs and versions."""
    if not req.prefix:
        return Rollout(
            req.prompt.id, pids, c.token_ids, c.logprobs, c.finish, version, text, verdict, entropies=c.entropies
        )
    if req.prefix_logprobs is None or len(req.prefix_logprobs) != len(req.prefix):
        raise ValueError(f"request for {req.prompt.id!r} continues a prefix without its log-probs")
    versions = tuple(req.prefix_versions or (version,) * len(req.prefix)) + (version,) * len(c.token_ids)
    return Rollout(
        req.prompt.id,
        pids,
        req.prefix + c.token_ids,
        req.prefix_logprobs + c.logprobs,
        c.finish,
        versions[0],
        text,
        verdict,
        token_versions=versions,
    )


# ---------------------------------------------------------------- per-request seeds


def request_seed(*key) -> int:
    """A 63-bit seed from a key (a stable hash of its repr, independent of PYTHONHASHSEED)."""
    return int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little") >> 1


def run_requests(pool, jobs, version: int, sampling: Sampling, charge: bool) -> list[list]:
    """Each ``(request, seed)`` generated and scored by ``pool`` (a ``LocalPool``) as its own call
    with a generator seeded by ``seed``; one list of ``(prompt, rollout)`` per job."""
    return [
        pool.rollouts(Plan((req,)), version, sampling, torch.Generator().manual_seed(seed), charge)
        for req, seed in jobs
    ]


class _Seeds:
    """The seed of each request of a call (module docstring, "Requests")."""

    def __init__(self, run_seed: int):
        self.run_seed = run_seed
        self.round = (-1, 0)  # (policy version, training calls made at it)

    def __call__(self, plan: Plan, version: int, generator) -> list[int]:
        if generator is not None:  # evaluation: the caller's generator decides
            base = ("given", int(torch.randint(0, 2**62, (1,), generator=generator)))
        else:
            v, r = self.round
            self.round = (version, r + 1 if v == version else 0)
            base = ("train", self.run_seed, version, self.round[1])
        return [request_seed(*base, req.prompt.id, i) for i, req in enumerate(plan.requests)]


class SeededPool:
    """The local pool with per-request seeds (``distributed.request_seeds``, ``workers = 0``)."""

    def __init__(self, pool, run_seed: int):
        self.pool, self.seeds = pool, _Seeds(run_seed)

    def __getattr__(self, name):  # cost, take_cost, codec, ... of the local pool
        return getattr(self.pool, name)

    def rollouts(self, plan: Plan, version: int, sampling: Sampling | None = None, generator=None, charge: bool = True):
        jobs = list(zip(plan.requests, self.seeds(plan, version, generator)))
        return [
            pair
            for out in run_requests(self.pool, jobs, version, sampling or self.pool.sampling, charge)
            for pair in out
        ]

    def generate(self, plan: Plan, groups: list[Group], version: int) -> list[Group]:
        return merge_groups(groups, self.rollouts(plan, version))


def split(items: Sequence, sizes: Sequence[int], workers: int) -> list[list[int]]:
    """Indices of ``items`` per worker: each item (whole) to the worker with the fewest rollouts
    so far, ties to the lowest index; each worker's indices in plan order. Sizes (4, 4, 1, 1)
    on 2 workers -> [[0, 2], [1, 3]] (loads 5 and 5)."""
    load = [0] * workers
    out: list[list[int]] = [[] for _ in range(workers)]
    for k, n in enumerate(sizes):
        w = min(range(workers), key=lambda j: (load[j], j))
        out[w].append(k)
        load[w] += n
    return out
