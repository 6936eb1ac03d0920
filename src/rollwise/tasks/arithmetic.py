"""Built-in integer arithmetic with difficulty levels (the embedded default task).

Text only, printable ASCII, made for a tiny character-level model: the prompt is the expression
and an equals sign (``"12+34="``), the reference answer the decimal result (``"46"``); the model's
completion is the answer followed by EOS. Verified by ``rollwise.verify.exact``.

Levels (operands drawn uniformly, results never negative, evaluation left to right):

=====  ============================================================  ===========
level  expressions                                                   how many
=====  ============================================================  ===========
1      ``a+b``; a, b in 0..9                                                 100
2      ``a+b`` or ``a-b``; a, b in 0..99, at least one >= 10; a >= b for -     14 895
3      ``a±b±c``; a, b, c in 0..99; every partial result >= 0             2 510 050
4      ``a+b`` or ``a-b``; a, b in 0..999, at least one >= 100; a >= b for -  1 485 450
5      ``a*b``; a, b in 0..99                                             10 000
=====  ============================================================  ===========

The level sets are disjoint, so an expression has exactly one level (``metadata["level"]``).

Splits (both fixed by ``seed``; each holds distinct expressions; the two are disjoint):

- held-out: ``n_heldout`` expressions shared evenly between the chosen levels, at most a quarter
  of any level's expressions (level 1 can give at most 25); what a level cannot give goes to the
  others. It does not depend on ``n_train``.
- train: ``n_train`` expressions shared the same way among those not held out.

A split that cannot be filled raises ``UserError`` at construction. Prompt ids are
``"arithmetic/<expression>"``, stable and unique because expressions are distinct.

Chain of thought (``cot = true``, optional): the prompt is unchanged, the SFT target is a digit-by-
digit trace ending in ``=ANSWER`` (``"47+85="`` -> ``"7+5+0=12,4+8+1=13,=132"``), which gives
response lengths that grow with the number of digits and operations; the verifier then reads the
last integer of the completion (``metadata["cot"]``).

Rambling traces (``ramble``, optional, chain of thought only; default none): for the levels named
in ``ramble``, that share of the warm-start examples (``sft_examples``) is a *ramble* instead of
the trace: the trace up to one of its digit steps, then a re-check loop that redoes that step with
a slipped result (off by 1 or 2), again and again, and stops on ``?`` without ever writing
``=ANSWER`` (``"47+85="`` -> ``"7+5+0=12,4+8+1=13?4+8+1=12?4+8+1=15?"``). The number of re-checks
is geometric with mean ``ramble_segments`` (at most ``RAMBLE_MAX_SEGMENTS``): a constant chance
of stopping at each ``?``, which a small model imitates as a constant hazard, so its rambles have a
long right tail. Every slipped result differs from the answer, so a ramble, read by the verifier
(its last integer), is always wrong. A model warm-started on these examples is unsure on those
levels and, when it is, imitates the rambling: wrong attempts run long (some to
``sampling.max_new_tokens``) and right ones stop, the length tail of published RLVR runs
(docs/regime.md §7 "Lengths", §8 item 2: "let wrong paths retry more often, so failures run
long"). Reference completions (``target``) and verdicts are unchanged; with ``ramble`` empty the
warm-start examples are exactly the traces (byte for byte: no random draw is made).

Two rewards (``second_reward``, optional; for GDPO, ``rollwise.objectives.gdpo``): verdicts then
carry named rewards ``{"correct": score, "format" | "length": 0/1}`` (``Verdict.rewards``), where
``format`` is 1 for a well-formed answer (a bare integer; cot: the trace ends in ``=INTEGER``)
and ``length`` is 1 for a stripped completion of at most ``max_length`` characters. The score,
which evaluation and every other estimator read, stays correctness.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rollwise.registry import UserError
from rollwise.tasks._common import coerce_options, sample_prompts
from rollwise.types import Prompt, Verdict
from rollwise.verify import exact

NAME = "arithmetic"
LEVEL_SIZE = {1: 100, 2: 14_895, 3: 2_510_050, 4: 1_485_450, 5: 10_000}  # distinct expressions
HELDOUT_SHARE = 0.25  # at most this share of a level's expressions is held out
RAMBLE_MAX_SEGMENTS = 48  # re-checks in one ramble at most (300-700 characters: past any cap the regimes use)
SLIPS = (-2, -1, 1, 2)  # how far a re-check's result is off

Expr = tuple  # (a, op, b) or (a, op, b, op, c); ints and "+", "-", "*"


# ---------------------------------------------------------------- expressions


def draw(level: int, rng: random.Random) -> Expr:
    """One expression of ``level``, drawn with ``rng`` (see the module docstring)."""
    if level == 1:
        return (rng.randint(0, 9), "+", rng.randint(0, 9))
    if level in (2, 4):
        hi = 99 if level == 2 else 999
        while True:
            a, b = rng.randint(0, hi), rng.randint(0, hi)
            if max(a, b) * 10 > hi:  # at least one operand has the level's full width
                break
        if rng.random() < 0.5:
            return (a, "+", b)
        return (max(a, b), "-", min(a, b))
    if level == 3:
        while True:
            a, b, c = rng.randint(0, 99), rng.randint(0, 99), rng.randint(0, 99)
            expr = (a, rng.choice("+-"), b, rng.choice("+-"), c)
            if value(expr[:3]) >= 0 and value(expr) >= 0:
                return expr
    if level == 5:
        return (rng.randint(0, 99), "*", rng.randint(0, 99))
    raise ValueError(f"unknown level {level}")


def value(expr: Expr) -> int:
    """Left-to-right value (levels never mix ``*`` with another operation)."""
    acc = expr[0]
    for op, x in zip(expr[1::2], expr[2::2]):
        acc = acc + x if op == "+" else acc - x if op == "-" else acc * x
    return acc


def render(expr: Expr) -> str:
    return "".join(str(t) for t in expr)


def trace(expr: Expr) -> str:
    """Chain-of-thought target: digit-column steps per operation, ``;`` between operations,
    each operation ending in ``=RESULT``. ``(12,"+",34,"-",5)`` ->
    ``"2+4+0=6,1+3+0=4,=46;6-5-0=1,4-0-0=4,=41"``."""
    parts, acc = [], expr[0]
    for op, x in zip(expr[1::2], expr[2::2]):
        parts.append(_trace_op(acc, op, x))
        acc = value((acc, op, x))
    return ";".join(parts)


def _digits(n: int, width: int) -> list[int]:
    return [int(d) for d in str(n).zfill(width)][::-1]  # least significant first


def _trace_op(a: int, op: str, b: int) -> str:
    steps = []
    if op == "*":
        partials = [a * d for d in _digits(b, 1)]
        steps = [f"{a}*{d}={p}" for d, p in zip(_digits(b, 1), partials)]
        acc = partials[0]
        for i, p in enumerate(partials[1:], start=1):
            steps.append(f"{acc}+{p * 10**i}={acc + p * 10**i}")
            acc += p * 10**i
    else:
        width = max(len(str(a)), len(str(b)))
        carry = 0
        for x, y in zip(_digits(a, width), _digits(b, width)):
            if op == "+":
                s = x + y + carry
                steps.append(f"{x}+{y}+{carry}={s}")
                carry = s // 10
            else:
                s = x - y - carry
                steps.append(f"{x}-{y}-{carry}={s}" + (f"+10={s + 10}" if s < 0 else ""))
                carry = int(s < 0)
    return ",".join(steps) + f",={value((a, op, b))}"


def _steps(text: str) -> tuple[list[str], list[int]]:
    """A trace split into its pieces and separators (alternating, ``re.split`` with the group kept)
    and the indices of its digit steps (the pieces that are not an operation's ``=RESULT``)."""
    parts = re.split(r"([,;])", text)
    return parts, [i for i in range(0, len(parts), 2) if not parts[i].startswith("=")]


def ramble_trace(expr: Expr, step: int, slips: Sequence[int]) -> str:
    """The trace of ``expr`` up to and including its digit step number ``step`` (0-based), then one
    re-check of that step per entry of ``slips``, each with the step's result off by that much, and
    a closing ``?`` (no answer). ``((47, "+", 85), 1, (-1, 2))`` ->
    ``"7+5+0=12,4+8+1=13?4+8+1=12?4+8+1=15?"``."""
    parts, steps = _steps(trace(expr))
    i = steps[step]
    head, result = parts[i].rsplit("=", 1)
    return "".join(parts[: i + 1]) + "".join(f"?{head}={int(result) + d}" for d in slips) + "?"


def draw_ramble(expr: Expr, rng: random.Random, mean_segments: float) -> str:
    """A ramble of ``expr`` (``ramble_trace``) drawn with ``rng``: the step uniformly among the
    trace's digit steps; the number of re-checks 1 + a geometric count, mean ``mean_segments``
    (stop at each ``?`` with probability 1 / ``mean_segments``), at most ``RAMBLE_MAX_SEGMENTS``;
    each slip uniform among ``SLIPS`` that keep the result >= 0 and away from the answer, so the
    ramble's last integer is never the answer."""
    parts, steps = _steps(trace(expr))
    step = rng.randrange(len(steps))
    result = int(parts[steps[step]].rsplit("=", 1)[1])
    n = 1
    while n < RAMBLE_MAX_SEGMENTS and rng.random() >= 1 / mean_segments:
        n += 1
    ok = [d for d in SLIPS if result + d >= 0 and result + d != value(expr)]  # never empty: +1 or +2 stays
    return ramble_trace(expr, step, [rng.choice(ok) for _ in range(n)])


# ---------------------------------------------------------------- splits


def allocate(total: int, capacity: dict[int, int], what: str) -> dict[int, int]:
    """Share ``total`` evenly between levels, none above its capacity; spill-over goes to the
    others. E.g. 200 over capacities {1: 25, 2: 3723} -> {1: 25, 2: 175}."""
    quota = dict.fromkeys(capacity, 0)
    left, open_ = total, [lv for lv in capacity if capacity[lv] > 0]
    while left and open_:
        share, extra = divmod(left, len(open_))
        for i, lv in enumerate(open_):
            give = min(share + (i < extra), capacity[lv] - quota[lv])
            quota[lv] += give
            left -= give
        open_ = [lv for lv in open_ if quota[lv] < capacity[lv]]
    if left:
        raise UserError(
            f"task 'arithmetic': levels {sorted(capacity)} can give at most {total - left} {what} "
            f"expressions, but {total} were asked for; lower it or add levels"
        )
    return quota


def check_known_levels(levels: list[int]) -> None:
    """Raise ``ValueError`` naming the levels that are not among ``LEVEL_SIZE``'s (an options validator's
    message; pydantic adds the key)."""
    bad = [lv for lv in levels if lv not in LEVEL_SIZE]
    if bad:
        raise ValueError(f"unknown level(s) {bad}; levels are {sorted(LEVEL_SIZE)}")


def sample_distinct(level: int, k: int, rng: random.Random, seen: set[str]) -> list[Expr]:
    """``k`` expressions of ``level`` not in ``seen`` (which is updated). The caller checks that
    enough remain, so the rejection loop ends."""
    out: list[Expr] = []
    while len(out) < k:
        expr = draw(level, rng)
        key = render(expr)
        if key not in seen:
            seen.add(key)
            out.append(expr)
    return out


class ArithmeticTask:
    """See the module docstring."""

    name = NAME
    REWARD_ONLY_OPTIONS = ("second_reward", "max_length")  # change verdicts only: the warm start is shared
    WARM_START_SIZED = False  # generated split: the warm start keeps model.warm_start.steps (rollwise.defaults)

    def __init__(self, options: make.Options):
        self.options = options
        levels = options.levels
        seen: set[str] = set()
        # Held-out first, from its own random stream, so it does not depend on n_train.
        rng = random.Random(f"rollwise-arithmetic-heldout-{options.seed}")
        cap = {lv: int(LEVEL_SIZE[lv] * HELDOUT_SHARE) for lv in levels}
        held_quota = allocate(options.n_heldout, cap, "held-out")
        held = [(lv, e) for lv in levels for e in sample_distinct(lv, held_quota[lv], rng, seen)]

        rng = random.Random(f"rollwise-arithmetic-train-{options.seed}")
        cap = {lv: LEVEL_SIZE[lv] - held_quota[lv] for lv in levels}
        train_quota = allocate(options.n_train, cap, "train")
        train = [(lv, e) for lv in levels for e in sample_distinct(lv, train_quota[lv], rng, seen)]
        rng.shuffle(train)  # mix levels in the pool

        self._train = tuple(self._prompt(lv, e) for lv, e in train)
        self._heldout = tuple(self._prompt(lv, e) for lv, e in held)

    def _prompt(self, level: int, expr: Expr) -> Prompt:
        text = render(expr)
        return Prompt(
            id=f"{NAME}/{text}",
            task=NAME,
            text=text + "=",
            answer=str(value(expr)),
            metadata={"level": level, "difficulty": level, "cot": self.options.cot, "expr": expr},
        )

    def train_prompts(self) -> Sequence[Prompt]:
        return self._train

    def heldout_prompts(self) -> Sequence[Prompt]:
        return self._heldout

    def verify(self, prompt: Prompt, completion: str) -> Verdict:
        v = exact.verify(prompt, completion)
        second = self.options.second_reward
        if second == "none" or v.score is None:
            return v
        text = completion.strip()
        if second == "format":  # the answer is well formed: a bare integer (cot: the trace ends in '=INTEGER')
            ok = (
                (exact.parse_int(text.rsplit("=", 1)[-1]) is not None and "=" in text)
                if prompt.metadata.get("cot")
                else exact.parse_int(text) is not None
            )
        else:  # "length": at most max_length characters (the tiny models' tokens are characters)
            ok = len(text) <= self.options.max_length
        return dataclasses.replace(v, rewards={"correct": v.score, second: 1.0 if ok else 0.0})

    def target(self, prompt: Prompt) -> str:
        """The reference completion: the answer, or the chain-of-thought trace if ``cot``."""
        return trace(prompt.metadata["expr"]) if self.options.cot else str(prompt.answer)

    def sft_examples(self, n: int, seed: int) -> list[tuple[Prompt, str]]:
        """``n`` (prompt, target) pairs from the train split, drawn by ``seed``; with ``ramble``, a
        prompt of a rambling level gets a ramble (``draw_ramble``) instead of its trace with the
        level's probability, drawn by ``seed`` too, one draw per example (a prompt drawn twice may
        get both)."""
        pairs = [(p, self.target(p)) for p in sample_prompts(self._train, n, seed)]
        share = self.options.ramble
        if not share:
            return pairs
        rng = random.Random(f"rollwise-arithmetic-ramble-{seed}")
        mean = self.options.ramble_segments
        return [
            (p, draw_ramble(p.metadata["expr"], rng, mean) if rng.random() < share.get(p.metadata["level"], 0.0) else t)
            for p, t in pairs
        ]


def make(arg: str | None, options=None) -> ArithmeticTask:
    """Task factory: ``arithmetic`` (no argument)."""
    if arg:
        raise UserError(f"task 'arithmetic' takes no argument (got 'arithmetic:{arg}')")
    return ArithmeticTask(coerce_options(make.Options, options, NAME))


def check_config(cfg, opts: _Options) -> None:
    """The task's check across sections (``rollwise.compat.check``, at config load, so before the
    warm start): ``ramble`` needs ``sampling.max_new_tokens`` set. Left unset, the cap is derived
    from the longest warm-start example (``rollwise.defaults``), which is then a ramble: the tail of
    a geometric draw, not the answers' length. At the tail regime's options
    (``benchmarks/regime_tail.toml`` without its ``sampling.max_new_tokens``: levels 2, 3, 5, ramble
    {3 = 0.25, 5 = 0.6}) the longest is 410 characters and the derived cap 520 tokens, past the
    built-in tiny models' 512 positions before the prompt is counted."""
    if opts.ramble and "max_new_tokens" not in cfg.sampling.model_fields_set:
        raise UserError(
            f"task.options.ramble = {dict(opts.ramble)} makes warm-start examples that loop for up to hundreds of "
            "tokens, and sampling.max_new_tokens is unset, so it would be derived from the longest of them, not from "
            "the answers (520 tokens at benchmarks/regime_tail.toml's options, past the built-in tiny models' 512 "
            "positions); set sampling.max_new_tokens (regime_tail.toml: 256)"
        )


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")

    levels: list[int] = Field(
        default=[1, 2],
        min_length=1,
        description="difficulty levels to draw from (1-5, see rollwise.tasks.arithmetic): "
        "1 one-digit a+b; 2 two-digit a±b; 3 two-digit a±b±c; 4 three-digit a±b; 5 two-digit a*b",
    )
    n_train: int = Field(default=5000, ge=1, le=1_000_000, description="number of distinct train expressions")
    n_heldout: int = Field(default=200, ge=1, le=100_000, description="number of distinct held-out expressions")
    seed: int = Field(default=0, ge=0, description="fixes both splits")
    cot: bool = Field(
        default=False,
        description="chain-of-thought mode: SFT targets are digit-by-digit traces ending in '=ANSWER', "
        "and the verifier reads the last integer of the completion",
    )
    second_reward: Literal["none", "format", "length"] = Field(
        default="none",
        description="a second named reward beside 'correct' (Verdict.rewards, for GDPO): 'format' = 1 when the answer "
        "is well formed (a bare integer; cot: the trace ends in '=INTEGER'), 'length' = 1 when the stripped "
        "completion has at most max_length characters; 'none' = only the score. The score stays correctness.",
    )
    max_length: int = Field(default=2, ge=1, description="characters allowed by second_reward = 'length'")
    ramble: dict[int, float] = Field(
        default_factory=dict,
        description="chain of thought only: level -> share of that level's warm-start examples that ramble (a "
        "re-check loop that never reaches an answer; rollwise.tasks.arithmetic), e.g. {5 = 0.5}; each level one "
        "of 'levels', each share in [0, 1). Empty (the default): the examples are the traces. Gives the "
        "warm-started model wrong attempts that run long (issue #43's length tail). Needs sampling.max_new_tokens "
        "set (refused at load otherwise: it would be derived from the longest warm-start example, a ramble)",
    )
    ramble_segments: float = Field(
        default=8.0,
        ge=1.0,
        le=RAMBLE_MAX_SEGMENTS,
        description="mean number of re-checks in a ramble (geometric, at most "
        f"{RAMBLE_MAX_SEGMENTS}); read only with 'ramble'",
    )

    @field_validator("levels")
    @classmethod
    def _check_levels(cls, v: list[int]) -> list[int]:
        check_known_levels(v)
        if len(set(v)) != len(v):
            raise ValueError(f"levels must not repeat (got {v})")
        return sorted(v)

    @field_validator("ramble")
    @classmethod
    def _check_ramble_shares(cls, v: dict[int, float]) -> dict[int, float]:
        bad = {lv: x for lv, x in v.items() if not 0.0 <= x < 1.0}
        if bad:
            raise ValueError(
                f"ramble shares must be in [0, 1) (a level that always rambles is never solved); got {bad}"
            )
        return v

    @model_validator(mode="after")
    def _check_ramble(self):
        if self.ramble and not self.cot:
            raise ValueError("ramble needs cot = true (a ramble is a chain-of-thought trace that loops)")
        other = sorted(set(self.ramble) - set(self.levels))
        if other:
            raise ValueError(f"ramble names level(s) {other} that are not in levels {self.levels}")
        return self


make.Options = _Options
make.check_config = check_config
