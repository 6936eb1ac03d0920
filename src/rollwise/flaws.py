"""Flaw detectors: where a completion's working first goes wrong (docs/architecture.md §4, the ground
floor). FAPO's flawed-positive penalty (``rollwise.reward.fapo``, arXiv 2510.22543) asks it of a
correct rollout; R3L's and SCOPE's restarts (``control/r3l.py``, ``control/scope.py``) cut a failed
rollout at its first false step. One definition, read by all three.

Detectors: a callable ``(prompt: Prompt | None, completion: str) -> int | None`` returning the
0-based index of the earliest erroneous step, ``-1`` for no error found, or ``None`` when it cannot
judge (e.g. nothing to check; read as not flawed, and counted). Chosen by name or
``"package.module:attr"`` (e.g. a GenRM client).

- ``"rule"`` (:func:`first_false_equation`): for the built-in tasks. Steps are the pieces of
  the completion between ``,`` ``;`` and newlines; every written equation ``lhs = rhs`` whose
  left side is an integer expression (``+ - *``, parentheses) is checked against the first
  number of its right side (chains ``a = b + c = d`` check each link). The first step with a false
  equation is the flaw. Built-in arithmetic with ``cot = true`` writes such traces
  (``"7+5+0=12,4+8+1=13,=132"``); an answer-only completion has nothing to check (``None``).
- ``"genrm:<run dir>"`` (``rollwise.flaws_judge``): FAPO's generative judge, a run of the
  ``fapo_judge`` task (trained with ``configs/fapo_judge.toml``), refused at load when the
  directory is missing, not a judge run, or has no checkpoint.
"""

from __future__ import annotations

import ast
import re

from rollwise.registry import Registry
from rollwise.types import Prompt

_NUM = re.compile(r"\s*[-+]?\d+")
_SAFE = re.compile(r"^[\d\s+\-*()]+$")


def int_tree_value(node: ast.AST) -> int:
    """Value of a parsed integer expression (``ast.parse(text, mode="eval")`` or its body) with
    ``+ - *``, unary signs and parentheses; ``ValueError`` for anything else. Also the calculator
    tool's evaluator (``rollwise.envs.calculator``)."""
    if isinstance(node, ast.Expression):
        return int_tree_value(node.body)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = int_tree_value(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
        a, b = int_tree_value(node.left), int_tree_value(node.right)
        return a + b if isinstance(node.op, ast.Add) else a - b if isinstance(node.op, ast.Sub) else a * b
    raise ValueError("not an integer expression")


def int_value(expr: str) -> int | None:
    """Value of an integer expression with ``+ - *`` and parentheses, or None if it is not one.
    Example: ``"2-7-0"`` -> -5; ``"-5+10"`` -> 5; ``"x+1"`` -> None."""
    expr = expr.strip()
    if not expr or not _SAFE.match(expr):
        return None
    try:
        tree = ast.parse(expr, mode="eval").body
    except SyntaxError:
        return None
    try:
        return int_tree_value(tree)
    except (ValueError, RecursionError):
        return None


def first_false_equation(prompt: Prompt | None, completion: str) -> int | None:
    """The rule detector (module docstring): index of the first step holding a false equation,
    -1 if every checked equation is true, None if the completion has no equation to check.

    Example: ``"7+5+0=12,4+8+1=14,=132"`` -> 1 (4+8+1 is 13); ``"2-7-0=-5+10=5,=35"`` -> -1;
    ``"132"`` -> None.
    """
    checked = False
    for k, step in enumerate(re.split(r"[,;\n]", completion)):
        parts = step.split("=")
        for lhs, rhs in zip(parts[:-1], parts[1:]):
            left = int_value(lhs)
            head = _NUM.match(rhs)
            if left is None or head is None:
                continue
            checked = True
            if left != int(head.group()):
                return k
    return -1 if checked else None


class _Detectors(Registry):
    """Detectors by name; one that takes an argument (``genrm:<run dir>``) is a factory class with a
    ``check(arg)`` that ``resolve`` runs (so the config load refuses a bad argument before any work) and
    that ``get`` builds once per argument (a judge model is loaded once, not per call)."""

    def __init__(self, family: str):
        super().__init__(family)
        self._built: dict[str, object] = {}

    def resolve(self, name: str):
        res = super().resolve(name)
        if res.arg is not None and hasattr(res.obj, "check"):
            res.obj.check(res.arg)
        return res

    def get(self, name: str):
        res = self.resolve(name)
        if res.arg is None or not hasattr(res.obj, "check"):
            return res.obj
        if name not in self._built:
            self._built[name] = res.obj(res.arg)
        return self._built[name]


DETECTORS = _Detectors("flaw detector")
DETECTORS.register("rule", first_false_equation)
DETECTORS.register("genrm", "rollwise.flaws_judge:GenRMDetector", takes_arg=True)  # FAPO's trained judge
