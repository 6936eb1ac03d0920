"""``xrpo``: uncertainty-reduction rollout allocation in rounds, with in-context seeding of
zero-reward prompts.

Paper: "Pushing the limits of GRPO with Targeted Exploration and Exploitation" (XRPO),
arXiv 2510.06672 (allocation.md §2). No official code could be read; the formulas follow a
secondary summary and a third-party re-implementation (grpo-composer), which agree. The third
part of XRPO, novelty-aware advantage sharpening, is the advantage estimator ``novelty``
(:mod:`rollwise.objectives.novelty`); this controller does the other two.

Allocator (allocation.md §2.1). For prompt q with ``n_q`` verified rollouts this step and
sample std ``s_q`` (unbiased, n-1) of their rewards:

- uncertainty ``h_q(n) = t_{1-alpha/2, n-1} * s_q / sqrt(n)`` (Student-t CI half-width);
- expected reduction from one more rollout, ``s_q`` held fixed,
  ``Delta_q(n) = h_q(n) - h_q(n+1) = s_q * (t_{n-1}/sqrt(n) - t_n/sqrt(n+1))``;
- exploration bonus ``phi_q = explore * sqrt(log(1 + T) / n_q)``;
- priority ``Pi_q = Delta_q(n_q) + phi_q``.

Schedule, a step (all **[RECON]**, the paper's schedule was not recovered):

1. ``plan``: every selected prompt gets ``n_init`` rollouts (phase 0), capped by the budget.
2. Each ``next_round`` (at most ``rounds`` of them) first seeds zero-reward prompts (first
   round only, see below), then hands ``ceil(left / rounds_left)`` rollouts out one at a time,
   each to the prompt with the highest priority; after each pick that prompt's ``n`` grows by
   one (``s_q`` fixed), so the round spreads over the top prompts with diminishing returns.
   ``T`` is the number of rollouts allocated so far in this step, frozen at the start of the
   round (allocation.md §2.1 step 3 [RECON]). A prompt never exceeds ``max_per_prompt``.
3. The step's rollouts stay within the per-step budget
   (:class:`~rollwise.control.budget.StepBudget`: ``control.budget_rollouts``, default
   ``prompts_per_step * rollouts_per_prompt``, and ``control.budget_tokens``); with only the
   rollout cap they reach it exactly unless every prompt hits ``max_per_prompt`` (Sum n_q =
   budget, allocation.md §2.6). Every round asks the budget what is left given the rollouts
   generated so far for this plan's prompts.

Consequences: a group with all-equal rewards has ``s_q = 0`` hence ``Delta_q = 0`` and competes
with the bonus only; at equal ``n`` a prompt with p-hat nearer 0.5 has the larger ``s_q`` and
is preferred; at equal ``s_q`` the less-sampled prompt is preferred. Prompts with fewer than two
verified rollouts (possible only when the budget trims phase 0 or a verifier fails) have no
``s_q``; they get top priority until they have two, and ``s_q = 0`` is used after that.

Differences from the spec: all-correct/all-wrong prompts that are *not* seeded stay in the
allocator with ``Delta = 0`` (the spec computes Pi only for non-zero-reward prompts, because those
are seeded instead); keeping them lets the budget be spent exactly when seeding has nothing to
offer. ``k`` (number correct) counts rewards >= 0.5, as :class:`PromptHistory` does.

In-context seeding (allocation.md §2.2, details **[RECON]**). In the first allocation round,
each prompt whose phase-0 rollouts are all wrong (k = 0) gets ``icl_rollouts`` rollouts of a
*seeded* prompt: the same problem with up to ``icl_exemplars`` solved exemplars prepended
(``icl_template`` per exemplar for text prompts; a user/assistant message pair per exemplar,
after any system messages, for chat prompts). Exemplars come from, in this order of preference:
``"own"`` — correct responses to this very prompt seen in earlier steps; ``"solved"`` — correct
responses to other train prompts, most similar problem first; ``"pool"`` — the configured
``icl_pool`` / ``icl_pool_path`` entries, most similar first. Similarity is the Jaccard index of
word/symbol token sets, a cheap stand-in for the paper's unstated retrieval (the spec suggests
embeddings or BM25). The store keeps the ``icl_store_per_prompt`` most recent correct responses
of each prompt from every observed group (seeded groups included), for at most
``icl_store_max_prompts`` prompts (least recently updated evicted first). A seeded prompt takes
no further part in the allocator in that step. If no exemplar is available the prompt is not
seeded.

Seeded rollouts form their own group (differences from the spec's [RECON] step 4): the seeded
prompt has its own id ``<id>#icl-<hash of the exemplars>`` because the token codec caches prompt
ids by ``Prompt.id`` and the worker pool merges rollouts into groups by ``Prompt.id``. So the
seeded rollouts are trained on *under the seeded prompt* (exact on-policy log-probs, no
exemplar stripping) with a group baseline of their own; they are not mixed into the original
prompt's all-zero group. Seeded groups are not written to the :class:`PromptHistory` (their
accuracy is not the prompt's), but their correct responses enter the exemplar store under the
original prompt. ``Prompt.metadata["icl_of"]`` names the original prompt.

``metrics`` holds the last step's ``control/xrpo_*`` counters (seeded prompts, seeded groups
with a correct rollout, allocation rounds); the loop adds it to the step's ledger line.

State: prompt stream, history, exemplar store and the in-step round context; all go into
checkpoints.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
import re
from collections import OrderedDict
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rollwise.control.source import PromptSource, SourceController
from rollwise.registry import Compat, UserError
from rollwise.types import Group, Plan, Prompt, Request

# ------------------------------------------------------------------ Student-t quantile


@lru_cache(maxsize=4096)
def t_quantile(df: int, alpha: float) -> float:
    """Two-sided critical value ``t_{1-alpha/2, df}``: ``P(|T_df| <= t) = 1 - alpha``.

    Exact for integer ``df >= 1`` (no scipy): the closed form of ``A(t|df) = P(|T| <= t)`` in
    theta = atan(t / sqrt(df)) (Abramowitz & Stegun 26.7.3-4), inverted by bisection on theta.
    Examples: df=1, alpha=0.05 -> tan(0.475 pi) = 12.706; df=2 -> sqrt(2) tan(asin(0.95)) = 4.303.
    """
    if df < 1:
        raise ValueError(f"t_quantile needs df >= 1, got {df}")
    target = 1.0 - alpha
    lo, hi = 0.0, math.pi / 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if _t_two_sided_mass(df, mid) < target:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-15:
            break
    theta = (lo + hi) / 2
    return math.sqrt(df) * math.tan(theta)


def _t_two_sided_mass(df: int, theta: float) -> float:
    c, s = math.cos(theta), math.sin(theta)
    if df % 2 == 1:  # odd: (2/pi) [theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...)]
        if df == 1:
            return 2 * theta / math.pi
        term, acc = 1.0, 1.0
        for j in range(1, (df - 1) // 2):
            term *= (2 * j) / (2 * j + 1) * c * c
            acc += term
        return 2 / math.pi * (theta + s * c * acc)
    term, acc = 1.0, 1.0  # even: sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...)
    for j in range(1, df // 2):
        term *= (2 * j - 1) / (2 * j) * c * c
        acc += term
    return s * acc


def half_width(s: float, n: int, alpha: float) -> float:
    """``h(n) = t_{1-alpha/2, n-1} * s / sqrt(n)``, the CI half-width on a mean of n rewards."""
    return t_quantile(n - 1, alpha) * s / math.sqrt(n)


def uncertainty_reduction(s: float, n: int, alpha: float) -> float:
    """``Delta(n) = h(n) - h(n+1)`` with ``s`` held fixed (needs n >= 2)."""
    return s * (t_quantile(n - 1, alpha) / math.sqrt(n) - t_quantile(n, alpha) / math.sqrt(n + 1))


def exploration_bonus(total: int, n: int, explore: float) -> float:
    """``phi = explore * sqrt(log(1 + T) / n)`` (UCB-style)."""
    return explore * math.sqrt(math.log1p(total) / n)


def priority(s: float, n: int, total: int, alpha: float, explore: float) -> float:
    """``Pi = Delta(n) + phi(T, n)``; infinite for n < 2 (no variance estimate yet)."""
    if n < 2:
        return math.inf
    return uncertainty_reduction(s, n, alpha) + exploration_bonus(total, n, explore)


def sample_std(xs: Sequence[float]) -> float:
    """Unbiased sample std (n-1); 0 for fewer than two values."""
    if len(xs) < 2:
        return 0.0
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


# ------------------------------------------------------------------ exemplar retrieval

_TOKEN = re.compile(r"\w+|[^\w\s]")


def similarity(a: str, b: str) -> float:
    """Jaccard index of the lower-cased word/symbol token sets ([RECON] stand-in for BM25).
    Example: '3+4=' and '5+4=' -> {3,+,4,=} vs {5,+,4,=}: 3 shared of 5 -> 0.6."""
    sa, sb = set(_TOKEN.findall(a.lower())), set(_TOKEN.findall(b.lower()))
    if not sa and not sb:
        return 0.0
    return len(sa & sb) / len(sa | sb)


def problem_text(prompt: Prompt) -> str:
    """What an exemplar shows as the problem: the last user message of a chat prompt, else text."""
    if prompt.messages:
        users = [m.get("content", "") for m in prompt.messages if m.get("role") == "user"]
        if users:
            return users[-1]
    return prompt.text


class Exemplar(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    problem: str = Field(description="Problem text as the model would see it.")
    solution: str = Field(description="A verified solution (the response that follows the problem).")


class XrpoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    n_init: int = Field(
        4, ge=2, description="Phase-0 rollouts per selected prompt (allocation.md §2.1: e.g. 4) [RECON]."
    )
    rounds: int = Field(
        2,
        ge=1,
        description="Allocation rounds after phase 0; each hands out ceil(left / rounds_left) "
        "rollouts by priority [RECON].",
    )
    max_per_prompt: int = Field(
        32, ge=1, description="n_max: most rollouts one prompt gets in a step (spec: e.g. 32) [RECON]."
    )
    alpha: float = Field(0.05, gt=0.0, lt=1.0, description="Significance of the Student-t interval t_{1-alpha/2, n-1}.")
    explore: float = Field(
        0.1,
        ge=0.0,
        description="lambda of the exploration bonus lambda*sqrt(log(1+T)/n) "
        "(paper value not recovered; 0.1 as in the grpo-composer sampler).",
    )
    icl: bool = Field(True, description="In-context seeding of prompts whose phase-0 rollouts all fail (k = 0).")
    icl_rollouts: int = Field(
        4, ge=1, description="Rollouts of the seeded prompt per zero-reward prompt (from the step budget) [RECON]."
    )
    icl_exemplars: int = Field(
        1, ge=1, description="m: solved exemplars prepended per seeded prompt (spec: 1-3) [RECON]."
    )
    icl_sources: list[Literal["own", "solved", "pool"]] = Field(
        default_factory=lambda: ["own", "solved", "pool"],
        description="Where exemplars come from: 'own' (this prompt's earlier correct responses, preferred), 'solved' "
        "(other prompts' correct responses, most similar first), 'pool' (icl_pool / icl_pool_path).",
    )
    icl_template: str = Field(
        "{problem}{solution}\n\n",
        description="How one exemplar is written before a text prompt "
        "(fields {problem}, {solution}); chat prompts get a user/assistant message pair instead.",
    )
    icl_max_chars: int = Field(4000, ge=1, description="Exemplars whose rendered text is longer are skipped.")
    icl_pool: list[Exemplar] = Field(default_factory=list, description="Curated (problem, solution) exemplars.")
    icl_pool_path: str | None = Field(
        None, description='JSONL file of {"problem": ..., "solution": ...} exemplars (added to icl_pool).'
    )
    icl_store_per_prompt: int = Field(2, ge=1, description="Most recent correct responses kept per prompt for seeding.")
    icl_store_max_prompts: int = Field(
        10000,
        ge=1,
        description="Prompts kept in the exemplar store (least recently "
        "updated dropped first); bounds checkpoint size.",
    )

    @field_validator("icl_template")
    @classmethod
    def _template(cls, v: str) -> str:
        return exemplar_template(v, "icl_template")


def read_pool(path: str) -> list[Exemplar]:
    p = Path(path)
    if not p.exists():
        raise UserError(f"control.options.icl_pool_path: no such file {path!r}")
    out = []
    for i, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(Exemplar.model_validate(json.loads(line)))
        except Exception as e:  # noqa: BLE001 - report the file position
            raise UserError(f'{path}:{i}: not a {{"problem", "solution"}} object: {e}') from None
    return out


class ExemplarStore:
    """Correct responses per prompt, most recent last, bounded (see the module docstring)."""

    def __init__(self, per_prompt: int, max_prompts: int):
        self.per_prompt, self.max_prompts = per_prompt, max_prompts
        self.items: OrderedDict[str, dict] = OrderedDict()  # id -> {"problem": str, "solutions": [str]}

    def add(self, prompt_id: str, problem: str, solution: str) -> None:
        e = self.items.pop(prompt_id, None) or {"problem": problem, "solutions": []}
        sols = [s for s in e["solutions"] if s != solution] + [solution]
        e["solutions"] = sols[-self.per_prompt :]
        self.items[prompt_id] = e  # most recently updated last
        while len(self.items) > self.max_prompts:
            self.items.popitem(last=False)

    def state_dict(self) -> dict:
        return {"items": [[k, v["problem"], list(v["solutions"])] for k, v in self.items.items()]}

    def load_state_dict(self, s: dict) -> None:
        self.items = OrderedDict((k, {"problem": p, "solutions": list(sols)}) for k, p, sols in s["items"])


def retrieve(
    prompt: Prompt,
    store: ExemplarStore,
    pool: Sequence[Exemplar],
    sources: Sequence[str],
    m: int,
    render,
    max_chars: int,
) -> list[Exemplar]:
    """Up to ``m`` exemplars for ``prompt``: its own solutions first (most recent first), then other
    solved prompts and pool entries by decreasing similarity (ties: store/pool order)."""
    x = problem_text(prompt)
    ranked: list[tuple[float, int, Exemplar]] = []
    if "own" in sources and prompt.id in store.items:
        e = store.items[prompt.id]
        ranked += [(2.0, i, Exemplar(problem=e["problem"], solution=s)) for i, s in enumerate(reversed(e["solutions"]))]
    order = len(ranked)
    if "solved" in sources:
        for pid, e in store.items.items():
            if pid != prompt.id and e["solutions"]:
                ranked.append(
                    (similarity(x, e["problem"]), order, Exemplar(problem=e["problem"], solution=e["solutions"][-1]))
                )
                order += 1
    if "pool" in sources:
        for ex in pool:
            ranked.append((similarity(x, ex.problem), order, ex))
            order += 1
    ranked.sort(key=lambda t: (-t[0], t[1]))
    out = []
    for _, _, ex in ranked:
        if len(render(ex)) <= max_chars:
            out.append(ex)
        if len(out) == m:
            break
    return out


def exemplar_template(v: str, name: str) -> str:
    """An option's template of one exemplar: it may use only ``{problem}`` and ``{solution}``
    (also Cog-Rethinker's ``demo_template``)."""
    try:
        v.format(problem="", solution="")
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(f"{name} may only use the fields {{problem}} and {{solution}}: {e}") from None
    return v


def seeded_prompt(prompt: Prompt, exemplars: Sequence[Exemplar], template: str) -> Prompt:
    """The prompt with the exemplars prepended; a new id, so codec caching and group merging
    keep it apart from the original (see the module docstring)."""
    key = hashlib.sha1(json.dumps([[e.problem, e.solution] for e in exemplars]).encode()).hexdigest()[:12]
    shots = "".join(template.format(problem=e.problem, solution=e.solution) for e in exemplars)
    messages = None
    if prompt.messages:
        msgs = list(prompt.messages)
        head = 0
        while head < len(msgs) and msgs[head].get("role") == "system":
            head += 1
        pairs = [
            m
            for e in exemplars
            for m in ({"role": "user", "content": e.problem}, {"role": "assistant", "content": e.solution})
        ]
        messages = tuple(msgs[:head] + pairs + msgs[head:])
    return Prompt(
        id=f"{prompt.id}#icl-{key}",
        task=prompt.task,
        text=shots + prompt.text,
        answer=prompt.answer,
        messages=messages,
        metadata={**prompt.metadata, "icl_of": prompt.id, "icl_exemplars": len(exemplars)},
    )


# ------------------------------------------------------------------ controller


class Xrpo(SourceController):
    Options = XrpoOptions
    compat = Compat(keeps_plan_state=True)  # plan() replaces the round context (ids, allocation) that next_round reads

    def __init__(self, prompts: Sequence[Prompt], cfg, options: XrpoOptions | None, seed: int):
        self.cfg = cfg
        self.opts = options or XrpoOptions()
        self.source = PromptSource(prompts, seed, cfg, cfg.prompts_per_step * cfg.rollouts_per_prompt)
        self.store = ExemplarStore(self.opts.icl_store_per_prompt, self.opts.icl_store_max_prompts)
        self.pool = list(self.opts.icl_pool) + (read_pool(self.opts.icl_pool_path) if self.opts.icl_pool_path else [])
        self.by_id = {p.id: p for p in prompts}
        self.ctx = self._empty_ctx()
        self.metrics: dict[str, float] = {}

    @staticmethod
    def _empty_ctx() -> dict:
        # ids: the prompts of the current plan; alloc: rollouts requested per prompt id (seeded ids
        # included); seeded: original id -> seeded Prompt; round: allocation rounds done.
        return {"ids": [], "alloc": {}, "seeded": {}, "round": 0}

    @property
    def budget(self) -> int:
        """Most rollouts per step (``budget_rollouts`` or ``prompts_per_step * rollouts_per_prompt``)."""
        return self.step_budget.rollouts

    def _left(self, groups: list[Group]) -> int:
        """Rollouts the step budget still allows, counting this plan's groups (seeded ones included)."""
        mine = [g for g in groups if g.prompt.id in self.ctx["alloc"]]
        left = self.source.remaining(mine)
        return self.budget - sum(self.ctx["alloc"].values()) if left is None else left

    def _render(self, ex: Exemplar) -> str:
        return self.opts.icl_template.format(problem=ex.problem, solution=ex.solution)

    # -------------------------------------------------------------- protocol
    def select(self, state) -> list[Prompt]:
        return self.stream.take(self.cfg.prompts_per_step)

    def plan(self, prompts: list[Prompt], state) -> Plan:
        """Phase 0: ``n_init`` rollouts for each prompt (a new round context, full budget)."""
        self.ctx = self._empty_ctx()
        unique = list({p.id: p for p in prompts}.values())  # a prompt drawn twice (epoch wrap) is one group
        n0 = min(self.opts.n_init, self.opts.max_per_prompt)
        plan = self.source.cap([Request(p, n0) for p in unique])
        for p in unique:
            self.by_id.setdefault(p.id, p)
            self.ctx["ids"].append(p.id)
            self.ctx["alloc"][p.id] = 0
        for r in plan.requests:
            self.ctx["alloc"][r.prompt.id] += r.n
        return plan

    def next_round(self, groups: list[Group], state) -> Plan:
        ctx, o = self.ctx, self.opts
        left = self._left(groups)
        if left <= 0 or ctx["round"] >= o.rounds or not ctx["ids"]:
            return Plan()
        by_id = {g.prompt.id: g for g in groups}
        rewards = {pid: (by_id[pid].verified_rewards() if pid in by_id else []) for pid in ctx["ids"]}
        requests: list[Request] = []
        if ctx["round"] == 0 and o.icl:
            for pid in ctx["ids"]:
                if left <= 0:
                    break
                rs = rewards[pid]
                if not rs or any(r >= 0.5 for r in rs):
                    continue
                ex = retrieve(
                    self.by_id[pid],
                    self.store,
                    self.pool,
                    o.icl_sources,
                    o.icl_exemplars,
                    self._render,
                    o.icl_max_chars,
                )
                if not ex:
                    continue
                sp = seeded_prompt(self.by_id[pid], ex, o.icl_template)
                n = min(o.icl_rollouts, left, o.max_per_prompt)
                requests.append(Request(sp, n))
                ctx["seeded"][pid] = sp
                ctx["alloc"][sp.id] = ctx["alloc"].get(sp.id, 0) + n
                left -= n
        share = math.ceil(left / (o.rounds - ctx["round"])) if left > 0 else 0
        extra = self.allocate(rewards, share) if share else {}
        for pid in ctx["ids"]:
            if extra.get(pid):
                requests.append(Request(self.by_id[pid], extra[pid]))
                ctx["alloc"][pid] += extra[pid]
        ctx["round"] += 1
        return Plan(tuple(requests))  # their total never exceeds ``left``

    def allocate(self, rewards: dict[str, list[float]], amount: int) -> dict[str, int]:
        """Hand out ``amount`` rollouts one at a time to the highest-priority prompt (seeded prompts
        and prompts at ``max_per_prompt`` excluded); ties go to the earlier prompt of the plan."""
        ctx, o = self.ctx, self.opts
        total = sum(ctx["alloc"].values())  # T, frozen for the round [RECON]
        heap, extra = [], {}
        stats = {}
        for order, pid in enumerate(ctx["ids"]):
            if pid in ctx["seeded"] or ctx["alloc"][pid] >= o.max_per_prompt:
                continue
            stats[pid] = (sample_std(rewards[pid]), len(rewards[pid]))
            s, n = stats[pid]
            heapq.heappush(heap, (-priority(s, n, total, o.alpha, o.explore), order, pid))
        while amount > 0 and heap:
            _, order, pid = heapq.heappop(heap)
            extra[pid] = extra.get(pid, 0) + 1
            amount -= 1
            if ctx["alloc"][pid] + extra[pid] < o.max_per_prompt:
                s, n = stats[pid]
                n_now = n + extra[pid]
                heapq.heappush(heap, (-priority(s, n_now, total, o.alpha, o.explore), order, pid))
        return extra

    def observe(self, groups: list[Group], state) -> None:
        plain = [g for g in groups if "icl_of" not in g.prompt.metadata]
        self.source.record(plain, state.step)
        for g in groups:
            orig_id = g.prompt.metadata.get("icl_of", g.prompt.id)
            orig = self.by_id.get(orig_id, g.prompt)
            for r in g.rollouts:
                if r.reward is not None and r.reward >= 0.5 and r.text:
                    self.store.add(orig_id, problem_text(orig), r.text)
        seeded = [g for g in groups if "icl_of" in g.prompt.metadata]
        self.metrics = {
            "control/xrpo_icl_seeded": float(len(seeded)),
            "control/xrpo_icl_solved": float(sum(any((x or 0) >= 0.5 for x in g.rewards()) for g in seeded)),
            "control/xrpo_rounds": float(self.ctx["round"]),
        }
        self.ctx = self._empty_ctx()

    # -------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        ctx = self.ctx  # empty between steps (observe clears it), where checkpoints are taken
        return {
            **self.source.state_dict(),
            "store": self.store.state_dict(),
            "ctx": {
                "ids": list(ctx["ids"]),
                "alloc": dict(ctx["alloc"]),
                "round": ctx["round"],
                "seeded": dict(ctx["seeded"]),
            },
        }

    def load_state_dict(self, s: dict) -> None:
        self.source.load_state_dict(s)
        self.store.load_state_dict(s["store"])
        c = s["ctx"]
        self.ctx = {"ids": list(c["ids"]), "alloc": dict(c["alloc"]), "round": c["round"], "seeded": dict(c["seeded"])}
