"""Built-in procedurally generated Python functions with hidden tests (``pyfunc``).

Made for the tiny character-level models (printable ASCII, one line): the prompt is a one-line
function head whose name says what it does, the completion is the expression it returns::

    prompt      def add_7(x): return
    completion   x + 7          (then EOS)

The program ``prompt + completion`` runs in the code sandbox (``rollwise.verify.code``) against
hidden tests: ``check(candidate)`` asserts the function's value on ``tests`` inputs drawn by
the seed, which the completion never sees. The reference completion (``Prompt.answer``, the SFT
target of the warm start) is the canonical expression; the expected values are computed from it.

Levels (every function of a level is distinct; the sets are disjoint):

=====  =====================================================================  ========
level  functions                                                              how many
=====  =====================================================================  ========
1      ``add_K``, ``sub_K``, ``mul_K`` (x +/-/* K), K in 1..99                     297
2      ``take_K`` s[:K], ``drop_K`` s[K:], ``rep_K`` s*K (K 1..9); ``mod_K`` x%K,     43
       ``div_K`` x//K (K 2..9); and 12 named ones: rev, first, last, upper,       + 12
       lower, length, double, square, neg, is_even, is_odd, absval
3      ``add_K_mul_M`` (x+K)*M, ``mul_M_add_K`` x*M+K (K 1..9, M 2..9); and 6      144
       two-argument ones: max2, min2, plus, minus, times, concat                  + 6
=====  =====================================================================  ========

Splits (fixed by ``seed``, disjoint): the held-out split is ``n_heldout`` functions shared
evenly between the chosen levels, at most a quarter of a level's parameterised (``_K``)
functions, so a held-out function is an unseen constant of a family seen in training; the
named ones are always in train. The train split is every other function of the chosen levels
(at most ``n_train``). Prompt ids are ``"pyfunc/<name>"``.

Verification: a sandbox per task (``options.sandbox``), ``options.workers`` verifier calls in
parallel (read by the local pool), and a cache of deterministic verdicts (``options.cache``).
"""

from __future__ import annotations

import random
import string

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rollwise.registry import UserError
from rollwise.tasks._code import CodeTask
from rollwise.tasks._common import coerce_options
from rollwise.tasks.arithmetic import allocate
from rollwise.types import Prompt
from rollwise.verify.sandbox import Limits

NAME = "pyfunc"
HELDOUT_SHARE = 0.25

# name -> (args, expression); args "x" int, "s" str, "a, b" ints, "s, t" strs
NAMED = {
    2: {
        "rev": ("s", "s[::-1]"),
        "first": ("s", "s[0]"),
        "last": ("s", "s[-1]"),
        "upper": ("s", "s.upper()"),
        "lower": ("s", "s.lower()"),
        "length": ("s", "len(s)"),
        "double": ("x", "x * 2"),
        "square": ("x", "x * x"),
        "neg": ("x", "-x"),
        "is_even": ("x", "x % 2 == 0"),
        "is_odd": ("x", "x % 2 == 1"),
        "absval": ("x", "abs(x)"),
    },
    3: {
        "max2": ("a, b", "max(a, b)"),
        "min2": ("a, b", "min(a, b)"),
        "plus": ("a, b", "a + b"),
        "minus": ("a, b", "a - b"),
        "times": ("a, b", "a * b"),
        "concat": ("s, t", "s + t"),
    },
}


def functions(level: int) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    """(parameterised, named) functions of ``level`` as (name, args, expression)."""
    fam: list[tuple[str, str, str]] = []
    if level == 1:
        for k in range(1, 100):
            fam += [(f"add_{k}", "x", f"x + {k}"), (f"sub_{k}", "x", f"x - {k}"), (f"mul_{k}", "x", f"x * {k}")]
    elif level == 2:
        for k in range(1, 10):
            fam += [(f"take_{k}", "s", f"s[:{k}]"), (f"drop_{k}", "s", f"s[{k}:]"), (f"rep_{k}", "s", f"s * {k}")]
        for k in range(2, 10):
            fam += [(f"mod_{k}", "x", f"x % {k}"), (f"div_{k}", "x", f"x // {k}")]
    elif level == 3:
        for k in range(1, 10):
            for m in range(2, 10):
                fam += [(f"add_{k}_mul_{m}", "x", f"(x + {k}) * {m}"), (f"mul_{m}_add_{k}", "x", f"x * {m} + {k}")]
    else:
        raise ValueError(f"unknown level {level}")
    named = [(n, a, e) for n, (a, e) in NAMED.get(level, {}).items()]
    return fam, named


def draw_input(kind: str, rng: random.Random):
    if kind in ("x", "a", "b"):
        return rng.randint(-30, 30)
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 8)))


def hidden_tests(name: str, args: str, expr: str, n: int, rng: random.Random) -> tuple[str, list]:
    """``check(candidate)`` asserting ``n`` values of ``lambda args: expr`` (computed here, from
    our own reference expression), and the (inputs, expected) pairs."""
    ref = eval(f"lambda {args}: {expr}", {})  # noqa: S307 - our own reference expression, not model output
    kinds = [a.strip() for a in args.split(",")]
    cases = []
    for _ in range(n):
        inputs = tuple(draw_input(k, rng) for k in kinds)
        cases.append((inputs, ref(*inputs)))
    lines = ["def check(candidate):"] + [
        f"    assert candidate({', '.join(map(repr, i))}) == {want!r}" for i, want in cases
    ]
    return "\n".join(lines) + "\n", cases


class PyFuncTask(CodeTask):
    """See the module docstring."""

    name = NAME

    def __init__(self, options: make.Options):
        super().__init__(options)
        rng = random.Random(f"rollwise-pyfunc-heldout-{options.seed}")
        fams = {lv: functions(lv) for lv in options.levels}
        cap = {lv: int(len(fams[lv][0]) * HELDOUT_SHARE) for lv in options.levels}
        try:
            quota = allocate(options.n_heldout, cap, "held-out")
        except UserError:
            raise UserError(
                f"task 'pyfunc': levels {options.levels} can hold out at most {sum(cap.values())} functions, "
                f"but n_heldout = {options.n_heldout}"
            ) from None
        held, train = [], []
        for lv in options.levels:
            fam, named = fams[lv]
            pick = set(rng.sample(range(len(fam)), quota[lv]))
            held += [(lv, f) for i, f in enumerate(fam) if i in pick]
            train += [(lv, f) for i, f in enumerate(fam) if i not in pick] + [(lv, f) for f in named]
        rng = random.Random(f"rollwise-pyfunc-train-{options.seed}")
        rng.shuffle(train)
        if options.n_train is not None:
            if options.n_train > len(train):
                raise UserError(
                    f"task 'pyfunc': levels {options.levels} have {len(train)} train functions, "
                    f"but n_train = {options.n_train}; lower it or add levels"
                )
            train = train[: options.n_train]
        test_rng = random.Random(f"rollwise-pyfunc-tests-{options.seed}")
        self._train = tuple(self._prompt(lv, f, test_rng) for lv, f in train)
        self._heldout = tuple(self._prompt(lv, f, test_rng) for lv, f in held)

    def _prompt(self, level: int, fn: tuple[str, str, str], rng: random.Random) -> Prompt:
        name, args, expr = fn
        test, _ = hidden_tests(name, args, expr, self.options.tests, rng)
        return Prompt(
            id=f"{NAME}/{name}",
            task=NAME,
            text=f"def {name}({args}): return ",
            answer=expr,
            metadata={"level": level, "difficulty": level, "entry_point": name, "test": test},
        )


def make(arg: str | None, options=None) -> PyFuncTask:
    """Task factory: ``pyfunc`` (no argument)."""
    if arg:
        raise UserError(f"task 'pyfunc' takes no argument (got 'pyfunc:{arg}')")
    return PyFuncTask(coerce_options(make.Options, options, NAME))


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")

    levels: list[int] = Field(
        default=[1, 2],
        min_length=1,
        description="difficulty levels (1-3, see rollwise.tasks.pyfunc): "
        "1 x+/-/*K; 2 string slices/repeats, x%K, x//K and named one-liners; 3 two-step and two-argument",
    )
    n_train: int | None = Field(
        default=None, ge=1, description="most train functions (default: every function not held out)"
    )
    n_heldout: int = Field(
        default=64, ge=0, le=200, description="held-out functions (unseen constants of trained families)"
    )
    tests: int = Field(default=5, ge=1, le=50, description="hidden test cases per function")
    seed: int = Field(default=0, ge=0, description="fixes both splits and the hidden test inputs")
    workers: int = Field(
        default=2,
        ge=1,
        le=64,
        description="verifier calls run in parallel (threads, each waiting on a sandbox process)",
    )
    cache: bool = Field(default=True, description="reuse deterministic verdicts of identical (prompt, program) pairs")
    sandbox: Limits = Field(default_factory=Limits, description="code sandbox isolation and limits")

    @field_validator("levels")
    @classmethod
    def _check_levels(cls, v: list[int]) -> list[int]:
        bad = [lv for lv in v if lv not in (1, 2, 3)]
        if bad:
            raise ValueError(f"unknown level(s) {bad}; levels are [1, 2, 3]")
        if len(set(v)) != len(v):
            raise ValueError(f"levels must not repeat (got {v})")
        return sorted(v)


make.Options = _Options
