"""reasoning_gym:<dataset> with a small real dataset."""

import pytest

from rollwise.registry import UserError
from rollwise.tasks import REGISTRY
from rollwise.types import Task


def make(dataset, **options):
    r = REGISTRY.resolve(f"reasoning_gym:{dataset}")
    return r.obj(r.arg, options)


def test_leg_counting_splits_and_scoring():
    t = make("leg_counting", size=30, heldout_size=10, seed=1)
    assert isinstance(t, Task) and t.name == "reasoning_gym:leg_counting"
    train, held = t.train_prompts(), t.heldout_prompts()
    assert len(train) == 30 and len(held) == 10
    assert not {p.text for p in train} & {p.text for p in held}
    assert len({p.id for p in (*train, *held)}) == 40
    p = held[0]
    assert p.messages[0]["role"] == "system" and "<answer>" in p.messages[0]["content"]
    assert p.messages[-1] == {"role": "user", "content": p.text}
    assert p.metadata["entry"]["answer"] == p.answer
    right = t.verify(p, f"I counted.\n<answer>{p.answer}</answer>")
    assert (right.score, right.reason, right.details["answer"]) == (1.0, "correct", p.answer)
    wrong = t.verify(p, f"<answer>{int(p.answer) + 1}</answer>")
    assert (wrong.score, wrong.reason) == (0.0, "wrong")


def test_deterministic_by_seed():
    a, b = make("basic_arithmetic", size=5, heldout_size=5), make("basic_arithmetic", size=5, heldout_size=5)
    assert [p.text for p in a.heldout_prompts()] == [p.text for p in b.heldout_prompts()]
    c = make("basic_arithmetic", size=5, heldout_size=5, seed=9)
    assert [p.text for p in a.train_prompts()] != [p.text for p in c.train_prompts()]


def test_config_and_system_prompt_options():
    t = make("basic_arithmetic", size=5, heldout_size=2, system_prompt="", config={"min_terms": 2, "max_terms": 2})
    p = t.train_prompts()[0]
    assert p.messages == ({"role": "user", "content": p.text},)
    assert p.metadata["entry"]["metadata"]["num_terms"] == 2
    assert make("leg_counting", size=2, heldout_size=1, system_prompt="Be brief.").train_prompts()[0].messages[0] == {
        "role": "system",
        "content": "Be brief.",
    }
    ex = t.sft_examples(3, seed=0)
    assert len(ex) == 3 and all(target == f"<answer>{p.answer}</answer>" for p, target in ex)
    assert all(t.verify(p, target).score == 1.0 for p, target in ex)


def test_user_errors():
    with pytest.raises(UserError, match="leg_counting"):
        make("leg_countin")
    with pytest.raises(UserError, match="needs a dataset"):
        REGISTRY.resolve("reasoning_gym:x").obj(None, {})
    with pytest.raises(UserError, match="bogus"):
        make("leg_counting", config={"bogus": 1})
    with pytest.raises(UserError, match="seed"):
        make("leg_counting", config={"seed": 1})
    with pytest.raises(UserError, match="max_animals must be >= min_animals"):
        make("leg_counting", config={"min_animals": 5, "max_animals": 2})
    with pytest.raises(UserError, match="heldout_size"):
        make("leg_counting", heldout_size=0)


# ---------------------------------------------------------------- composite (a weighted mixture)


def test_composite_mixture_from_toml_tables():
    from rollwise.tasks.reasoning_gym import make

    cfg = {
        "datasets": [
            {
                "name": "basic_arithmetic",
                "weight": 1,
                "config": {
                    "min_terms": 2,
                    "max_terms": 2,
                    "min_digits": 1,
                    "max_digits": 1,
                    "operators": ["+"],
                    "allow_parentheses": False,
                    "allow_negation": False,
                },
            },
            {"name": "leg_counting", "weight": 1, "config": {"min_animals": 1, "max_animals": 2}},
        ]
    }
    task = make("composite", {"size": 12, "heldout_size": 4, "config": cfg, "system_prompt": ""})
    sources = {p.metadata["entry"]["metadata"]["source_dataset"] for p in task.train_prompts()}
    assert sources == {"basic_arithmetic", "leg_counting"}
    p = task.train_prompts()[0]
    assert task.verify(p, f"<answer>{p.answer}</answer>").score == 1.0
    assert task.verify(p, "<answer>nonsense</answer>").score == 0.0
    assert len(task.heldout_prompts()) == 4


def test_composite_bad_row_names_its_index():
    from rollwise.tasks.reasoning_gym import make

    with pytest.raises(UserError, match=r"config.datasets\[1\]"):
        make("composite", {"size": 4, "config": {"datasets": [{"name": "leg_counting"}, "chain_sum"]}})
