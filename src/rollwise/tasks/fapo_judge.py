"""FAPO's generative judge (GenRM) as a built-in task: name the first wrong step of a correct answer.

Paper: "Flawed-Aware Policy Optimization for Efficient and Reliable Reasoning" (FAPO), arXiv
2510.22543, §3 (FAPO-GenRM); guidance.md §6.2. The paper RL-trains a 4B generative reward model
that reads a solution whose final answer is right and names the index of its earliest erroneous
step (or none), with ``R = R_outcome + R_process``, ``R_process = 1 - |t_hat - t*| / n``, and
``-1`` for an output that cannot be parsed. Here the judge is trained by rollwise itself (GRPO, the
preset ``configs/fapo_judge.toml``) and then plugged in as ``reward.fapo.detector = "genrm:<run
dir>"`` (``rollwise.flaws``).

Prompts: the built-in arithmetic chain-of-thought trace (``rollwise.tasks.arithmetic.trace``) of
an expression, its final ``=ANSWER`` always right, then ``?``. With probability
``flawed_share`` one digit step has a planted slip (its first result off by one of
``arithmetic.SLIPS``), so the trace is a *flawed positive*: ``"47+85="`` ->
``"7+5+0=12,4+8+1=14,=132?"``. The label ``t*`` is what the rule detector
(``rollwise.flaws.first_false_equation``) says of the trace: the planted step's index, or ``-1``
("none") for a clean trace. The step count ``n`` is the detector's (pieces between ``,`` ``;``).

Answer: the step index as a decimal (``"1"``) or ``"none"``. Reward (the verdict's score):

- invalid (not ``none`` nor an integer in ``0..n-1``): ``-1``;
- ``R_outcome``: 1 when the answer equals the label (a step index, or none for none), else 0;
- ``R_process``: ``1 - |t_hat - t*| / n`` when both the answer and the label name a step, else 0.

So an exact step scores 2, a near step ``1 - d/n``, a right "none" 1, a wrong flawed/clean call 0.
Reconstruction: the paper gives the two terms and the -1; that ``R_process`` is 0 unless both
sides name a step (a clean/flawed mismatch has no step distance) is ours.

Warm start (``sft_examples``): (trace, label) pairs from the train split, like arithmetic's, so the
tiny character model starts from an imitation of the rule detector and GRPO sharpens it.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rollwise.flaws import first_false_equation
from rollwise.registry import UserError
from rollwise.tasks._common import coerce_options, draw_splits, sample_prompts
from rollwise.tasks.arithmetic import SLIPS, check_known_levels, draw, render, trace
from rollwise.types import Prompt, Verdict

NAME = "fapo_judge"
NONE = "none"
END = "?"  # closes the trace in the prompt; the judge's answer follows


def n_steps(text: str) -> int:
    """Steps as the rule detector splits them (``rollwise.flaws``): pieces between ``,`` ``;`` newlines."""
    return len(re.split(r"[,;\n]", text))


def plant(text: str, rng: random.Random) -> str:
    """``text`` (an arithmetic trace) with one digit step's first result slipped by one of ``SLIPS``
    (kept >= 0 where it was): ``"7+5+0=12,4+8+1=13,=132"`` may become ``"7+5+0=12,4+8+1=14,=132"``.
    The final ``=ANSWER`` pieces are never touched, so the answer stays right."""
    pieces = re.split(r"([,;])", text)
    digit = [i for i in range(0, len(pieces), 2) if not pieces[i].startswith("=")]
    i = rng.choice(digit)
    head, rest = pieces[i].split("=", 1)
    m = re.match(r"-?\d+", rest)
    old = int(m.group())
    slips = [d for d in SLIPS if old < 0 or old + d >= 0]
    pieces[i] = f"{head}={old + rng.choice(slips)}{rest[m.end() :]}"
    return "".join(pieces)


def parse(completion: str, n: int) -> int | None:
    """The judge's answer: a step index in ``0..n-1``, ``-1`` for ``none``, None when invalid."""
    text = completion.strip()
    if text == NONE:
        return -1
    if re.fullmatch(r"\d+", text) and int(text) < n:
        return int(text)
    return None


def judge_reward(t_hat: int | None, t_star: int, n: int) -> float:
    """``R_outcome + R_process`` (module docstring); ``t_hat`` None = invalid, ``-1`` = none.
    Example, n = 4, t* = 1: t_hat 1 -> 2.0; t_hat 3 -> 0.5; none -> 0.0; invalid -> -1.0."""
    if t_hat is None:
        return -1.0
    outcome = 1.0 if t_hat == t_star else 0.0
    process = 1.0 - abs(t_hat - t_star) / n if t_hat >= 0 and t_star >= 0 else 0.0
    return outcome + process


class FapoJudgeTask:
    """See the module docstring."""

    name = NAME
    WARM_START_SIZED = False  # generated split: the warm start keeps model.warm_start.steps

    def __init__(self, options: make.Options):
        self.options = options
        levels, share = options.levels, options.flawed_share

        def one(rng: random.Random):
            expr = draw(rng.choice(levels), rng)
            text = trace(expr)
            if rng.random() < share:
                text = plant(text, rng)
            return text, self._prompt(expr, text)

        self._train, self._heldout = draw_splits(one, options.n_train, options.n_heldout, options.seed, NAME)

    def _prompt(self, expr, text: str) -> Prompt:
        label = first_false_equation(None, text)  # the rule detector labels; never -> None on a trace
        return Prompt(
            id=f"{NAME}/{text}",
            task=NAME,
            text=text + END,
            answer=NONE if label == -1 else str(label),
            metadata={"expr": expr, "problem": render(expr), "t_star": label, "n_steps": n_steps(text)},
        )

    def train_prompts(self) -> Sequence[Prompt]:
        return self._train

    def heldout_prompts(self) -> Sequence[Prompt]:
        return self._heldout

    def verify(self, prompt: Prompt, completion: str) -> Verdict:
        n, t_star = prompt.metadata["n_steps"], prompt.metadata["t_star"]
        t_hat = parse(completion, n)
        reason = "invalid" if t_hat is None else "correct" if t_hat == t_star else "wrong"
        return Verdict(judge_reward(t_hat, t_star, n), reason, {"answer": t_hat})

    def target(self, prompt: Prompt) -> str:
        return str(prompt.answer)

    def sft_examples(self, n: int, seed: int) -> list[tuple[Prompt, str]]:
        """``n`` (trace, label) pairs from the train split, drawn by ``seed``."""
        return [(p, self.target(p)) for p in sample_prompts(self._train, n, seed)]


def make(arg: str | None, options=None) -> FapoJudgeTask:
    """Task factory: ``fapo_judge`` (no argument)."""
    if arg:
        raise UserError(f"task 'fapo_judge' takes no argument (got 'fapo_judge:{arg}')")
    return FapoJudgeTask(coerce_options(make.Options, options, NAME))


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")

    levels: list[int] = Field(
        default=[2, 3],
        min_length=1,
        description="arithmetic levels whose traces are judged (rollwise.tasks.arithmetic)",
    )
    flawed_share: float = Field(
        default=0.5, ge=0.0, le=1.0, description="share of traces with a planted wrong step (the rest are clean)"
    )
    n_train: int = Field(default=5000, ge=1, le=1_000_000, description="number of distinct train traces")
    n_heldout: int = Field(default=200, ge=1, le=100_000, description="number of distinct held-out traces")
    seed: int = Field(default=0, ge=0, description="fixes both splits")

    @field_validator("levels")
    @classmethod
    def _check_levels(cls, v: list[int]) -> list[int]:
        check_known_levels(v)
        return sorted(set(v))


make.Options = _Options
