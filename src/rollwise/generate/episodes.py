"""The episode pool: multi-turn rollouts with environments and tools (docs/architecture.md §11, issue #30).

``EpisodePool`` has the interface of ``rollwise.distributed.local.LocalPool`` (``rollouts``,
``generate``, ``take_cost``, ``close``, ``cost``) and is the base pool of a run whose task makes
environments (declared by its factory's compatibility record, ``Compat(episodes=True)``). For each
request it runs ``req.n`` episodes of the prompt::

    env = task.environment(prompt); env.reset(prompt.metadata.get("seed", 0))
    each turn: every active episode's ids (prompt + all so far) -> ONE backend.generate call
               (in chunks of at most model.max_batch rows); the turn's new ids are decoded and
               env.step(text) runs for each episode in a thread pool (task.tool_workers);
               the observation's ids are appended after the turn (never re-tokenising earlier text)

An episode is ONE ``Rollout``: ``completion_ids`` hold every turn's policy ids (sampler log-probs,
``loss_mask`` 1) and the observation ids after them (log-prob 0.0, ``loss_mask`` 0), and
``Rollout.episode`` the turns as index ranges with their rewards and tool calls. Advantages,
objectives, TIS, replay and checkpoints therefore need nothing new; a single-turn run never builds
this pool. The layout follows rStar2-Agent's and verl's agent loop (arXiv 2508.20722: one
trajectory whose tool-output tokens are masked out of the loss) and RAGEN's multi-turn rollouts
(arXiv 2504.20073); the code is rollwise's own.

Limits (``EpisodeLimits``, from the ``task`` section of the config):

- ``max_turns`` policy turns (end "max_turns");
- ``turn_budget``: training episodes capped below ``max_turns`` at a quantile of the turns episodes
  took so far, extended while they still move (end "turn_cap"; ``rollwise.generate.turn_budget``,
  its ``turn_budget/*`` ledger fields; evaluation runs to ``max_turns``);
- ``cleaner``: training episodes whose failed tool call a later turn repaired get the repair spliced
  in place of the failure, re-scored by the backend (``rollwise.generate.cleaner``, ``cleaner/*``);
- ``semi_online``: training episodes replay the prompt's expert trajectory, patched on a mismatch
  (``rollwise.envs.semi_online``, made by the task's ``replay_environment``; evaluation runs the task's
  own environment);
- ``max_episode_tokens`` policy + observation ids: a turn may decode at most
  min(``sampling.max_new_tokens``, what is left); an episode with no room for another turn ends
  "token_budget" (its last observation is then not appended);
- ``max_observation_tokens``: an observation longer than this is cut (``episodes/obs_truncated``);
- ``max_tool_calls`` and ``tool_timeout_s`` belong to the tool layer: before each step the pool
  calls ``env.set_tool_limits(calls_left, timeout_s)`` when the environment has it, and counts
  the calls each ``StepResult.tool_calls`` reports (those with outcome "limit" were not run).

A turn that stops at ``max_new_tokens`` is still stepped (the environment judges a cut action);
if the environment does not end the episode, it ends "length" ("token_budget" when the episode's
budget was the cut). An environment step (or reset) that raises ends its episode "error" with
verdict score None and finish "error"; the other episodes and the run go on.

The verdict is the final step's ``StepResult.verdict``, else ``Verdict(sum of the turn rewards)``
(reason ``episode_<end>``), whose score is None when any turn reward is None (never a silent 0).
Finish: "stop" when the environment ended the episode, "length" otherwise ("error" as above).

Schedules (``task.episode_schedule``):

- ``lockstep`` (default): every turn waits for all environment steps, and results are taken in
  episode order, so a run is reproducible for a seed (the backend calls and their order are fixed);
- ``overlap``: episodes whose step is done generate their next turn while others still wait on
  slow tools. Which episodes share a backend call then depends on timing, so runs are NOT
  bit-reproducible (sampling draws from one generator in call order);
- ``rollout_wise`` with ``task.env_slots``: DART's schedule, in ``rollwise.generate.rollout_wise``
  (``SlotPool``: episodes queue for a fixed number of environments, a freed one starts the next at once).

``task.high_entropy_turns`` below 1 trains only the call's highest-entropy turns
(``rollwise.generate.entropy_turns``, DART's curation).

Costs: ``StepCost.generated_tokens`` stays the policy ids decoded; ``episodes``, ``turns``,
``tool_calls``, ``tool_s``, ``observation_tokens``, ``env_s`` and ``waiting_s`` (wall seconds
generation waited for environment steps; also charged as ``time/verify_s``) reach
``metrics.jsonl`` as ``episodes/*`` (``rollwise.ledger.episode_fields``), end reasons as
``episodes/end_<reason>``, tool calls by outcome as ``episodes/tool_<outcome>``, turns a patch replaced
(``Turn.patched``) as ``episodes/patched``.
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Literal

from rollwise.generate.cleaner import Cleaner
from rollwise.generate.common import StepCost, merge_groups
from rollwise.generate.entropy_turns import keep_high_entropy_turns
from rollwise.generate.turn_budget import CAPPED, TurnBudget
from rollwise.registry import Compat
from rollwise.sections.task import CleanerConfig, SemiOnlineConfig, TurnBudgetConfig
from rollwise.tokens import Codec
from rollwise.types import Episode, Plan, Prompt, Rollout, Sampling, Turn, Verdict

COMPAT = Compat(decode_hooks=False)  # its own generate calls per turn: no rollout wrapper may drive it


@dataclass(frozen=True)
class EpisodeLimits:
    """The ``task`` section's episode keys (``rollwise.config.TaskConfig``, same names)."""

    max_turns: int = 8
    max_tool_calls: int = 8
    max_episode_tokens: int = 256
    max_observation_tokens: int | None = 64
    tool_timeout_s: float = 10.0
    tool_workers: int = 8
    episode_schedule: Literal["lockstep", "overlap", "rollout_wise"] = "lockstep"
    env_slots: int = 0  # environments live at once; 0 = one per episode (rollwise.generate.rollout_wise)
    high_entropy_turns: float = 1.0  # the fraction of turns trained (rollwise.generate.entropy_turns)
    turn_budget: TurnBudgetConfig | None = None  # None or not enabled: every episode may use max_turns
    cleaner: CleanerConfig | None = None  # None or not enabled: episodes are trained as generated
    semi_online: SemiOnlineConfig | None = None  # None or not enabled: the task's own environments


@dataclass
class _Live:
    """One episode being generated."""

    index: int
    prompt: Prompt
    pids: tuple[int, ...]
    env: Any
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    entropies: list[float] | None = field(default_factory=list)  # None once a turn has none
    turns: list[Turn] = field(default_factory=list)
    tool_calls_used: int = 0
    limit: int = 0  # turns this episode may take (task.max_turns, or the turn budget's cap and extensions)
    extensions: int = 0  # extensions the turn budget granted
    action: str = ""  # the current turn's decoded text
    turn: tuple = ()  # (start, end, finish, budget_cut) of the current turn
    last: Any = None  # the last StepResult
    end: str | None = None
    error: BaseException | None = None


@dataclass
class _Tally:
    """What one ``rollouts`` call spent."""

    decoded: int = 0
    generate_s: float = 0.0
    waiting_s: float = 0.0
    env_s: float = 0.0
    truncated: int = 0
    extensions: int = 0  # turns budget extensions granted (rollwise.generate.turn_budget)


class EpisodePool:
    """See the module docstring."""

    def __init__(
        self,
        backend,
        codec: Codec,
        task,
        sampling: Sampling,
        limits: EpisodeLimits | None = None,
        max_batch: int | None = None,
    ):
        self.backend, self.codec, self.task, self.sampling = backend, codec, task, sampling
        self.verify = task.verify  # what wrappers of a pool read; episodes are judged by their environment
        self.limits, self.max_batch = limits or EpisodeLimits(), max_batch
        self.cost = StepCost()
        self._workers: ThreadPoolExecutor | None = None
        tb = self.limits.turn_budget
        self.budget = TurnBudget(tb, self.limits.max_turns) if tb is not None and tb.enabled else None
        cl, so = self.limits.cleaner, self.limits.semi_online
        self.cleaner = Cleaner(cl.threshold) if cl is not None and cl.enabled else None
        self.patch_budget = so.patch_budget if so is not None and so.enabled else None  # UI-S1's replay

    @classmethod
    def for_run(cls, cfg, backend, codec: Codec, task, sampling: Sampling) -> EpisodePool:
        """The pool with the ``task`` section's limits (the run's base pool, or a Ray worker's)."""
        limits = EpisodeLimits(**{f.name: getattr(cfg.task, f.name) for f in dataclasses.fields(EpisodeLimits)})
        return cls(backend, codec, task, sampling, limits, max_batch=cfg.model.max_batch)

    def close(self) -> None:
        if self._workers is not None:
            self._workers.shutdown(wait=True)
            self._workers = None

    def take_cost(self) -> StepCost:
        cost, self.cost = self.cost, StepCost()
        return cost

    def generate(self, plan: Plan, groups: list, version: int) -> list:
        return merge_groups(groups, self.rollouts(plan, version))

    def rollouts(
        self, plan: Plan, version: int, sampling: Sampling | None = None, generator=None, charge: bool = True
    ) -> list[tuple[Prompt, Rollout]]:
        """Run ``req.n`` episodes of every request of ``plan`` (``charge=False`` for evaluation)."""
        sampling = sampling or self.sampling
        # the turn budget caps training episodes only, at one cap for the whole call (reproducible)
        cap = self.budget.cap() if self.budget is not None and charge else self.limits.max_turns
        make = self.task.environment if self.patch_budget is None or not charge else self._replay
        live = self._starts(plan, cap, make)
        tally = _Tally()
        self._run(live, sampling, generator, tally)
        out = [(e.prompt, self._rollout(e, version)) for e in live]
        if charge:
            self._charge(out, tally)
            if self.budget is not None:
                self._charge_budget(out, tally, cap)
            if self.cleaner is not None:  # after the ledger counted the calls that really ran
                out = self.cleaner.apply(out, self.backend, sampling, self.codec.decode, self.cost)
            if self.limits.high_entropy_turns < 1.0:  # DART's curation: the other turns leave the loss
                out = keep_high_entropy_turns(out, self.limits.high_entropy_turns, self.cost)
        return out

    def _replay(self, prompt: Prompt):
        """UI-S1's replay of the prompt's demonstration (``task.semi_online``): training episodes only."""
        return self.task.replay_environment(prompt, self.patch_budget)

    # ------------------------------------------------------------ the turns

    def _starts(self, plan: Plan, cap: int, make) -> list[_Live]:
        """``req.n`` fresh episodes of every request (a branching pool starts fewer and forks the rest,
        ``rollwise.generate.branching``)."""
        live: list[_Live] = []
        for req in plan.requests:
            if req.prefix:
                raise ValueError(f"request for {req.prompt.id!r} continues a prefix, which episodes do not do")
            pids = self.codec.encode_prompt(req.prompt)
            for _ in range(req.n):
                live.append(self._start(len(live), req.prompt, pids, cap, make))
        return live

    def _start(self, index: int, prompt: Prompt, pids, limit: int, make=None) -> _Live:
        """One fresh episode; ``make`` builds its environment (the task's, or UI-S1's replay)."""
        e = _Live(index, prompt, pids, None, limit=limit)
        try:
            e.env = (make or self.task.environment)(prompt)
            e.env.reset(int(prompt.metadata.get("seed", 0)))
        except Exception as err:  # noqa: BLE001  an environment that cannot start ends its episode, not the run
            e.end, e.error = "error", err
        return e

    def _run(self, live: list[_Live], sampling: Sampling, generator, tally: _Tally) -> None:
        """Turns until every episode has ended (module docstring, "Schedules")."""
        self._drive([e for e in live if e.end is None], sampling, generator, tally)

    def _drive(self, ready: list[_Live], sampling: Sampling, generator, tally: _Tally, refill=None) -> None:
        """Turns of ``ready`` until no episode is ready or stepping: one backend call for the ready ones,
        their environment steps on the tool threads, then the steps that finished (all of them under
        ``lockstep``, the first under ``overlap``) observed in episode order. ``refill(ended, idle)``, when
        given, is called after each wait with the episodes that just ended and whether none is left
        running, and returns episodes that start now (``rollwise.generate.rollout_wise``'s slots)."""
        pending: dict = {}
        until = ALL_COMPLETED if self.limits.episode_schedule == "lockstep" else FIRST_COMPLETED
        while ready or pending:
            if ready:
                self._turn(ready, sampling, generator, tally)
                for e in ready:
                    pending[self._pool().submit(self._step, e)] = e
                ready = []
            t0 = time.perf_counter()
            done, _ = wait(list(pending), return_when=until)
            tally.waiting_s += time.perf_counter() - t0
            ended = []
            for fut in sorted(done, key=lambda f: pending[f].index):
                e = pending.pop(fut)
                self._observe(e, *fut.result(), tally)
                (ready if e.end is None else ended).append(e)
            if refill is not None:
                ready += refill(ended, not (ready or pending))

    def _pool(self) -> ThreadPoolExecutor:
        if self._workers is None:
            self._workers = ThreadPoolExecutor(max(1, self.limits.tool_workers), thread_name_prefix="rollwise-env")
        return self._workers

    def _turn(self, ready: list[_Live], sampling: Sampling, generator, tally: _Tally) -> None:
        """One policy turn of every episode in ``ready``: one backend call (in chunks of
        ``max_batch``), each row capped by what is left of its episode's token budget."""
        left = self.limits.max_episode_tokens
        seqs = [e.pids + tuple(e.ids) for e in ready]
        caps = [min(sampling.max_new_tokens, left - len(e.ids)) for e in ready]
        t0 = time.perf_counter()
        step = self.max_batch or len(seqs)
        comps = []
        for s in range(0, len(seqs), step):
            chunk = caps[s : s + step]
            smp = dataclasses.replace(sampling, max_new_tokens=max(chunk))
            extra = {} if min(chunk) == max(chunk) else {"max_new_tokens": chunk}
            comps.extend(self.backend.generate(seqs[s : s + step], smp, generator, **extra))
        tally.generate_s += time.perf_counter() - t0
        for e, c, cap in zip(ready, comps, caps):
            start = len(e.ids)
            e.ids += c.token_ids
            e.logprobs += c.logprobs
            e.mask += [1] * len(c.token_ids)
            e.entropies = None if e.entropies is None or c.entropies is None else e.entropies + list(c.entropies)
            e.turn = (start, len(e.ids), c.finish, cap < sampling.max_new_tokens)
            e.action = self.codec.decode(c.token_ids)
            tally.decoded += len(c.token_ids)

    def _step(self, e: _Live):
        """``env.step`` of the current turn (in a worker thread): (result, error, seconds)."""
        t0 = time.perf_counter()
        try:
            limit = getattr(e.env, "set_tool_limits", None)
            if limit is not None:
                limit(max(0, self.limits.max_tool_calls - e.tool_calls_used), self.limits.tool_timeout_s)
            return e.env.step(e.action), None, time.perf_counter() - t0
        except Exception as err:  # noqa: BLE001  the episode ends "error"; the run goes on
            return None, err, time.perf_counter() - t0

    def _observe(self, e: _Live, res, err, seconds: float, tally: _Tally) -> None:
        """Record the turn and either end the episode or append the observation."""
        start, end, finish, budget_cut = e.turn
        tally.env_s += seconds
        if err is not None:
            e.turns.append(Turn(start, end, end, None))
            e.end, e.error = "error", err
            return
        calls = tuple(res.tool_calls)
        e.tool_calls_used += sum(c.outcome != "limit" for c in calls)
        e.last, lim = res, self.limits
        reason = _end_reason(res.done, len(e.turns) + 1, finish, budget_cut, end, lim)
        if reason is None and len(e.turns) + 1 >= e.limit:  # at the turn budget's cap (below max_turns)
            now = [*e.turns, Turn(start, end, end, res.reward, calls, res.anchor)]
            granted = e.extensions
            e.limit, e.extensions = self.budget.limit(now, e.limit, e.extensions)
            tally.extensions += e.extensions - granted
            reason = CAPPED if len(now) >= e.limit else None
        obs: list[int] = []
        if reason is None:
            role = "tool" if calls else "user"
            obs, cut = self.codec.encode_observation(res.observation, e.prompt, role, lim.max_observation_tokens)
            tally.truncated += cut
            if lim.max_episode_tokens - end - len(obs) < 1:  # no room for another turn
                obs, reason = [], "token_budget"
        e.ids += obs
        e.logprobs += [0.0] * len(obs)
        e.mask += [0] * len(obs)
        e.entropies = None if e.entropies is None else e.entropies + [0.0] * len(obs)
        patched = bool(res.info.get("patched", False))
        e.turns.append(Turn(start, end, end + len(obs), res.reward, calls, res.anchor, patched))
        e.end = reason

    # ------------------------------------------------------------ records and costs

    def _rollout(self, e: _Live, version: int) -> Rollout:
        if e.end == "error":
            why = f"{type(e.error).__name__}: {e.error}" if e.error is not None else "the backend failed a turn"
            verdict = Verdict(None, "env_error", {"error": why})
            finish = "error"
        else:
            verdict = e.last.verdict if e.last.verdict is not None else turn_verdict(e.turns, e.end)
            finish = "stop" if e.end == "done" else "length"
        return Rollout(
            e.prompt.id,
            e.pids,
            tuple(e.ids),
            tuple(e.logprobs),
            finish,
            version,
            self.codec.decode(e.ids),
            verdict,
            loss_mask=tuple(e.mask),
            entropies=tuple(e.entropies) if e.entropies and len(e.entropies) == len(e.ids) else None,
            episode=Episode(tuple(e.turns), e.end),
        )

    def _charge(self, out, tally: _Tally) -> None:
        """The call's cost: what the episodes record (turns, tool calls and their seconds, observation
        tokens) read from them; what only the call saw (tokens decoded, seconds) from ``tally``."""
        c = self.cost
        c.charge(tally.decoded, len(out), [r.verdict for _, r in out], tally.generate_s, tally.waiting_s)
        episodes = [r.episode for _, r in out]
        c.episodes += len(out)
        c.turns += sum(len(ep.turns) for ep in episodes)
        c.tool_calls += sum(len(ep.tool_calls) for ep in episodes)
        c.tool_s += sum(call.seconds for ep in episodes for call in ep.tool_calls)
        c.observation_tokens += sum(ep.observation_tokens() for ep in episodes)
        c.env_s += tally.env_s
        c.waiting_s += tally.waiting_s
        ends: dict[str, int] = {}
        for _, r in out:
            ends[f"episodes/end_{r.episode.end}"] = ends.get(f"episodes/end_{r.episode.end}", 0) + 1
            for call in r.episode.tool_calls:  # episodes/tool_ok, tool_error, tool_timeout, tool_parse_error, ...
                ends[f"episodes/tool_{call.outcome}"] = ends.get(f"episodes/tool_{call.outcome}", 0) + 1
        patched = sum(t.patched for ep in episodes for t in ep.turns)  # UI-S1's patches (task.semi_online)
        c.count(
            **ends,
            **({"episodes/obs_truncated": tally.truncated} if tally.truncated else {}),
            **({"episodes/patched": patched} if patched else {}),
        )

    def _charge_budget(self, out, tally: _Tally, cap: int) -> None:
        """The turn budget's ledger fields (``rollwise.generate.turn_budget``, 4.), then the call's
        episodes recorded: savings are estimated from the distribution the cap was read from."""
        episodes = [r.episode for _, r in out]
        turns = sum(len(ep.turns) for ep in episodes)
        capped = [len(ep.turns) for ep in episodes if ep.end == CAPPED]
        more = sum(self.budget.expected_more(t) for t in capped)
        per_turn_s = (tally.generate_s + tally.waiting_s) / turns if turns else 0.0
        self.cost.metrics["turn_budget/cap"] = cap  # the last call's, not a sum
        self.cost.count(
            **{
                "turn_budget/capped": len(capped),
                "turn_budget/extensions": tally.extensions,
                "turn_budget/saved_turns_est": more,
                "turn_budget/saved_tokens_est": more * (tally.decoded / turns if turns else 0.0),
                "turn_budget/saved_s_est": more * per_turn_s,
            }
        )
        self.budget.record([(len(ep.turns), ep.end) for ep in episodes])


def _end_reason(done: bool, turns: int, finish: str, budget_cut: bool, used: int, lim: EpisodeLimits) -> str | None:
    """Why the episode ends after a stepped turn (``Episode.end``), or None when it goes on."""
    if done:
        return "done"
    if turns >= lim.max_turns:
        return "max_turns"
    if finish == "length":
        return "token_budget" if budget_cut else "length"
    if finish != "stop":
        return "error"
    if lim.max_episode_tokens - used < 1:
        return "token_budget"
    return None


def turn_verdict(turns, end: str) -> Verdict:
    """``Verdict(sum of the turn rewards)``, score None when any turn reward is None."""
    rewards = [t.reward for t in turns]
    if any(r is None for r in rewards):
        return Verdict(None, "turn_unverified")
    return Verdict(float(sum(rewards)), f"episode_{end}")
