"""reasoning-gym verifier on hand-made entries (no task needed)."""

from rollwise.types import Prompt
from rollwise.verify import REGISTRY
from rollwise.verify.reasoning_gym import extract

verify = REGISTRY.get("reasoning_gym")
ENTRY = {
    "question": "Calculate 5 - 3 - 6.",
    "answer": "-4",
    "metadata": {"source_dataset": "basic_arithmetic", "source_index": 0},
}


def P(entry=ENTRY, dataset="basic_arithmetic"):
    return Prompt(
        id="p",
        task="t",
        text=entry["question"],
        answer=entry["answer"],
        metadata={"dataset": dataset, "config": {}, "entry": entry},
    )


def test_extract():
    assert extract("think\n<answer> 7 </answer>\nmore <answer>8</answer>") == ("8", "tag")
    assert extract("work\n  -4  \n\n") == ("-4", "last_line")
    assert extract(" \n ") == (None, None)


def test_scores_with_the_datasets_scorer():
    assert verify(P(), "<answer>-4</answer>").reason == "correct"
    v = verify(P(), "<answer>4</answer>")
    assert (v.score, v.reason, v.details["answer"]) == (0.0, "wrong", "4")
    assert verify(P(), "so it is\n-4").details["format"] == "last_line"
    assert verify(P(), "").reason == "no_answer"


def test_could_not_verify():
    def boom(answer, entry):
        raise KeyError("metadata")

    v = verify(P(), "<answer>-4</answer>", score_fn=boom)
    assert v.score is None and v.reason == "scorer_error" and "KeyError" in v.details["error"]
    v = verify(P(dataset="no_such_dataset"), "<answer>-4</answer>")
    assert v.score is None and v.reason == "scorer_error"
    v = verify(Prompt(id="p", task="t", text="q", answer="1"), "<answer>1</answer>")
    assert v.score is None and v.reason == "bad_reference"
