"""``spec_rl``: SPEC-RL speculative rollouts that reuse the previous epoch's responses.

Paper: Liu et al. 2025, "SPEC-RL: Accelerating On-Policy Reinforcement Learning via Speculative
Rollouts", arXiv 2509.23232; docs/specs/systems.md §5. Works behind any controller; reuse happens when
a prompt comes back (the next epoch of ``uniform``'s stream).

With ``replay.name = "spec_rl"`` the loop's worker pool is wrapped (``wrap_pool``, called by
``session.Run``):

1. **Cache.** Every group the pool generates replaces its prompt's entry in the cache: the
   response ids, their behaviour log-probs ``p_old`` (``Rollout.logprobs``) and finish reason.
2. **Verify.** When a request for a cached prompt comes, its rows are matched to the cached
   responses of *that prompt* (row j of the request <- cached response j; extra rows generate
   normally). One batched forward pass of the current policy (``backend.score``: the trainer's
   weights, under the sampling distribution) gives ``p_new`` of every draft token.
3. **Accept** with lenience ``l = exp(bias)``: token i is accepted iff ``log u_i <= log p_new_i -
   log p_old_i + bias`` (i.e. ``u_i <= min(1, l p_new / p_old)``), and, with ``min_prob`` tau set,
   ``p_new_i >= tau``. The cut n is the first rejected position (``first_rejection``).
4. **Continue.** Rows with n = L (the whole draft accepted) generate nothing and keep the draft's
   finish. Other rows keep ``y_<n`` and are continued by the backend from ``[prompt | y_<n]``
   with budget ``max_new_tokens - n`` (one batched call together with the unmatched rows). The
   token at n is sampled by the engine from ``pi_t`` (the paper), or, with ``residual = true``,
   from the residual ``max(0, q - min(p, l q))`` renormalised (exact speculative sampling; exact
   at ``bias = 0``: ``speculative_distribution``).
5. Accepted prefix tokens are treated as on-policy (the paper): their stored log-probs are
   ``p_new`` and their version is the current one. The loss is unchanged. A request that already
   continues a prefix (``Request.prefix``) is not drafted; its prefix keeps the request's own
   log-probs and per-token versions (``prefix_versions``).

Not combined with LATR: ``sampling.latr.enabled`` is refused at config load (``rollwise.compat.check_wrappers``),
since this pool generates through the backend directly and would silently drop the tree.

Bias (systems.md §5 property 3, tests/unit/generate/test_spec_rl.py): for one token drawn from
p and verified against q, the paper's rule yields ``min(p, l q) + (1 - beta) q`` with
``beta = sum min(p, l q)``, which is not q unless p = q, even at l = 1; the residual mode yields
exactly q at l = 1.

Costs: ``cost/generated_tokens`` counts only tokens the backend samples (plus residual-sampled
tokens); ``cost/reused_tokens`` the accepted draft tokens; ``cost/verify_tokens`` the draft
tokens scored by the verification pass (plus, in residual mode, the tokens re-scored to cache full
distributions); the verification time is part of ``time/generate_s`` (it is rollout-stage work).
Every row counts in ``cost/rollouts`` and is verified again (``cost/verifier_calls``). Per-step
metrics: ``spec_rl/drafted_rows``, ``spec_rl/full_accept_rows``, ``spec_rl/accepted_token_frac`` (accepted
/ drafted tokens) and ``spec_rl/mean_cut`` (mean accepted prefix length of drafted rows).

Differences from the paper's code: ``p_old`` is the log-prob under which the cached response was
produced (the sampler's ``mu`` for generated tokens, ``p_new`` of the step for accepted ones)
rather than the trainer's recompute of the previous epoch; the cache is keyed by prompt id, so
the epoch order may be reshuffled (the code needs ``shuffle = False`` and buckets by step); the
uniforms u come from a seeded generator that advances and is checkpointed (the code reseeds 1234
on every call); ``residual`` mode is ours (the spec's suggested exact variant) and caches the full
per-position sampling distribution of every cached token (memory: tokens x vocabulary x 4 bytes,
meant for small vocabularies), computed by an extra scoring pass with the generating weights.
The random-reuse ablation baselines are not implemented. Rounds that continue a prefix go to
the backend unchanged.

State (checkpointed): the cache and the generator.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from pydantic import BaseModel, ConfigDict, Field

from rollwise.generate.common import merge_groups
from rollwise.registry import Compat
from rollwise.types import Completion, Group, Plan, ReplaySource, Request


class SpeculativeOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    bias: float = Field(
        0.5,
        description="log of the lenience l (the code's spec_bias): accept a draft token iff "
        "u <= min(1, e^bias p_new / p_old). 0 = the plain rule; the paper's defaults 0.5 (GRPO), 0.3 (PPO), "
        "0.15 (DAPO); inf = accept every draft (full reuse); -inf = regenerate everything.",
    )
    residual: bool = Field(
        False,
        description="Exact speculative sampling: sample the token at the first rejection from "
        "the residual max(0, q - min(p, l q)) instead of regenerating it from q (exact at bias 0; caches "
        "full distributions).",
    )
    min_prob: float | None = Field(
        None,
        gt=0.0,
        le=1.0,
        description="Optional absolute threshold tau: a draft token "
        "is also rejected when p_new < tau (off by default, as in the code).",
    )


@dataclass(frozen=True)
class Draft:
    """A cached response: ids, their log-probs p_old, finish, and (residual mode) the full
    (L, V) log-prob distributions of the policy that produced each position."""

    ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish: str
    dists: torch.Tensor | None = None


def first_rejection(
    lp_new: Sequence[float],
    lp_old: Sequence[float],
    log_u: Sequence[float],
    bias: float,
    min_logprob: float | None = None,
) -> int:
    """Number of accepted leading draft tokens (the cut n, 0-based; L when all are accepted):
    token i is accepted iff ``log_u[i] <= lp_new[i] - lp_old[i] + bias`` (and ``lp_new[i] >=
    min_logprob``). Example: lp_new = lp_old, bias 0: every log u <= 0 -> n = L."""
    for i, (a, b, lu) in enumerate(zip(lp_new, lp_old, log_u)):
        if bias == -math.inf or not lu <= a - b + bias or (min_logprob is not None and a < min_logprob):
            return i
    return len(lp_new)


def residual_distribution(p: torch.Tensor, q: torch.Tensor, bias: float = 0.0) -> torch.Tensor:
    """``max(0, q - min(p, l q))`` normalised (probabilities over the vocabulary, last dim), the
    distribution to resample from after a rejection; q itself where the residual has no mass."""
    lenience = math.exp(bias) if bias < math.inf else math.inf
    accepted = torch.minimum(p, q * lenience) if lenience < math.inf else p
    r = (q - accepted).clamp(min=0)
    z = r.sum(dim=-1, keepdim=True)
    return torch.where(z > 0, r / z.clamp(min=1e-30), q)


def speculative_distribution(
    p: torch.Tensor, q: torch.Tensor, bias: float = 0.0, residual: bool = False
) -> torch.Tensor:
    """Distribution of one token drafted from p and verified against q: accepted with probability
    ``min(1, l q / p)``; on rejection resampled from q (SPEC-RL) or from the residual. SPEC-RL gives
    ``min(p, l q) + (1 - beta) q`` with ``beta = sum min(p, l q)``: e.g. p = (0.8, 0.2),
    q = (0.5, 0.5), l = 1 -> (0.5, 0.2) + 0.3 (0.5, 0.5) = (0.65, 0.35) != q; residual -> q."""
    lenience = math.exp(bias) if bias < math.inf else math.inf
    accepted = torch.minimum(p, q * lenience) if lenience < math.inf else p
    rejected = 1.0 - accepted.sum(dim=-1, keepdim=True)
    return accepted + rejected * (residual_distribution(p, q, bias) if residual else q)


class SpeculativeRollouts(ReplaySource):
    """SPEC-RL (arXiv 2509.23232): verify last epoch's responses, keep the accepted prefix."""

    schedules_generation = True  # wrap_pool owns generation (rollwise.types.ReplaySource)

    Options = SpeculativeOptions
    compat = Compat(
        needs_decode_hooks=True, owns_generation=True
    )  # wraps the pool in the trainer's process (wrap_pool)

    def __init__(self, cfg, options: SpeculativeOptions | None, seed: int):
        self.opts = options if options is not None else self.Options()
        self.cache: dict[str, list[Draft]] = {}
        self.generator = torch.Generator().manual_seed(10_007 + seed)

    # ------------------------------------------------------------ replay protocol (on-policy mix)
    def add(self, groups: list[Group]) -> None:
        pass

    def mix(self, fresh: list[Group], state) -> list[Group]:
        return list(fresh)

    def state_dict(self) -> dict:
        return {"cache": {k: list(v) for k, v in self.cache.items()}, "generator": self.generator.get_state()}

    def load_state_dict(self, s: dict) -> None:
        self.cache = {k: list(v) for k, v in s["cache"].items()}
        self.generator.set_state(s["generator"])

    def wrap_pool(self, pool, controller=None, state: Callable | None = None) -> SpeculativePool:
        return SpeculativePool(pool, self)


class SpeculativePool:
    """The loop's worker pool with SPEC-RL reuse (module docstring); ``rollouts`` (evaluation),
    ``take_cost`` and the rest are the wrapped pool's."""

    def __init__(self, inner, spec: SpeculativeRollouts):
        self.inner, self.spec = inner, spec

    def __getattr__(self, name):
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def generate(self, plan: Plan, groups: list[Group], version: int) -> list[Group]:
        pool, opts, spec = self.inner, self.spec.opts, self.spec
        sampling, budget = pool.sampling, pool.sampling.max_new_tokens
        size = {g.prompt.id: g.size for g in groups}
        t0 = time.perf_counter()
        # rows: (request, pids, prefix ids, prefix log-probs, finished completion or None)
        drafted, rows, keys = [], [], []  # keys: (request index, row index) orders each group's rows
        for qi, req in enumerate(plan.requests):
            if req.n <= 0:
                continue
            pids = pool.codec.encode_prompt(req.prompt)
            if req.prefix:
                rows += [(req, pids, tuple(req.prefix), tuple(req.prefix_logprobs or ()), None)] * req.n
                keys += [(qi, j) for j in range(req.n)]
                continue
            start = size.get(req.prompt.id, 0)
            drafts = spec.cache.get(req.prompt.id, [])[start : start + req.n]
            drafted += [(req, pids, d, (qi, j)) for j, d in enumerate(drafts)]
            rows += [(req, pids, (), (), None)] * (req.n - len(drafts))
            keys += [(qi, j) for j in range(len(drafts), req.n)]
        cost, m = pool.cost, pool.cost.metrics
        accepted_tokens = draft_tokens = full = 0
        cut_sum = 0
        if drafted:
            drafts = [(d.ids[:budget], d.logprobs[:budget], d.dists) for _, _, d, _ in drafted]
            seqs = [pids + ids for (_, pids, _, _), (ids, _, _) in zip(drafted, drafts)]
            starts = [len(pids) for _, pids, _, _ in drafted]
            scored = pool.backend.score(seqs, starts, sampling, full=opts.residual)
            cost.verify_tokens += sum(len(ids) for ids, _, _ in drafts)
            min_lp = math.log(opts.min_prob) if opts.min_prob is not None else None
            for (req, pids, d, key), (ids, lp_old, dists), s in zip(drafted, drafts, scored):
                keys.append(key)
                q = s if opts.residual else None
                lp_new = (
                    tuple(q.gather(1, torch.tensor(ids, dtype=torch.long)[:, None])[:, 0].tolist())
                    if opts.residual
                    else tuple(s)
                )
                log_u = torch.rand(len(ids), generator=spec.generator, dtype=torch.float64).log().tolist()
                n = first_rejection(lp_new, lp_old, log_u, opts.bias, min_lp)
                draft_tokens += len(ids)
                accepted_tokens += n
                cut_sum += n
                prefix, plp = ids[:n], lp_new[:n]
                if n == len(ids):
                    full += 1
                    finish = d.finish if len(d.ids) <= budget else "length"
                    rows.append((req, pids, (), (), (prefix, plp, finish)))
                    continue
                if opts.residual and dists is not None:  # exact: the token at n from the residual
                    r = residual_distribution(dists[n].float().exp(), q[n].exp(), opts.bias)
                    tok = int(torch.multinomial(r, 1, generator=spec.generator))
                    prefix, plp = prefix + (tok,), plp + (float(q[n, tok]),)
                    cost.generated_tokens += 1
                    if tok in pool.codec.eos_ids or len(prefix) >= budget:
                        rows.append(
                            (req, pids, (), (), (prefix, plp, "stop" if tok in pool.codec.eos_ids else "length"))
                        )
                        continue
                rows.append((req, pids, prefix, plp, None))
        cost.reused_tokens += accepted_tokens
        rows = [row for _, row in sorted(zip(keys, rows), key=lambda kr: kr[0])]
        # one backend call for the continuations and the undrafted rows
        todo = [i for i, r in enumerate(rows) if r[4] is None]
        seqs = [rows[i][1] + rows[i][2] for i in todo]
        limits = [max(0, budget - len(rows[i][2])) for i in todo]
        comps = pool.backend.generate(seqs, sampling, max_new_tokens=limits) if seqs else []
        done = {i: c for i, c in zip(todo, comps)}
        t1 = time.perf_counter()
        pairs, verdicts = [], []
        for i, (req, pids, prefix, plp, fixed) in enumerate(rows):
            if fixed is not None:  # fully accepted draft (or finished by the residual token)
                prefix, plp, c = fixed[0], fixed[1], Completion((), (), fixed[2])
            else:
                c = done[i]
            # a request's own prefix keeps its versions; accepted draft tokens are current (the paper)
            pv = tuple(req.prefix_versions or ()) if req.prefix else (version,) * len(prefix)
            r = pool.finish_rollout(Request(req.prompt, 1, prefix or None, plp or None, pv or None), pids, c, version)
            verdicts.append(r.verdict)
            pairs.append((req.prompt, r))
        t2 = time.perf_counter()
        cost.charge(sum(len(c.token_ids) for c in comps), len(rows), verdicts, t1 - t0, t2 - t1)
        merged = merge_groups(groups, pairs)
        touched = {p.id for p, _ in pairs}
        self._cache([g for g in merged if g.prompt.id in touched])
        cost.generate_s += time.perf_counter() - t2  # residual mode's scoring pass
        cost.count(**{"spec_rl/drafted_rows": len(drafted), "spec_rl/full_accept_rows": full})
        m["spec_rl/accepted_token_frac"] = accepted_tokens / draft_tokens if draft_tokens else 0.0
        m["spec_rl/mean_cut"] = cut_sum / len(drafted) if drafted else 0.0
        return merged

    def _cache(self, groups: list[Group]) -> None:
        """Replace each group's prompt entry by its responses (residual mode: with the full
        distributions of the current weights, which produced them, from one scoring pass)."""
        pool, spec = self.inner, self.spec
        dists: dict[tuple[int, int], torch.Tensor] = {}
        if spec.opts.residual:
            items = [(gi, ri, r) for gi, g in enumerate(groups) for ri, r in enumerate(g.rollouts) if r.completion_ids]
            if items:
                scored = pool.backend.score(
                    [r.prompt_ids + r.completion_ids for _, _, r in items],
                    [len(r.prompt_ids) for _, _, r in items],
                    pool.sampling,
                    full=True,
                )
                pool.cost.verify_tokens += sum(len(r.completion_ids) for _, _, r in items)
                dists = {(gi, ri): s for (gi, ri, _), s in zip(items, scored)}
        by_prompt: dict[str, list[Draft]] = defaultdict(list)
        for gi, g in enumerate(groups):
            for ri, r in enumerate(g.rollouts):
                by_prompt[g.prompt.id].append(Draft(r.completion_ids, r.logprobs, r.finish, dists.get((gi, ri))))
        spec.cache.update(by_prompt)
