"""``r3l``: R³L's retry-from-the-pivot rounds with pivotal credit (pivot masking).

Paper: "Reflect-then-Retry Reinforcement Learning with Language-Guided Exploration, Pivotal
Credit, and Positive Amplification" (R³L), arXiv 2601.03715; code shiweijiezero/R3L
(``R3L_workflow.py``, ``alfworld/utils.py::second_rollout``); guidance.md §7a.1. Use it with
``advantage.name = "r3l"`` (Positive Amplification) and ``objective.name = "opmd"`` (the code's
loss), as ``configs/r3l_retry.toml`` does.

Per step, for each of ``prompts_per_step`` prompts (drawn as ``uniform`` does), with
``N = rollouts_per_prompt``:

1. round 1: ``n_base`` base rollouts (code: N/2);
2. a *reflector* looks at each failed base rollout (reward below ``success_at``) and names the
   pivot step k (0-based) where it went wrong, or nothing (no retry: a "perfect" or invalid
   reflection, as the code drops those);
3. round 2: one retry per reflected failure (at most ``N - n_base`` per prompt, first failures
   first): the policy continues the base rollout's own tokens *before* step k (``Request.prefix``
   with the base's log-probs and versions), as the code's agentic path replays the first k turns;
   k = 0 retries from scratch;
4. pivotal credit: before training (``finish_batch``) the shared pre-pivot tokens get
   ``Rollout.loss_mask`` 0 in **both** the retry and its base rollout, so only the diverging
   suffixes get gradient; k = 0 masks nothing. Base and retries share the prompt's group.

Deviations (stated in docs/strategies.md):

- no language reflection and no guidance. The paper's reflection is the policy itself writing a
  JSON critique (summary, root cause, principle, ``retry_from_step``) and the retry is generated
  *with* that guidance and trained without it (context distillation). A tiny model cannot write
  one, so the reflector is pluggable: ``"rule"`` (default) is the FAPO rule detector's first false
  equation (:func:`rollwise.flaws.first_false_equation`), which sees the working of the
  built-in arithmetic task with ``cot = true``; ``"package.module:attr"`` is any callable
  ``(prompt, completion_text) -> int | None``. Retries are therefore plain on-policy
  continuations (the code applies no importance correction to its off-policy retries either);
- steps are the pieces between ``,`` ``;`` and newlines (the built-in traces' separators) and
  the pivot prefix is cut at the last token boundary inside the pre-pivot text;
- the auxiliary SFT data (learn-to-reflect, learn-to-retry singletons) are not built.

Metrics: ``control/r3l_retries``, ``control/r3l_retry_success_frac``, ``control/r3l_pivot_mean``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rollwise.control.uniform import Uniform
from rollwise.flaws import first_false_equation
from rollwise.registry import Compat, Registry, UserError
from rollwise.types import Group, Plan, Prompt, Request, Rollout

REFLECTORS = Registry("reflector")
REFLECTORS.register("rule", first_false_equation)
_STEP_END = re.compile(r"[,;\n]")


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    n_base: int | None = Field(
        None,
        ge=1,
        description="Base rollouts per prompt (default rollouts_per_prompt // 2, the code's N/2); "
        "up to rollouts_per_prompt - n_base retries.",
    )
    reflector: str = Field(
        "rule",
        description="Pivot finder: 'rule' (first false equation in the working) or 'package.module:attr', "
        "a callable (prompt, completion) -> pivot step index >= 0, or None / -1 for no retry.",
    )
    success_at: float = Field(1.0, description="A base rollout with reward >= this is a success and is not retried.")

    @field_validator("reflector")
    @classmethod
    def _known(cls, v: str) -> str:
        REFLECTORS.resolve(v)
        return v


def pivot_offset(text: str, k: int) -> int | None:
    """Character offset where step ``k`` starts (steps end at ``,`` ``;`` or a newline), or None when
    the text has fewer than k + 1 steps. Example: ``pivot_offset("7+5+0=12,4+8+1=14,=132", 1)`` -> 9."""
    if k == 0:
        return 0
    ends = [m.end() for m in _STEP_END.finditer(text)]
    return ends[k - 1] if k - 1 < len(ends) else None


def token_cut(ids: Sequence[int], decode, offset: int, text: str) -> int:
    """The most tokens of ``ids`` whose decoded text is a prefix of ``text[:offset]``."""
    best = 0
    for j in range(1, len(ids) + 1):
        piece = decode(tuple(ids[:j]))
        if len(piece) > offset or not text.startswith(piece):
            break
        best = j
    return best


class R3L(Uniform):
    Options = Options
    # finish_batch gives the pivot tokens their credit; retries continue prefixes of its own rollouts
    compat = Compat(batch_statistics=True, dynamic_sampling=False, continues_prefixes=True)

    def __init__(self, prompts: Sequence[Prompt], cfg, options: Options | None, seed: int):
        super().__init__(prompts, cfg, options, seed)
        self.opts = options or Options()
        self.n_base = self.opts.n_base or max(1, cfg.rollouts_per_prompt // 2)
        self.max_retries = cfg.rollouts_per_prompt - self.n_base
        if self.max_retries < 1:
            raise UserError(
                f"control.options.n_base ({self.n_base}) leaves no retries: it must be below "
                f"control.rollouts_per_prompt ({cfg.rollouts_per_prompt})"
            )
        self.reflect = REFLECTORS.get(self.opts.reflector)
        self.codec = None
        self._round = 0
        # prompt id -> (number of base rollouts, [(base index, shared prefix)] in retry order)
        self._retries: dict[str, tuple[int, list[tuple[int, tuple[int, ...]]]]] = {}
        self.metrics: dict[str, float] = {}

    def bind(self, services) -> None:
        self.codec = services.codec

    def plan(self, prompts: list[Prompt], state) -> Plan:
        self._round, self._retries = 0, {}
        return self.source.cap([Request(p, self.n_base) for p in prompts])

    def next_round(self, groups: list[Group], state) -> Plan:
        self._round += 1
        if self._round > 1:
            return Plan()
        if self.codec is None:
            raise RuntimeError("R3L.bind(services) was not called (the assembler binds it)")
        requests, entries = (
            [],
            [],
        )  # entries[i]: (prompt id, base count, base index, shared prefix, pivot) of requests[i]
        for g in groups:
            n_todo = 0
            for i, r in enumerate(g.rollouts):
                if n_todo >= self.max_retries:
                    break
                if r.reward is None or r.reward >= self.opts.success_at:
                    continue
                k = self.reflect(g.prompt, r.text)
                if k is None or isinstance(k, bool) or not isinstance(k, int) or k < 0:
                    continue  # invalid or "perfect" reflection: no retry
                offset = pivot_offset(r.text, k)
                if offset is None:
                    continue  # the pivot lies beyond the last step (the code rejects out-of-range pivots)
                j = token_cut(r.completion_ids, self.codec.decode, offset, r.text)
                prefix = tuple(r.completion_ids[:j])
                n_todo += 1
                entries.append((g.prompt.id, len(g.rollouts), i, prefix, k))
                if j == 0:
                    requests.append(Request(g.prompt, 1))
                else:
                    versions = r.token_versions or (r.policy_version,) * len(r.completion_ids)
                    requests.append(
                        Request(
                            g.prompt,
                            1,
                            prefix=prefix,
                            prefix_logprobs=tuple(r.logprobs[:j]),
                            prefix_versions=tuple(versions[:j]),
                        )
                    )
        # the base round's groups count against the step budget; cap_plan trims the last requests first
        plan = self.source.cap(requests, groups)
        for pid, n_base, i, prefix, _ in entries[: plan.total]:
            self._retries.setdefault(pid, (n_base, []))[1].append((i, prefix))
        pivots = [e[4] for e in entries[: plan.total]]
        self.metrics = {
            "control/r3l_retries": float(plan.total),
            "control/r3l_pivot_mean": sum(pivots) / len(pivots) if pivots else 0.0,
        }
        return plan

    def finish_batch(self, groups: list[Group], kept: list[Group], dropped) -> list[Group]:
        """Pivot masking: the shared pre-pivot tokens of each retry and of its base rollout leave the loss."""
        wins, total = 0, 0
        out = []
        for g in kept:
            entry = self._retries.get(g.prompt.id)
            if not entry:
                out.append(g)
                continue
            n_base, todo = entry
            rows = list(g.rollouts)  # merge_groups appends the retries after the base rollouts, in request order
            for (base_i, prefix), retry_i in zip(todo, range(n_base, len(rows))):
                total += 1
                wins += int((rows[retry_i].reward or 0.0) >= self.opts.success_at)
                if prefix:
                    rows[base_i] = _mask_prefix(rows[base_i], len(prefix))
                    rows[retry_i] = _mask_prefix(rows[retry_i], len(prefix))
            out.append(Group(g.prompt, tuple(rows)))
        self.metrics["control/r3l_retry_success_frac"] = wins / total if total else 0.0
        return out


def _mask_prefix(r: Rollout, j: int) -> Rollout:
    """``r`` with its first ``j`` completion tokens out of the loss (on top of any mask it has)."""
    base = r.loss_mask or (1,) * len(r.completion_ids)
    return dataclasses.replace(r, loss_mask=tuple(0 if t < j else m for t, m in enumerate(base)))
