"""FAPO's flawed-positive penalty and its pluggable flaw detectors (reward shaping, ``[reward.fapo]``).

Paper: "Flawed-Aware Policy Optimization for Efficient and Reliable Reasoning" (FAPO),
arXiv 2510.22543 (ICLR 2026); code verl ``recipe/fapo`` (``reward_fn_reasoning.py``);
guidance.md §6. A *flawed positive* is a rollout with the right final answer but unreliable
reasoning (a guessed answer, a wrong step). Per rollout the paper's reward is ``R_RLVR + R_delta``
with ``R_RLVR = +1`` (correct) / ``-1`` (wrong) and ``R_delta = -lambda * 1[flawed]``, ``lambda = 1``:
+1 fully correct, 0 flawed positive, -1 wrong. A detector (FAPO-GenRM-4B in the paper) names the
*earliest* erroneous step of a correct rollout, or -1; only correct rollouts of the training
split are checked, and an output that cannot be parsed counts as **not** flawed.

Here (:func:`fapo_penalty`), on rollwise's 0/1 verifier scores: a row whose score is
``>= correct_at`` is checked by the detector; if it names a step the row's reward drops by
``penalty`` (default 0.5). ``0.5`` is the paper's ``lambda = 1`` moved to the 0/1 scale: the
paper's rewards are the affine image ``2r - 1`` of 0/1 scores, a flawed positive sits at the
midpoint (0 of [-1, 1], 0.5 of [0, 1]), and GRPO's ``(r - mean) / std`` is unchanged by that map
(up to ``eps``). So a flawed positive's advantage is positive iff the group has more wrong than
fully-correct rows, negative iff fewer, and 0 at equality (the paper's "parameter-free" switch).
Evaluation never shapes rewards, so the detector never sees held-out prompts.

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

Deviation: the paper's detector is a trained generative reward model that judges any reasoning;
the rule detector only catches false arithmetic in written equations (it cannot see a guessed
answer with no working). GenRM training (the process reward ``1 - |t_hat - t*| / n``) is not built.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Mapping, Sequence

import torch

from rollwise.registry import Registry
from rollwise.types import Prompt, Rollout

_NUM = re.compile(r"\s*[-+]?\d+")
_SAFE = re.compile(r"^[\d\s+\-*()]+$")


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

    def ev(node) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
            a, b = ev(node.left), ev(node.right)
            return a + b if isinstance(node.op, ast.Add) else a - b if isinstance(node.op, ast.Sub) else a * b
        raise ValueError("not an integer expression")

    try:
        return ev(tree)
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


DETECTORS = Registry("flaw detector")
DETECTORS.register("rule", first_false_equation)


def fapo_penalty(
    rows: Sequence[Rollout], prompts: Mapping[str, Prompt], detector: Callable, penalty: float, correct_at: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """(B,) reward deltas (``-penalty`` on flawed positives, 0 elsewhere) and ``fapo/*`` metrics.

    Only rows with score ``>= correct_at`` are passed to ``detector``. Metrics:
    ``fapo/flawed_frac`` (flawed among the checked rows), ``fapo/undecided_frac``
    (checked rows the detector could not judge), ``fapo/checked`` (detector calls).
    """
    delta = torch.zeros(len(rows))
    checked = flawed = undecided = 0
    for i, r in enumerate(rows):
        if r.reward is None or r.reward < correct_at:
            continue
        checked += 1
        step = detector(prompts.get(r.prompt_id), r.text)
        if step is None:
            undecided += 1
        elif step != -1:
            flawed += 1
            delta[i] = -penalty
    n = max(checked, 1)
    return delta, {"fapo/flawed_frac": flawed / n, "fapo/undecided_frac": undecided / n, "fapo/checked": float(checked)}
