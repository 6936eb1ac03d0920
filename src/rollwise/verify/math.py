"""Math verifier (math-verify): ``verify(prompt, completion) -> Verdict``.

Contract:

- Gold: ``prompt.answer``, a bare answer (``"42"``, ``"\\frac{1}{2}"``, ``"(1, 2)"``), parsed as
  LaTeX math (wrapped in ``$...$``), else as plain text; if it already contains ``$`` or
  ``\\boxed`` it is parsed as it is. Missing or unparseable -> ``Verdict(None, "bad_reference")``.
- Prediction: math-verify's extraction (``\\boxed{}``, ``$...$``, "the answer is", last number)
  on the last ``MAX_CHARS`` characters of the completion. Nothing found -> ``Verdict(0.0,
  "no_answer")``.
- Comparison: ``math_verify.verify(gold, pred)``, gold first (it is not symmetric). 1.0
  ``"correct"`` or 0.0 ``"wrong"``; ``details["answer"]`` is the parsed prediction as a string
  (sympy's form, so ``1/2`` and ``\\frac{1}{2}`` vote together in maj@k).
- Failures are "could not verify", never 0: an exception -> ``Verdict(None, "verifier_error")``,
  a timeout -> ``Verdict(None, "verifier_timeout")``.

Threads: math-verify's timeouts use ``signal.alarm``, which raises outside the main thread. On the
main thread we keep its timeouts (``TIMEOUT_S``); elsewhere we switch them off, and the bounded
input (``MAX_CHARS``) is what keeps a call short; run it in a process pool for a hard limit.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from rollwise.types import Prompt, Verdict

MAX_CHARS = 1000  # only the tail of a completion is searched for the answer
TIMEOUT_S = 5  # per parse / comparison, main thread only


def _timeout() -> int | None:
    return TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def _has_math(parsed: list) -> bool:
    from sympy import Basic, MatrixBase

    return any(isinstance(x, (Basic, MatrixBase)) for x in parsed)


@functools.lru_cache(maxsize=8192)
def _parse_gold(gold: str, timeout: int | None) -> tuple:
    from math_verify import parse

    if "$" in gold or "\\boxed" in gold:
        return tuple(parse(gold, parsing_timeout=timeout, raise_on_error=True))
    parsed = parse(f"${gold}$", parsing_timeout=timeout, raise_on_error=True)
    if not _has_math(parsed):
        parsed = parse(gold, parsing_timeout=timeout, raise_on_error=True)
    return tuple(parsed)


def verify(prompt: Prompt, completion: str) -> Verdict:
    from math_verify import parse
    from math_verify import verify as mv_verify
    from math_verify.errors import TimeoutException

    timeout = _timeout()
    gold_text = (prompt.answer or "").strip()
    if not gold_text:
        return Verdict(None, "bad_reference", {"reference": prompt.answer})
    try:
        gold = list(_parse_gold(gold_text[-MAX_CHARS:], timeout))
    except (Exception, TimeoutException) as e:
        return Verdict(None, "bad_reference", {"reference": gold_text, "error": _err(e)})
    if not _has_math(gold):
        return Verdict(None, "bad_reference", {"reference": gold_text})

    details: dict[str, Any] = {"answer": None}
    try:
        pred = parse(completion[-MAX_CHARS:], parsing_timeout=timeout, raise_on_error=True)
        if not pred:
            return Verdict(0.0, "no_answer", details)
        details["answer"] = str(pred[0])
        ok = mv_verify(gold, pred, timeout_seconds=timeout, raise_on_error=True)
    except TimeoutException as e:
        return Verdict(None, "verifier_timeout", {**details, "error": _err(e)})
    except Exception as e:
        return Verdict(None, "verifier_error", {**details, "error": _err(e)})
    return Verdict(1.0 if ok else 0.0, "correct" if ok else "wrong", details)


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:300]
