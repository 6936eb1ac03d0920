"""Episode branching: fork an episode at a turn and continue each branch independently (issue #44).

The primitive, :func:`fork_episode`, copies everything that decides how an episode goes on:

- the environment's state: ``env.fork()`` of an environment that declares ``forkable = True``
  (``rollwise/envs/base.py``, "Forking"). The task's factory declares the same
  (``Compat(forkable=True)``), and ``rollwise.compat.check_branching`` refuses ``sampling.branching`` at
  load for a task whose environments cannot be forked; the pool reads the declaration, never probes;
- the token prefix: every policy and observation id so far with its sampler log-prob, loss mask and
  entropy, the turn records, the tool calls used and the turn limit (the prompt ids are shared);
- the sampler's random state: :func:`fork_generator` copies a ``torch.Generator``. A branch continued
  from the state its original continued from decodes the same tokens, because a backend's draws are a
  function of the ids and the generator (``backends/hf.py``); from another state it diverges (both
  tested with the tiny model, ``tests/unit/generate/test_branching.py``).

``BranchingPool`` is the episode pool (``rollwise.generate.episodes``) of a run with
``sampling.branching.mode`` set. It grows the ``req.n`` episodes of each request as a tree, in lockstep
turns:

1. the mode's rule says how many of the ``n`` start fresh (``fresh(n)``): AEPO's entropy
   pre-monitoring (``rollwise.generate.aepo``) or PORTool's tree (``rollwise.generate.portool``);
2. after every turn, the tree's episodes that called a tool and go on are its fork points. The rule
   orders them (``rank``) and each, in that order, forks ``fork_factor - 1`` branches until the tree
   holds ``n`` episodes. A branch continues in the next turn's batched backend call on its own row of
   that call's draws, so branches diverge, and the whole tree is reproducible for a seed (lockstep:
   the calls and their order are fixed);
3. when all its episodes have ended and a tree holds fewer than ``n`` (too few tool calls to fork
   at), the rest start fresh: a group always has ``n`` episodes, as without branching.

Each branch is a ``Rollout`` of its own whose completion starts with the ids it shares with its
original; the advantage estimators find the tree from those shared prefixes (``objectives/portool.py``).
The shared prefix is decoded once, so ``cost/generated_tokens`` (the ids decoded) charges it once,
while the batch trains it once per branch (every leaf trajectory is trained on, as in both papers'
trees). ``branching/fresh``, ``branching/forks`` and ``branching/branches`` count the trees' shape in
``metrics.jsonl``. Evaluation (``charge=False``) runs independent episodes.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from concurrent.futures import wait
from dataclasses import dataclass
from typing import Protocol

import torch

from rollwise.generate.episodes import EpisodeLimits, EpisodePool, _Live, _Tally
from rollwise.registry import load_attr
from rollwise.types import EntropyRecorder, Plan, Sampling

# the rule of each sampling.branching.mode, loaded on use (the rule modules import this one)
RULES = {"aepo": "rollwise.generate.aepo:AepoRule", "portool": "rollwise.generate.portool:PortoolRule"}


def fork_episode(e: _Live, index: int) -> _Live:
    """A new episode in the state of ``e`` after its last observed turn (module docstring): the
    environment forked, the ids, log-probs, masks, entropies and turns copied. ``index`` is the new
    episode's place in its call."""
    if getattr(e.env, "forkable", False) is not True:
        raise TypeError(
            f"{type(e.env).__name__} does not declare forkable = True (rollwise/envs/base.py, 'Forking'), "
            "so its episodes cannot branch"
        )
    if e.end is not None:
        raise ValueError(f"episode {e.index} has ended ({e.end!r}); only a running episode forks")
    return dataclasses.replace(
        e,
        index=index,
        env=e.env.fork(),
        ids=list(e.ids),
        logprobs=list(e.logprobs),
        mask=list(e.mask),
        entropies=None if e.entropies is None else list(e.entropies),
        turns=list(e.turns),
    )


def fork_generator(generator: torch.Generator) -> torch.Generator:
    """A new generator in the state of ``generator`` (the sampler's random state of a fork)."""
    twin = torch.Generator(device=generator.device)
    twin.set_state(generator.get_state())
    return twin


def turn_entropy(e: _Live, k: int = -1) -> float | None:
    """The mean sampler entropy of turn ``k``'s policy tokens (None when not recorded or empty)."""
    if not e.turns or e.entropies is None:
        return None
    t = e.turns[k]
    vals = e.entropies[t.start : t.end]
    return sum(vals) / len(vals) if vals else None


@dataclass(frozen=True)
class Candidate:
    """An episode at a fork point: it called a tool in its last turn and goes on."""

    index: int  # its place in the call
    entropy: float | None  # turn_entropy of its last turn
    streak: int  # consecutive fork points at which its line branched


class BranchRule(Protocol):
    """What a branching mode decides (module docstring, 1. and 2.)."""

    needs_entropy: bool  # reads the sampler's entropies (Rollout.entropies)

    def fresh(self, n: int) -> int:
        """How many of a tree's ``n`` episodes start fresh (1..n)."""
        ...

    def rank(self, candidates: Sequence[Candidate]) -> list[Candidate]:
        """The fork points of one tree in the order they fork."""
        ...

    def observe(self, episodes: Sequence[_Live]) -> None:
        """The call's episodes, after it ran (AEPO's entropy statistics)."""
        ...


class BranchingPool(EpisodePool):
    """See the module docstring."""

    def __init__(self, backend, codec, task, sampling: Sampling, limits, rule: BranchRule, factor: int, **kw):
        super().__init__(backend, codec, task, sampling, limits, **kw)
        if self.limits.episode_schedule != "lockstep":
            raise ValueError("branching runs lockstep turns (task.episode_schedule = 'lockstep')")
        self.rule, self.factor = rule, factor
        if rule.needs_entropy and isinstance(backend, EntropyRecorder):
            backend.record_entropy = True  # the rule reads them (refused at load for engines without)
        self._branching = False
        self._tree: dict[int, tuple[int, int]] = {}  # episode index -> (tree, the tree's n)
        self._streak: dict[int, int] = {}

    @classmethod
    def for_run(cls, cfg, backend, codec, task, sampling: Sampling) -> BranchingPool:
        """The pool with the ``task`` section's limits and ``sampling.branching``'s rule."""
        b = cfg.sampling.branching
        rule = load_attr(RULES[b.mode]).for_config(b)
        limits = EpisodeLimits(**{f.name: getattr(cfg.task, f.name) for f in dataclasses.fields(EpisodeLimits)})
        return cls(backend, codec, task, sampling, limits, rule, b.fork_factor, max_batch=cfg.model.max_batch)

    def rollouts(self, plan: Plan, version: int, sampling=None, generator=None, charge: bool = True):
        """As ``EpisodePool.rollouts``; training calls (``charge``) grow trees, evaluation does not."""
        self._branching = charge
        self._tree, self._streak = {}, {}
        self._shape = {"branching/fresh": 0, "branching/forks": 0, "branching/branches": 0}
        out = super().rollouts(plan, version, sampling, generator, charge)
        if charge:
            self.rule.observe(self._live)
            self.cost.count(**self._shape)
        return out

    # ------------------------------------------------------------ the trees

    def _starts(self, plan: Plan, cap: int, make) -> list[_Live]:
        if not self._branching:
            return super()._starts(plan, cap, make)
        live: list[_Live] = []
        self._todo: list[tuple[int, object, tuple, int]] = []  # (tree, prompt, prompt ids, n)
        for tree, req in enumerate(plan.requests):
            if req.prefix:
                raise ValueError(f"request for {req.prompt.id!r} continues a prefix, which episodes do not do")
            pids = self.codec.encode_prompt(req.prompt)
            self._todo.append((tree, req.prompt, pids, req.n))
            m = max(1, min(req.n, self.rule.fresh(req.n))) if req.n else 0
            for _ in range(m):
                self._add(live, self._start(len(live), req.prompt, pids, cap, make), tree, req.n)
            self._shape["branching/fresh"] += m
        self._cap, self._make = cap, make
        return live

    def _add(self, live: list[_Live], e: _Live, tree: int, n: int, streak: int = 0) -> None:
        live.append(e)
        self._tree[e.index], self._streak[e.index] = (tree, n), streak

    def _run(self, live: list[_Live], sampling: Sampling, generator, tally: _Tally) -> None:
        if not self._branching:
            return super()._run(live, sampling, generator, tally)
        self._live = live
        ready = [e for e in live if e.end is None]
        while True:
            while ready:
                self.advance(ready, sampling, generator, tally)
                went_on = [e for e in ready if e.end is None]
                ready = went_on + self._fork(live, went_on)
            ready = self._top_up(live)
            if not ready:
                break

    def advance(self, ready: list[_Live], sampling: Sampling, generator, tally: _Tally) -> None:
        """One lockstep turn of every episode in ``ready``: one backend call, then every environment step."""
        self._turn(ready, sampling, generator, tally)
        futures = [self._pool().submit(self._step, e) for e in ready]
        t0 = time.perf_counter()
        wait(futures)
        tally.waiting_s += time.perf_counter() - t0
        for e, fut in zip(ready, futures):
            self._observe(e, *fut.result(), tally)

    def _fork(self, live: list[_Live], went_on: list[_Live]) -> list[_Live]:
        """The branches of this turn's fork points (module docstring, 2.)."""
        made: list[_Live] = []
        size = self._sizes(live)
        trees: dict[int, list[Candidate]] = {}
        for e in went_on:
            if e.turns and e.turns[-1].tool_calls:
                tree = self._tree[e.index][0]
                trees.setdefault(tree, []).append(Candidate(e.index, turn_entropy(e), self._streak[e.index]))
        by_index = {e.index: e for e in live}
        for tree, cands in trees.items():
            n = self._tree[cands[0].index][1]
            branched = set()
            for c in self.rule.rank(cands):
                k = min(self.factor - 1, n - size[tree])
                if k <= 0:
                    break
                e = by_index[c.index]
                streak = self._streak[e.index] + 1
                self._streak[e.index] = streak
                for _ in range(k):
                    twin = fork_episode(e, len(live))
                    self._add(live, twin, tree, n, streak)
                    made.append(twin)
                size[tree] += k
                branched.add(c.index)
                self._shape["branching/forks"] += 1
                self._shape["branching/branches"] += k
            for c in cands:  # a line that passed a fork point without branching starts its streak again
                if c.index not in branched:
                    self._streak[c.index] = 0
        return made

    def _sizes(self, live: list[_Live]) -> dict[int, int]:
        size: dict[int, int] = {}
        for e in live:
            tree = self._tree[e.index][0]
            size[tree] = size.get(tree, 0) + 1
        return size

    def _top_up(self, live: list[_Live]) -> list[_Live]:
        """Fresh episodes for the trees that ended with fewer than ``n`` (module docstring, 3.)."""
        size, fresh = self._sizes(live), []
        for tree, prompt, pids, n in self._todo:
            for _ in range(n - size.get(tree, 0)):
                e = self._start(len(live), prompt, pids, self._cap, self._make)
                self._add(live, e, tree, n)
                self._shape["branching/fresh"] += 1
                if e.end is None:
                    fresh.append(e)
        return fresh


def fresh_share(n: int, share: float) -> int:
    """``round(n * share)``, at least 1 and at most ``n``: a tree's fresh episodes."""
    return max(1, min(n, int(math.floor(n * share + 0.5))))
