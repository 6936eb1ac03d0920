"""jsonl:<path>: happy path, splits, and every user error naming file / line / field."""

import json

import pytest

from rollwise.registry import UserError
from rollwise.tasks import REGISTRY
from rollwise.types import Task


def make(path, **options):
    r = REGISTRY.resolve(f"jsonl:{path}")
    return r.obj(r.arg, options)


def write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.fixture
def data(tmp_path):
    rows = [
        {"question": f"What is {i}+{i}?", "answer": str(2 * i), "solution": f"\\boxed{{{2 * i}}}"} for i in range(20)
    ]
    return write(tmp_path / "train.jsonl", rows)


def test_happy_path(data):
    t = make(data, system_prompt="Put the answer in \\boxed{}.")
    assert isinstance(t, Task)
    train, held = t.train_prompts(), t.heldout_prompts()
    assert len(train) == 18 and len(held) == 2  # 10% of 20 distinct questions
    assert not {p.text for p in train} & {p.text for p in held}
    assert len({p.id for p in (*train, *held)}) == 20
    p = train[0]
    assert p.messages[0]["role"] == "system" and p.messages[1] == {"role": "user", "content": p.text}
    assert p.metadata["source"] == str(data) and p.id.startswith(f"jsonl:{data}/line-")
    assert t.verify(p, f"So \\boxed{{{p.answer}}}").score == 1.0
    assert t.verify(p, "So \\boxed{-1}").score == 0.0
    assert [q.text for q in make(data).heldout_prompts()] == [q.text for q in held]  # fixed by seed


def test_options(data, tmp_path):
    t = make(data, chat=False, heldout_fraction=0.5, seed=3, answer_field="solution", solution_field="solution")
    assert t.train_prompts()[0].messages is None and len(t.heldout_prompts()) == 10
    with pytest.raises(NotImplementedError, match="solution_field"):
        make(data).sft_examples(2, 0)
    ex = t.sft_examples(4, seed=0)
    assert all(target == p.metadata["solution"] for p, target in ex)
    assert len(make(data, heldout_fraction=0.0).heldout_prompts()) == 0
    held = write(
        tmp_path / "held.jsonl", [{"question": "What is 0+0?", "answer": 0}, {"question": "new", "answer": 1.5}]
    )
    t = make(data, heldout_path=str(held))
    assert len(t.train_prompts()) == 19 and t.dropped_overlap == 1
    assert [p.answer for p in t.heldout_prompts()] == ["0", "1.5"]
    assert t.heldout_prompts()[0].id.endswith("/heldout-line-1")


def test_duplicate_questions_stay_on_one_side(tmp_path):
    rows = [{"question": f"q{i % 5}", "answer": "1"} for i in range(20)]
    t = make(write(tmp_path / "d.jsonl", rows), heldout_fraction=0.2)
    assert len(t.heldout_prompts()) == 4 and len({p.text for p in t.heldout_prompts()}) == 1
    assert not {p.text for p in t.train_prompts()} & {p.text for p in t.heldout_prompts()}


@pytest.mark.parametrize(
    "rows, options, match",
    [
        (
            ['{"question": "a", "answer": "1"}', "", '{"question": "b", "answer": '],
            {},
            r"bad\.jsonl line 3: malformed JSON",
        ),
        (['{"question": "a", "answer": "1"}', "[1, 2]"], {}, r"bad\.jsonl line 2: expected a JSON object"),
        (
            ['{"question": "a", "answer": "1"}', '{"q": "b", "answer": "2"}'],
            {},
            r"bad\.jsonl line 2: missing field 'question'",
        ),
        (['{"question": "a"}'], {}, r"bad\.jsonl line 1: missing field 'answer'"),
        (['{"question": "a", "answer": null}'], {}, r"bad\.jsonl line 1: field 'answer' must be"),
        (['{"question": "", "answer": "1"}'], {}, r"bad\.jsonl line 1: field 'question' must be"),
        (
            ['{"prob": "a", "answer": "1"}'],
            {"question_field": "problem"},
            r"bad\.jsonl line 1: missing field 'problem'",
        ),
        (["", "  "], {}, r"bad\.jsonl has no rows"),
        (['{"question": "a", "answer": "1"}'], {}, r"1 distinct question"),
        (['{"question": "a", "answer": "1"}'], {"verifier": "nope"}, r"unknown verifier 'nope'"),
        (['{"question": "a", "answer": "1"}'], {"system_prompt": "x", "chat": False}, r"system_prompt needs chat"),
        (['{"question": "a", "answer": "1"}'], {"heldout_fraction": 1.0}, r"heldout_fraction"),
    ],
)
def test_user_errors(tmp_path, rows, options, match):
    with pytest.raises(UserError, match=match):
        make(write(tmp_path / "bad.jsonl", rows), **options)


def test_missing_files(tmp_path, data):
    with pytest.raises(UserError, match=r"file not found: .*nope\.jsonl"):
        make(tmp_path / "nope.jsonl")
    with pytest.raises(UserError, match=r"file not found: .*held\.jsonl"):
        make(data, heldout_path=str(tmp_path / "held.jsonl"))
    with pytest.raises(UserError, match="needs a file"):
        REGISTRY.resolve("jsonl:x").obj(None, {})
