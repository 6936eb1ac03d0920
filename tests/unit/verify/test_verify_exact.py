"""Exact integer verifier."""

import pytest

from rollwise.types import Prompt
from rollwise.verify import REGISTRY
from rollwise.verify.exact import last_int

verify = REGISTRY.get("exact")


def P(answer, cot=False):
    return Prompt(id="p", task="t", text="12+34=", answer=answer, metadata={"cot": cot})


@pytest.mark.parametrize(
    "completion, score, reason, answer",
    [
        ("46", 1.0, "correct", "46"),
        (" 46\n", 1.0, "correct", "46"),
        ("046", 1.0, "correct", "46"),
        ("+46", 1.0, "correct", "46"),
        ("45", 0.0, "wrong", "45"),
        ("-46", 0.0, "wrong", "-46"),
        ("", 0.0, "no_answer", None),
        ("46 apples", 0.0, "no_answer", None),
        ("4 6", 0.0, "no_answer", None),
    ],
)
def test_direct(completion, score, reason, answer):
    v = verify(P("46"), completion)
    assert (v.score, v.reason, v.details["answer"]) == (score, reason, answer)


def test_bad_reference_is_could_not_verify():
    for ref in ["4.5", "forty-six", "", None]:
        v = verify(P(ref), "46")
        assert v.score is None and v.reason == "bad_reference"


def test_cot_reads_last_integer():
    assert verify(P("46", cot=True), "2+4+0=6,1+3+0=4,=46").score == 1.0
    assert verify(P("41", cot=True), "...;6-5-0=1,4-0-0=4,=41").score == 1.0
    assert verify(P("46", cot=True), "=46,=47").score == 0.0
    assert verify(P("46", cot=True), "no digits").reason == "no_answer"
    assert last_int("5-4") == 4 and last_int("x=-4") == -4 and last_int("a") is None
