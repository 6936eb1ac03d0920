"""The built-in ``pyfunc`` task: levels, seeded disjoint splits, hidden tests, verification."""

import random

import pytest

from rollwise.config import load_config
from rollwise.registry import UserError
from rollwise.tasks import pyfunc
from rollwise.tasks.pyfunc import functions, hidden_tests, make


def test_level_sizes_by_hand():
    # level 1: 3 ops x K in 1..99 = 297; level 2: 3 x 9 (take/drop/rep) + 2 x 8 (mod/div) = 43, plus 12 named;
    # level 3: 2 x 9 x 8 compositions = 144, plus 6 two-argument functions
    assert [len(functions(lv)[0]) for lv in (1, 2, 3)] == [297, 43, 144]
    assert [len(functions(lv)[1]) for lv in (1, 2, 3)] == [0, 12, 6]


def test_hidden_tests_come_from_the_reference_expression():
    src, cases = hidden_tests("add_k_mul_m", "x", "(x + 2) * 3", 3, random.Random(0))
    for (x,), want in cases:
        assert want == (x + 2) * 3
    assert src.startswith("def check(candidate):\n    assert candidate(")
    assert src.count("assert") == 3


def test_splits_are_seeded_disjoint_and_hold_out_unseen_constants():
    a = make(None, {"levels": [1, 2, 3], "n_heldout": 30, "seed": 1, "cache": False})
    b = make(None, {"levels": [1, 2, 3], "n_heldout": 30, "seed": 1, "cache": False})
    train, held = {p.id for p in a.train_prompts()}, {p.id for p in a.heldout_prompts()}
    assert [p.id for p in a.heldout_prompts()] == [p.id for p in b.heldout_prompts()]
    assert [p.metadata["test"] for p in a.heldout_prompts()] == [p.metadata["test"] for p in b.heldout_prompts()]
    assert not train & held and len(held) == 30
    assert len(train) == 297 + 43 + 12 + 144 + 6 - 30  # every other function trains
    named = {f"pyfunc/{n}" for lv in (2, 3) for n in pyfunc.NAMED[lv]}
    assert not held & named  # held-out functions are unseen constants of trained families
    assert {p.metadata["level"] for p in a.heldout_prompts()} == {1, 2, 3}  # 10 per level
    c = make(None, {"levels": [1, 2, 3], "n_heldout": 30, "seed": 2, "cache": False})
    assert {p.id for p in c.heldout_prompts()} != held


def test_prompt_is_one_printable_line_and_hides_the_tests():
    t = make(None, {"levels": [1], "n_heldout": 4, "cache": False})
    for p in t.train_prompts()[:20]:
        assert p.text.startswith("def ") and p.text.endswith(": return ")
        assert all(32 <= ord(ch) < 127 for ch in p.text + p.answer)  # the tiny model's alphabet
        assert "assert" not in p.text
        assert t.sft_examples(1, 0)[0][1] == t.target(t.sft_examples(1, 0)[0][0])


def test_reference_passes_and_wrong_answers_fail():
    t = make(None, {"levels": [1, 2, 3], "n_heldout": 6, "workers": 1})
    by_level = {}
    for p in t.train_prompts():
        by_level.setdefault(p.metadata["level"], p)
    for p in by_level.values():
        v = t.verify(p, p.answer)
        assert v.reason == "correct", (p.id, v.details)
    add = next(p for p in t.train_prompts() if p.id.startswith("pyfunc/add_") and "_mul_" not in p.id)
    assert t.verify(add, "x").reason == "wrong_answer"
    assert t.verify(add, "x +").reason == "syntax_error"
    first, again = t.verify(add, add.answer), t.verify(add, add.answer)
    assert (first.reason, first.details["cached"], again.details["cached"]) == (
        "correct",
        False,
        True,
    )  # 2nd from the cache


def test_bad_options_fail_naming_the_key():
    with pytest.raises(UserError, match="levels"):
        load_config(data={"task": {"name": "pyfunc", "options": {"levels": [4]}}})
    with pytest.raises(UserError, match="n_heldout"):
        make(None, {"levels": [2], "n_heldout": 20})  # level 2 holds out at most 43 // 4 = 10
    with pytest.raises(UserError, match="n_train"):
        make(None, {"levels": [2], "n_heldout": 4, "n_train": 100})
    with pytest.raises(UserError, match="no argument"):
        make("x", None)
