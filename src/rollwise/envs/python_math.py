"""``python_math``: small math problems solved by running Python, in the code verifier's sandbox.

The policy writes cells (tag format ``<python>print(2 ** 10)</python>``, or the JSON format's
``python`` tool with argument ``code``); each cell's printed output (and the value of a last bare
expression, as a notebook shows it) is the observation, cut at ``max_output_chars``. A turn without
a cell is the answer: its last integer, judged by ``rollwise.verify.exact``.

**State between cells** (the simplest honest design): every cell runs in a fresh sandboxed process
(``rollwise.verify.sandbox.Sandbox.call``: the code verifier's isolation and limits, not a copy)
which first re-runs the episode's earlier *successful* cells, output discarded, then the new cell,
whose output alone is shown. Variables, functions and imports carry over; so does the cost: a cell's
time limit (the run's ``task.tool_timeout_s``, which replaces ``sandbox.wall_s``) covers the replay, and side
effects are repeated (a cell that draws random numbers draws them again). A cell that raises,
times out or is killed is not kept. ToRL (arXiv 2503.23383) and ReTool (arXiv 2504.11536) keep one
live interpreter per trajectory instead; rStar2-Agent (arXiv 2508.20722) serves calls from an
isolated pool. Hostile cells are contained exactly as hostile completions are (see the sandbox's
threat model): the problem's answer never enters the sandbox, which sees only the episode's cells.

Problems are generated from six templates (sums of squares, primes below n, digit sums of
powers, divisor counts, an arithmetic-series word problem, Fibonacci numbers); the reference
answer is computed here, outside the sandbox. Demonstrations solve each with one or two cells
(the two-cell ones show state carried over). Splits are disjoint and fixed by ``seed``.

**No GiGPO anchors.** The state a cell runs in is the interpreter's namespace, which the outputs
shown do not identify (``x = 5`` and ``y = 3`` both print nothing) and which cannot be compared
across episodes without running them; keying on the cells' source would key on the actions. So
turns carry no anchor (``STATE_ANCHORS = False``) and ``rollwise.compat`` refuses
``advantage.name = "gigpo"`` here rather than let it run as episode-level GRPO without saying so;
``turn_return`` or the default trajectory GRPO assign credit without states.
"""

from __future__ import annotations

import random

from pydantic import Field, field_validator, model_validator

from rollwise.envs.tools import FORMATS, Tool, ToolFailure, ToolOptions, ToolTask
from rollwise.registry import Compat, UserError
from rollwise.tasks._common import chat, coerce_options, draw_splits
from rollwise.types import Prompt, Verdict
from rollwise.verify import exact
from rollwise.verify.sandbox import Limits, Sandbox

NAME = "python_math"

# Runs inside the sandbox (standard library, Python 3.8+): CELLS and CAP are prepended.
_RUNNER = """
def rollwise_cells():
    import ast, sys

    class Out:
        def __init__(self, cap):
            self.cap, self.parts, self.kept, self.total = cap, [], 0, 0

        def write(self, s):
            s = str(s)
            self.total += len(s)
            if self.kept < self.cap:
                self.parts.append(s[: self.cap - self.kept])
                self.kept += len(self.parts[-1])
            return len(s)

        def flush(self):
            pass

    ns = {"__name__": "__main__"}

    def run(src, out):
        sys.stdout = sys.stderr = out
        tree = ast.parse(src)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, "<cell>", "exec"), ns)
        if last is not None:
            value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), ns)
            if value is not None:
                print(repr(value))

    for src in CELLS[:-1]:
        run(src, Out(0))
    out, error = Out(CAP), ""
    try:
        run(CELLS[-1], out)
    except BaseException as e:
        error = ("%s: %s" % (type(e).__name__, e)).replace("\\n", " ")[:300]
    return "%d %s\\n%s" % (out.total, error, "".join(out.parts))
"""

# kind -> (draw parameters, question, reference answer, demonstration cells)
_P = {
    "sumsq": (
        lambda r: {"n": r.randint(20, 300)},
        "What is the sum of the squares of the whole numbers from 1 to {n}?",
        lambda n: sum(i * i for i in range(1, n + 1)),
        ["xs = [i * i for i in range(1, {n} + 1)]", "print(sum(xs))"],
    ),
    "primes": (
        lambda r: {"n": r.randint(100, 5000)},
        "How many prime numbers are there below {n}?",
        lambda n: sum(all(k % d for d in range(2, int(k**0.5) + 1)) for k in range(2, n)),
        ["print(sum(all(k % d for d in range(2, int(k ** 0.5) + 1)) for k in range(2, {n})))"],
    ),
    "digitsum": (
        lambda r: {"a": r.randint(2, 9), "b": r.randint(20, 300)},
        "What is the sum of the digits of {a} to the power {b}?",
        lambda a, b: sum(int(c) for c in str(a**b)),
        ["print(sum(int(c) for c in str({a} ** {b})))"],
    ),
    "divisors": (
        lambda r: {"n": r.randint(1000, 100_000)},
        "How many positive divisors does {n} have?",
        lambda n: sum(1 for d in range(1, n + 1) if n % d == 0),
        ["print(sum(1 for d in range(1, {n} + 1) if {n} % d == 0))"],
    ),
    "savings": (
        lambda r: {"a": r.randint(1, 20), "d": r.randint(1, 10), "n": r.randint(10, 100)},
        "Ana saves {a} coins on the first day and each day {d} more than the day before. "
        "How many coins has she saved after {n} days?",
        lambda a, d, n: sum(a + d * i for i in range(n)),
        ["days = [{a} + {d} * i for i in range({n})]", "print(sum(days))"],
    ),
    "fib": (
        lambda r: {"n": r.randint(20, 90)},
        "What is the {n}th Fibonacci number, counting F1 = F2 = 1?",
        lambda n: _fib(n),
        ["a, b = 0, 1\nfor _ in range({n}):\n    a, b = b, a + b\nprint(a)"],
    ),
}
KINDS = tuple(_P)


def _fib(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


class PythonCells:
    """The ``python`` tool of one episode: its successful cells, run again before each new one."""

    def __init__(self, sandbox: Sandbox, max_output_chars: int):
        self.sandbox, self.cap, self.cells = sandbox, max_output_chars, []

    def python(self, code: str) -> str:
        """Run a Python cell; variables from earlier cells of this conversation are kept. Print what you need.

        Args:
            code: Python source
        """
        cells = [*self.cells, code]
        res = self.sandbox.call(f"CELLS = {cells!r}\nCAP = {self.cap}\n{_RUNNER}", "rollwise_cells")
        if res.status != "correct":
            outcome = {"timeout": "timeout", "output_limit": "truncated"}.get(res.status, "error")
            raise ToolFailure(outcome, f"{res.status}: {res.detail}"[:500])
        head, text = res.extra["value"].split("\n", 1)
        total, error = head.split(" ", 1)
        if error:
            raise ToolFailure("error", text + error)
        self.cells.append(code)
        if int(total) > self.cap:
            raise ToolFailure("truncated", text + f"...[cut {int(total) - self.cap} chars]")
        return text

    def tool(self) -> Tool:
        return Tool.from_function(self.python, set_timeout=self.set_timeout)

    def set_timeout(self, seconds: float) -> None:
        """``task.tool_timeout_s`` as the sandbox's wall-clock limit of a cell (replay included)."""
        if seconds != self.sandbox.limits.wall_s:
            self.sandbox = Sandbox(self.sandbox.limits.model_copy(update={"wall_s": seconds}))


class PythonMathTask(ToolTask):
    name = NAME
    STATE_ANCHORS = False  # the namespace is not keyed (module docstring, "No GiGPO anchors")
    # FORKABLE stays False: the cells run so far live in the python tool (PythonCells), which a fork of the
    # ToolEnv would share, so sampling.branching is refused (rollwise.compat.check_branching)

    def __init__(self, options: make.Options):
        self.options = o = options
        self.sandbox = Sandbox(o.sandbox)  # wall_s: task.tool_timeout_s, set before each cell

        def draw(rng: random.Random):
            kind = rng.choice(o.kinds)
            params = _P[kind][0](rng)
            key = f"{kind}/" + ",".join(f"{k}={v}" for k, v in params.items())
            return key, self._prompt(key, kind, params)

        train, held = draw_splits(draw, o.n_train, o.n_heldout, o.seed, NAME)
        self._train, self._heldout = tuple(train), tuple(held)

    def _prompt(self, key: str, kind: str, params: dict) -> Prompt:
        _, question, answer, _ = _P[kind]
        how = (
            "Run Python with <python>code</python> (print the result)"
            if self.options.format == "tag"
            else "Run Python with the python tool (print the result)"
        )
        text = f"{question.format(**params)} {how}, then reply with the number only."
        meta = {"kind": kind, "params": params, "cot": True}  # cot: the answer is the turn's last integer
        chat_form = chat(text, None) if self.options.format == "json" else None
        return Prompt(f"{NAME}/{key}", NAME, text, str(answer(**params)), chat_form, {**meta, **self.chat_tools()})

    def tools(self) -> list[Tool]:
        return [PythonCells(self.sandbox, self.options.max_output_chars).tool()]

    def verify(self, prompt: Prompt, completion: str) -> Verdict:
        return exact.verify(prompt, completion)

    def demo(self, prompt: Prompt) -> tuple[list[str], str]:
        cells = _P[prompt.metadata["kind"]][3]
        return [c.format(**prompt.metadata["params"]) for c in cells], str(prompt.answer)

    def demonstration(self, prompt: Prompt) -> tuple[tuple[str, str, str], ...]:
        """Without a sandboxed process: a demonstration's cells print nothing but the last, which prints
        the reference answer, so their outputs are known (the tests replay demonstrations through the
        sandbox and compare every observation). A warm start of thousands of examples would otherwise
        start thousands of sandboxed processes first."""
        fmt, tool = FORMATS[self.options.format], self.tools()[0]
        cells, answer = self.demo(prompt)
        shown = [""] * (len(cells) - 1) + [f"{prompt.answer}\n"]
        pairs = tuple((fmt.call(tool, c), fmt.result(o), "tool") for c, o in zip(cells, shown))  # each a tool call
        return (*pairs, (answer, "", "user"))

    def describe_verifier(self) -> str:
        return self.sandbox.describe()

    def verifier_facts(self) -> dict:
        return self.sandbox.ledger_facts()


def make(arg: str | None, options=None) -> PythonMathTask:
    """Task factory: ``python_math`` (no argument)."""
    if arg:
        raise UserError(f"task {NAME!r} takes no argument (got '{NAME}:{arg}')")
    return PythonMathTask(coerce_options(make.Options, options, NAME))


class _Options(ToolOptions):
    kinds: list[str] = Field(default=list(KINDS), min_length=1, description=f"problem templates, of {list(KINDS)}")
    n_train: int = Field(default=2000, ge=1, le=1_000_000, description="number of distinct train problems")
    n_heldout: int = Field(default=100, ge=1, le=100_000, description="number of distinct held-out problems")
    seed: int = Field(default=0, ge=0, description="fixes both splits")
    sandbox: Limits = Field(
        default_factory=Limits,
        description="the sandbox's limits (rollwise.verify.sandbox); a cell's wall-clock limit (sandbox start and "
        "replay of earlier cells included) is the run's task.tool_timeout_s",
    )

    @field_validator("kinds")
    @classmethod
    def _kinds(cls, v: list[str]) -> list[str]:
        bad = [k for k in v if k not in _P]
        if bad:
            raise ValueError(f"unknown kind(s) {bad}; kinds are {list(KINDS)}")
        return sorted(set(v))

    @model_validator(mode="after")
    def _wall(self):
        if "wall_s" in self.sandbox.model_fields_set:
            raise ValueError("sandbox.wall_s is not used here: set task.tool_timeout_s (the limit per cell)")
        return self


make.Options = _Options
# an environment task: rollwise.compat checks the episode keys from the config alone; its turns carry no
# state anchor (STATE_ANCHORS = False), so rollwise.compat refuses gigpo
make.compat = Compat(episodes=True, state_anchors=PythonMathTask.STATE_ANCHORS, tools=True, demonstrations=True)
