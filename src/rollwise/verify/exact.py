"""Exact integer verifier: ``verify(prompt, completion) -> Verdict``.

Contract:

- The reference ``prompt.answer`` must be an integer written in decimal (``"46"``, ``"-3"``);
  anything else gives ``Verdict(None, "bad_reference")`` (could not verify, never 0).
- The completion's answer is read in one of two ways, chosen by ``prompt.metadata["cot"]``:

  * direct (default): the whole completion, stripped of surrounding whitespace, must be an
    integer; ``"46"`` and ``" 46\\n"`` are answers, ``"46 apples"`` is not.
  * chain of thought (``cot`` true): the last integer in the completion (``"...,=46"`` -> 46).
    A ``-`` counts as a sign only when it does not follow a digit, so ``"5-4"`` ends in ``4``.

- No answer found: ``Verdict(0.0, "no_answer")``. Otherwise 1.0 ``"correct"`` or 0.0 ``"wrong"``
  by integer equality, with ``details["answer"]`` the normalised integer (``"046"`` -> ``"46"``)
  so maj@k voting compares like with like.
"""

from __future__ import annotations

import re

from rollwise.types import Prompt, Verdict

_INT = re.compile(r"[+-]?\d+")
_LAST_INT = re.compile(r"(?:(?<![0-9])-)?\d+")


def parse_int(text: str) -> int | None:
    """The integer ``text`` spells (surrounding whitespace allowed), else None."""
    text = text.strip()
    return int(text) if _INT.fullmatch(text) else None


def last_int(text: str) -> int | None:
    """The last integer in ``text`` (see the module docstring for the sign rule), else None."""
    matches = _LAST_INT.findall(text)
    return int(matches[-1]) if matches else None


def verify(prompt: Prompt, completion: str) -> Verdict:
    ref = parse_int(prompt.answer) if isinstance(prompt.answer, str) else None
    if ref is None:
        return Verdict(None, "bad_reference", {"reference": prompt.answer})
    got = last_int(completion) if prompt.metadata.get("cot") else parse_int(completion)
    if got is None:
        return Verdict(0.0, "no_answer", {"answer": None})
    ok = got == ref
    return Verdict(1.0 if ok else 0.0, "correct" if ok else "wrong", {"answer": str(got)})
