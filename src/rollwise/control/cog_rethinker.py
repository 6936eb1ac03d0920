"""``cog_rethinker``: Cog-Rethinker's decomposition and refinement rollouts for zero-accuracy prompts,
whose correct outputs train the plain prompt through an auxiliary supervised term (controller half;
the advantage half is ``advantage.name = "cog_rethinker"``, :mod:`rollwise.objectives.cog_rethinker`).

Paper: "Hierarchical Metacognitive Reinforcement Learning for LLM Reasoning" (Cog-Rethinker),
arXiv 2510.15979; allocation.md §13. **Weak evidence**: the ICLR 2026 submission was withdrawn
(reviewer scores 2/6/2/4), no code was released, no effect sizes were recovered, and the reviews
note missing statistical tests and no SFT cold-start baseline. The algorithm's outline is the
paper's [PAPER]; every detail below is the spec's reconstruction or ours [RECON].

Per step, for each of ``prompts_per_step`` prompts (drawn as ``uniform`` does):

1. round 1, direct rollouts: ``rollouts_per_prompt`` samples of the plain prompt;
2. ``Z``: the prompts whose verified direct rollouts are all wrong (reward below ``success_at``);
   only they get the extra stages;
3. round 2, decomposition: for each prompt of ``Z``, ``decompose_rollouts`` samples of the prompt
   with ``decompose_prefix`` (the instruction to split the problem into sub-problems) and up to
   ``demonstrations`` retrieved demonstrations prepended. Demonstrations come from a dynamic buffer
   of solved prompts (correct direct rollouts of earlier steps and correct decompositions), retrieved
   by XRPO's exemplar store and similarity (:mod:`rollwise.control.xrpo`: Jaccard over word/symbol
   tokens, its stated stand-in for the paper's BM25);
4. round 3, refinement: for each decomposition still at zero, ``refine_rollouts`` samples of the
   prompt with the demonstrations, ``refine_prefix`` listing up to ``wrong_answers`` of its earlier
   wrong outputs (direct and decomposition), then the problem;
5. training (``finish_batch``): the direct groups train with the RL objective (DAPO's in
   ``configs/cog_rethinker.toml``). Each correct decomposition or refinement output (up to
   ``sft_per_prompt`` distinct ones per prompt) is **re-templated** to the plain prompt: a row with
   the plain prompt's token ids and the output's completion ids, marked
   ``Verdict.details["sft"] = True``. Its behaviour log-probs are re-scored with the current policy
   *under the plain prompt* (one no-grad forward, ``Services.policy_logprobs``), so the objective's
   ratio on those tokens is 1 at the update and the surrogate's gradient there is
   ``-A grad log pi``: the ``cog_rethinker`` advantage gives these rows ``A = lambda``
   (``sft_weight``), which makes their term ``lambda`` times the NLL gradient of the output under the
   plain prompt, ``L = L_RL + lambda L_SFT`` with both terms on the objective's token denominator.
   The decomposition and refinement groups themselves are not trained (the spec trains the direct
   rollouts with RL and the re-templated outputs with SFT only).

Properties (§13.3): only zero-accuracy prompts get a decomposition rollout; only those still at
zero get a refinement rollout; SFT rows always carry the plain prompt; with ``sft_weight = 0`` and
no zero-accuracy prompt the step is the base method's.

Budget: the extra rounds draw on the step budget, whose default here is
``prompts_per_step * (rollouts_per_prompt + decompose_rollouts + refine_rollouts)`` (the most a step
can use) unless ``control.budget_rollouts`` is set; their tokens are generated tokens like any other.
Deviations: the paper's decomposition demonstrations are (problem, decomposition, solution) triples;
ours are (problem, correct output) pairs, and the refinement's "successful rewrite" demonstrations
are the same buffer. With ``train.epochs > 1`` the later passes see the clipped surrogate, not the
plain NLL, on the SFT rows.

Metrics: ``control/cog_zero_prompts``, ``control/cog_decompose_rollouts``,
``control/cog_decompose_solved``, ``control/cog_refine_rollouts``, ``control/cog_refine_solved``,
``control/cog_sft_rows``.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from rollwise.collate import collate
from rollwise.control.budget import StepBudget
from rollwise.control.uniform import Uniform
from rollwise.control.xrpo import Exemplar, ExemplarStore, exemplar_template, problem_text, retrieve
from rollwise.registry import Compat, UserError
from rollwise.types import Advantages, Group, Plan, Prompt, Request, Rollout

DECOMPOSE, REFINE = "decompose", "refine"


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    decompose_rollouts: int = Field(
        4, ge=1, description="G': decomposition rollouts per zero-accuracy prompt (spec [RECON])."
    )
    refine_rollouts: int = Field(
        4, ge=0, description="Refinement rollouts per prompt still at zero after decomposition (0 = no refinement)."
    )
    demonstrations: int = Field(
        2, ge=0, description="Retrieved demonstrations (solved problem, correct output) prepended to each extra prompt."
    )
    decompose_prefix: str = Field(
        "Split into steps: ",
        description="Instruction written before the demonstrations of a decomposition prompt.",
    )
    refine_prefix: str = Field(
        "Wrong: {wrong}. ",
        description="Written before the problem of a refinement prompt; {wrong} is the earlier wrong outputs.",
    )
    wrong_answers: int = Field(2, ge=1, description="Earlier wrong outputs shown in a refinement prompt.")
    demo_template: str = Field(
        "{problem}{solution} ",
        description="How one demonstration is written (fields {problem}, {solution}); the defaults use no newline, "
        "which the built-in tiny model's character vocabulary lacks.",
    )
    max_prompt_chars: int = Field(
        4000, ge=1, description="Demonstrations are dropped (last first) while an extra prompt is longer than this."
    )
    sft_per_prompt: int = Field(
        2, ge=1, description="Most distinct correct outputs per prompt re-templated into SFT rows per step."
    )
    buffer_per_prompt: int = Field(2, ge=1, description="Correct outputs kept per solved prompt in the buffer.")
    buffer_max_prompts: int = Field(10000, ge=1, description="Solved prompts kept in the buffer (oldest dropped).")
    success_at: float = Field(1.0, description="A rollout with reward >= this is correct.")

    @field_validator("refine_prefix")
    @classmethod
    def _wrong_field(cls, v: str) -> str:
        try:
            v.format(wrong="")
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"refine_prefix may only use the field {{wrong}}: {e}") from None
        return v

    @field_validator("demo_template")
    @classmethod
    def _demo_fields(cls, v: str) -> str:
        return exemplar_template(v, "demo_template")


def stage_prompt(
    prompt: Prompt, stage: str, preamble: str, demos: Sequence[Exemplar], template: str, after: str = ""
) -> Prompt:
    """``prompt`` rewritten for an extra stage: ``preamble``, the demonstrations, ``after``, then the
    problem. A new id (the codec caches prompt ids by id and the pool merges groups by id);
    ``metadata["cog_of"]`` names the plain prompt. Chat prompts get the same text in their last user
    message. Example: stage_prompt(Prompt('a', 't', '2+2=', '4'), 'refine', '', [], '', 'Wrong: 5. ').text
    -> 'Wrong: 5. 2+2='."""
    shots = "".join(template.format(problem=e.problem, solution=e.solution) for e in demos)
    head = preamble + shots + after
    messages = None
    if prompt.messages:
        msgs = [dict(m) for m in prompt.messages]
        last = max((i for i, m in enumerate(msgs) if m.get("role") == "user"), default=None)
        if last is not None:
            msgs[last]["content"] = head + msgs[last].get("content", "")
        messages = tuple(msgs)
    text = head + prompt.text
    key = hashlib.sha1(text.encode()).hexdigest()[:12]
    return Prompt(
        id=f"{prompt.id}#cog-{stage}-{key}",
        task=prompt.task,
        text=text,
        answer=prompt.answer,
        messages=messages,
        metadata={**prompt.metadata, "cog_of": prompt.id, "cog_stage": stage},
    )


class CogRethinker(Uniform):
    Options = Options
    # finish_batch builds the SFT rows of the whole step; its advantage gives them lambda; the rounds
    # and the per-step stage context are set in plan and read by the same step's rounds and finish_batch
    compat = Compat(
        batch_statistics=True, pairs_with=("advantage", "cog_rethinker"), dynamic_sampling=False, keeps_plan_state=True
    )

    def __init__(self, prompts: Sequence[Prompt], cfg, options: Options | None, seed: int):
        super().__init__(prompts, cfg, options, seed)
        self.opts = options or Options()
        if cfg.budget_rollouts is not None and cfg.budget_rollouts <= cfg.prompts_per_step * cfg.rollouts_per_prompt:
            raise UserError(
                f"control.budget_rollouts ({cfg.budget_rollouts}) leaves no rollouts for cog_rethinker's extra stages: "
                f"it must exceed control.prompts_per_step * control.rollouts_per_prompt "
                f"({cfg.prompts_per_step * cfg.rollouts_per_prompt}), or be unset"
            )
        extra = self.opts.decompose_rollouts + self.opts.refine_rollouts
        self.step_budget = StepBudget.from_config(cfg, cfg.prompts_per_step * (cfg.rollouts_per_prompt + extra))
        self.buffer = ExemplarStore(self.opts.buffer_per_prompt, self.opts.buffer_max_prompts)
        self.services = None
        self._round = 0
        self._wrong: dict[str, list[str]] = {}  # plain prompt id -> its wrong outputs this step
        self._demos: dict[str, list[Exemplar]] = {}
        self.metrics: dict[str, float] = {}

    def bind(self, services) -> None:
        """The token codec (pad id) and the trainer's no-grad log-probs (re-scoring the SFT rows)."""
        self.services = services

    def plan(self, prompts: list[Prompt], state) -> Plan:
        self._round, self._wrong, self._demos = 0, {}, {}
        self.metrics = dict.fromkeys(
            (
                "control/cog_zero_prompts",
                "control/cog_decompose_rollouts",
                "control/cog_decompose_solved",
                "control/cog_refine_rollouts",
                "control/cog_refine_solved",
                "control/cog_sft_rows",
            ),
            0.0,
        )
        return super().plan(prompts, state)

    def _correct(self, r: Rollout) -> bool:
        return r.reward is not None and r.reward >= self.opts.success_at

    def _at_zero(self, g: Group) -> bool:
        scores = g.verified_rewards()
        return bool(scores) and all(s < self.opts.success_at for s in scores)

    def _fit(self, make, demos: list[Exemplar]) -> Prompt:
        """The stage prompt with as many of ``demos`` as fit ``max_prompt_chars`` (last dropped first)."""
        demos = list(demos)
        p = make(demos)
        while demos and len(p.text) > self.opts.max_prompt_chars:
            demos.pop()
            p = make(demos)
        return p

    def next_round(self, groups: list[Group], state) -> Plan:
        self._round += 1
        o = self.opts
        if self._round == 1:  # decomposition for the zero-accuracy direct groups
            requests = []
            for g in groups:
                if not self._at_zero(g):
                    continue
                self._wrong[g.prompt.id] = [r.text for r in g.rollouts if r.reward is not None]
                render = lambda e: o.demo_template.format(problem=e.problem, solution=e.solution)  # noqa: E731
                demos = (
                    retrieve(g.prompt, self.buffer, (), ("own", "solved"), o.demonstrations, render, o.max_prompt_chars)
                    if o.demonstrations
                    else []
                )
                self._demos[g.prompt.id] = demos
                p = self._fit(
                    lambda d, g=g: stage_prompt(g.prompt, DECOMPOSE, o.decompose_prefix, d, o.demo_template), demos
                )
                requests.append(Request(p, o.decompose_rollouts))
            plan = self.source.cap(requests, groups)
            self.metrics["control/cog_zero_prompts"] = float(len(requests))
            self.metrics["control/cog_decompose_rollouts"] = float(plan.total)
            return plan
        if self._round == 2 and o.refine_rollouts:  # refinement for the decompositions still at zero
            requests = []
            plain = {g.prompt.id: g.prompt for g in groups if "cog_of" not in g.prompt.metadata}
            for g in groups:
                if g.prompt.metadata.get("cog_stage") != DECOMPOSE:
                    continue
                pid = g.prompt.metadata["cog_of"]
                if not self._at_zero(g):
                    self.metrics["control/cog_decompose_solved"] += 1.0
                    continue
                wrong = (self._wrong.get(pid, []) + [r.text for r in g.rollouts if r.reward is not None])[
                    : o.wrong_answers
                ]
                after = o.refine_prefix.format(wrong=" | ".join(wrong))
                p = self._fit(
                    lambda d, pid=pid, after=after: stage_prompt(plain[pid], REFINE, "", d, o.demo_template, after),
                    self._demos.get(pid, []),
                )
                requests.append(Request(p, o.refine_rollouts))
            plan = self.source.cap(requests, groups)
            self.metrics["control/cog_refine_rollouts"] = float(plan.total)
            return plan
        if self._round == 2:
            self.metrics["control/cog_decompose_solved"] = float(
                sum(1 for g in groups if g.prompt.metadata.get("cog_stage") == DECOMPOSE and not self._at_zero(g))
            )
        return Plan()

    def finish_batch(self, groups: list[Group], kept: list[Group], dropped) -> list[Group]:
        """The kept direct groups, with each zero-accuracy prompt's correct extra-stage outputs added
        as SFT rows under its plain prompt (module docstring, step 5); the stage groups leave."""
        plain = {g.prompt.id: g for g in groups if "cog_of" not in g.prompt.metadata}
        sft: dict[str, list[Rollout]] = {}
        for g in groups:
            stage, pid = g.prompt.metadata.get("cog_stage"), g.prompt.metadata.get("cog_of")
            if stage is None or pid not in plain:
                continue
            if stage == REFINE and not self._at_zero(g):
                self.metrics["control/cog_refine_solved"] += 1.0
            rows = sft.setdefault(pid, [])
            for r in g.rollouts:
                if not self._correct(r) or len(rows) >= self.opts.sft_per_prompt:
                    continue
                if any(s.completion_ids == r.completion_ids for s in rows):
                    continue
                rows.append(retemplate(r, plain[pid], stage))
        flat = [r for rows in sft.values() for r in rows]
        if flat:
            flat = iter(self._rescored(flat))
            sft = {pid: [next(flat) for _ in rows] for pid, rows in sft.items()}
        self.metrics["control/cog_sft_rows"] = float(sum(len(v) for v in sft.values()))
        out = []
        for g in kept:
            if "cog_of" in g.prompt.metadata:
                continue
            out.append(Group(g.prompt, g.rollouts + tuple(sft.pop(g.prompt.id, ()))))
        out += [Group(plain[pid].prompt, tuple(rows)) for pid, rows in sft.items() if rows]
        return out

    def _rescored(self, rows: list[Rollout]) -> list[Rollout]:
        """``rows`` with their behaviour log-probs set to the current policy's under the plain prompt."""
        if self.services is None or self.services.policy_logprobs is None:
            raise RuntimeError("CogRethinker.bind(services) was not called (the assembler binds it)")
        b = len(rows)
        every = Advantages(torch.zeros(b), torch.ones(b, dtype=torch.bool))
        batch = collate(rows, torch.zeros(b), torch.arange(b), every, self.services.codec.pad_id)
        lp = self.services.policy_logprobs(batch).float()
        out = []
        for i, r in enumerate(rows):
            p, c = len(r.prompt_ids), len(r.completion_ids)
            out.append(dataclasses.replace(r, logprobs=tuple(lp[i, p : p + c].tolist())))
        return out

    def observe(self, groups: list[Group], state) -> None:
        """The direct groups go to the history; every correct output goes to the demonstration buffer
        under its plain prompt (the spec's dynamic buffer of successful solutions)."""
        direct = [g for g in groups if "cog_of" not in g.prompt.metadata]
        by_id = {g.prompt.id: g.prompt for g in direct}
        for g in groups:
            pid = g.prompt.metadata.get("cog_of", g.prompt.id)
            base = by_id.get(pid, g.prompt)
            for r in g.rollouts:
                if self._correct(r):
                    self.buffer.add(pid, problem_text(base), r.text)
        super().observe(direct, state)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "buffer": self.buffer.state_dict()}

    def load_state_dict(self, s: dict) -> None:
        super().load_state_dict(s)
        self.buffer.load_state_dict(s["buffer"])


def retemplate(r: Rollout, plain: Group, stage: str) -> Rollout:
    """A correct stage output as a row of the plain prompt: the plain prompt's token ids (from its
    direct rollouts), the output's completion ids and text, marked ``details["sft"]``. Behaviour
    log-probs are re-scored afterwards (:meth:`CogRethinker._rescored`)."""
    if not plain.rollouts:
        raise ValueError(f"prompt {plain.prompt.id!r} has no direct rollout to take its token ids from")
    verdict = r.verdict
    details = {**(verdict.details or {}), "sft": True, "cog_stage": stage}
    return Rollout(
        prompt_id=plain.prompt.id,
        prompt_ids=plain.rollouts[0].prompt_ids,
        completion_ids=r.completion_ids,
        logprobs=r.logprobs,
        finish=r.finish,
        policy_version=r.policy_version,
        text=r.text,
        verdict=dataclasses.replace(verdict, details=details),
    )
