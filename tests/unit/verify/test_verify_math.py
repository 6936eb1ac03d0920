"""math-verify verifier: equivalences, wrong answers, could-not-verify, threads."""

import threading

import pytest

from rollwise.types import Prompt
from rollwise.verify import REGISTRY

verify = REGISTRY.get("math")


def P(answer):
    return Prompt(id="p", task="t", text="q", answer=answer)


@pytest.mark.parametrize(
    "gold, completion, answer",
    [
        ("42", "so the answer is \\boxed{42}", "42"),
        ("\\boxed{42}", "42", "42"),
        ("0.5", "1/2", "1/2"),
        ("1/2", "$\\frac{1}{2}$", "1/2"),
        ("(1, 2)", "$(1,2)$", "Interval.open(1, 2)"),
        ("1000", "\\boxed{1,000}", "1000"),
    ],
)
def test_correct(gold, completion, answer):
    v = verify(P(gold), completion)
    assert (v.score, v.reason, v.details["answer"]) == (1.0, "correct", answer)


def test_wrong_and_no_answer():
    v = verify(P("42"), "The answer is 41.")
    assert (v.score, v.reason, v.details["answer"]) == (0.0, "wrong", "41")
    assert verify(P("(1, 2)"), "2").score == 0.0  # the gold is an interval, not its last number
    for text in ["", "I do not know"]:
        v = verify(P("42"), text)
        assert (v.score, v.reason, v.details["answer"]) == (0.0, "no_answer", None)


def test_only_the_tail_is_read():
    assert verify(P("7"), "\\boxed{7}" + " filler" * 500).reason == "no_answer"
    assert verify(P("7"), "filler " * 500 + "\\boxed{7}").score == 1.0


def test_could_not_verify(monkeypatch):
    for gold in [None, "", "\\frac{1}{"]:
        v = verify(P(gold), "\\boxed{1}")
        assert v.score is None and v.reason == "bad_reference"

    import math_verify

    def boom(*a, **k):
        raise RuntimeError("sympy blew up")

    monkeypatch.setattr(math_verify, "verify", boom)
    v = verify(P("42"), "\\boxed{42}")
    assert v.score is None and v.reason == "verifier_error" and "sympy blew up" in v.details["error"]


def test_timeout_is_could_not_verify(monkeypatch):
    import math_verify
    from math_verify.errors import TimeoutException

    def slow(*a, **k):
        raise TimeoutException("Timeout during comparison")

    monkeypatch.setattr(math_verify, "verify", slow)
    v = verify(P("42"), "\\boxed{42}")
    assert v.score is None and v.reason == "verifier_timeout"


def test_works_off_the_main_thread():
    out = []
    t = threading.Thread(target=lambda: out.append(verify(P("0.5"), "\\boxed{\\frac{1}{2}}")))
    t.start()
    t.join()
    assert out[0].score == 1.0
