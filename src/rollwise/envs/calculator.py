"""``calculator``: add and subtract numbers too long for a tiny model to add reliably, with a tool.

The prompt is the expression and an equals sign, as in ``rollwise.tasks.arithmetic``
(``"1234567+890123="``); operands have ``digits`` digits. The policy may call ``calc`` (integers,
``+ - *`` and parentheses; parsed, never ``eval``-ed) and answers with the bare integer, judged by
``rollwise.verify.exact``. The demonstration (tag format)::

    <calc>1234567+890123</calc>  ->  <out>2124690</out>
    2124690                      ->  (done, reward 1)

A tool-use toy in the spirit of ToRL (arXiv 2503.23383) for the character model: the skill to
learn is to call, read and copy, not to add. Splits are disjoint and fixed by ``seed``.
"""

from __future__ import annotations

import ast

from pydantic import Field, field_validator

from rollwise.envs.tools import Tool, ToolOptions, ToolTask
from rollwise.flaws import int_tree_value
from rollwise.registry import Compat, UserError
from rollwise.tasks._common import chat, coerce_options, draw_splits
from rollwise.types import Prompt, Verdict
from rollwise.verify import exact

NAME = "calculator"
MAX_EXPRESSION = 200  # characters: bounds the size of a product


def calc(expression: str) -> str:
    """Evaluate an integer expression with + - * and parentheses.

    Args:
        expression: e.g. 1234567+890123
    """
    text = expression.strip()
    if len(text) > MAX_EXPRESSION:
        raise ValueError(f"expression longer than {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ValueError(f"cannot parse {text!r}") from None
    try:
        return str(int_tree_value(tree))
    except ValueError:
        raise ValueError("calc takes integers, + - * and parentheses only") from None


CALC = Tool.from_function(calc)


class CalculatorTask(ToolTask):
    name = NAME
    FORKABLE = True  # calc keeps no state: an episode forks by copying its ToolEnv (sampling.branching)

    def __init__(self, options: make.Options):
        self.options = o = options

        def draw(rng):
            a, b = (rng.randint(10 ** (d - 1), 10**d - 1) for d in (rng.choice(o.digits), rng.choice(o.digits)))
            op = rng.choice(o.ops)
            a, b = (max(a, b), min(a, b)) if op == "-" else (a, b)
            return f"{a}{op}{b}", self._prompt(f"{a}{op}{b}")

        train, held = draw_splits(draw, o.n_train, o.n_heldout, o.seed, NAME)
        self._train, self._heldout = tuple(train), tuple(held)

    def _prompt(self, expr: str) -> Prompt:
        chat_form = None
        if self.options.format == "json":  # a chat model: say what to do; the tools go with the prompt
            chat_form = chat(f"Compute {expr}. Call the calc tool, then reply with the integer only.", None)
        meta = {"expr": expr, **self.chat_tools()}
        return Prompt(f"{NAME}/{expr}", NAME, expr + "=", calc(expr), chat_form, meta)

    def tools(self) -> list[Tool]:
        return [CALC]

    def verify(self, prompt: Prompt, completion: str) -> Verdict:
        return exact.verify(prompt, completion)

    def demo(self, prompt: Prompt) -> tuple[list[str], str]:
        return [prompt.metadata["expr"]], str(prompt.answer)


def make(arg: str | None, options=None) -> CalculatorTask:
    """Task factory: ``calculator`` (no argument)."""
    if arg:
        raise UserError(f"task {NAME!r} takes no argument (got '{NAME}:{arg}')")
    return CalculatorTask(coerce_options(make.Options, options, NAME))


class _Options(ToolOptions):
    digits: list[int] = Field(
        default=[5, 6, 7], min_length=1, description="operand lengths in digits (each operand draws one, 1-18)"
    )
    ops: list[str] = Field(default=["+", "-"], min_length=1, description="operations: '+', '-' and/or '*'")
    n_train: int = Field(default=5000, ge=1, le=1_000_000, description="number of distinct train expressions")
    n_heldout: int = Field(default=200, ge=1, le=100_000, description="number of distinct held-out expressions")
    seed: int = Field(default=0, ge=0, description="fixes both splits")

    @field_validator("digits")
    @classmethod
    def _digits(cls, v: list[int]) -> list[int]:
        if any(not 1 <= d <= 18 for d in v):
            raise ValueError(f"digits must be 1-18 (got {v})")
        return sorted(set(v))

    @field_validator("ops")
    @classmethod
    def _ops(cls, v: list[str]) -> list[str]:
        bad = [op for op in v if op not in ("+", "-", "*")]
        if bad:
            raise ValueError(f"unknown op(s) {bad}; ops are '+', '-', '*'")
        return sorted(set(v))


make.Options = _Options
# an environment task with a tool and a demonstration per prompt: rollwise.compat checks the episode keys
# (task.cleaner and task.semi_online included) from the config alone; its episodes fork
# (sampling.branching, rollwise.generate.branching)
make.compat = Compat(episodes=True, tools=True, demonstrations=True, forkable=CalculatorTask.FORKABLE)
