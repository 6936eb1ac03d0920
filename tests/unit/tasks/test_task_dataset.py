"""Task ``dataset:<handle>`` (rollwise.tasks.dataset): TRL-format rows from a list, a datasets.Dataset or
a JSON-lines file; every mistake names the row and column; the reward functions get the row's columns."""

import json

import pytest

from rollwise.registry import UserError
from rollwise.tasks import REGISTRY
from rollwise.tasks.dataset import read_rows, register
from rollwise.verify.functions import RewardFunctions


def exact(prompts, completions, answer, **kwargs):
    return [float(c.strip() == str(a)) for c, a in zip(completions, answer)]


ROWS = [{"prompt": f"{a}+1=", "answer": a + 1} for a in range(10)]


def make(rows=ROWS, heldout=None, funcs=(exact,), **options):
    handle = register(
        read_rows(rows, "dataset"), heldout and read_rows(heldout, "eval_dataset"), RewardFunctions(list(funcs))
    )
    r = REGISTRY.resolve(f"dataset:{handle}")
    return r.obj(r.arg, options)


def test_rows_split_and_verify_with_their_columns():
    task = make(heldout_fraction=0.2)
    train, held = task.train_prompts(), task.heldout_prompts()
    assert len(train) == 8 and len(held) == 2  # 20% of 10 distinct prompts
    assert {p.text for p in train}.isdisjoint({p.text for p in held})
    p = train[0]
    n = p.metadata["row"]
    assert p.id == f"{task.name}/row-{n}" and p.text == f"{n - 1}+1=" and p.messages is None
    assert task.verify(p, str(n)).score == 1.0  # row n holds a = n - 1, answer n
    assert task.verify(p, str(n + 1)).score == 0.0


def test_conversational_rows_give_messages_and_an_assistant_completion():
    rows = [
        {
            "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"{a}+1?"}],
            "answer": a + 1,
        }
        for a in range(4)
    ]
    seen = []

    def spy(prompts, completions, answer, **kwargs):
        seen.append((prompts[0], completions[0]))
        return [1.0]

    task = make(rows, funcs=[spy], heldout_fraction=0.25)
    p = task.train_prompts()[0]
    assert p.messages[-1] == {"role": "user", "content": p.text} and p.messages[0]["role"] == "system"
    task.verify(p, "5")
    assert seen == [(rows[p.metadata["row"] - 1]["prompt"], [{"role": "assistant", "content": "5"}])]


def test_a_datasets_dataset_and_a_jsonl_file_and_an_eval_dataset(tmp_path):
    datasets = pytest.importorskip("datasets")
    task = make(datasets.Dataset.from_list(ROWS), heldout=ROWS[:2])
    assert len(task.train_prompts()) == 10 and [p.id.rsplit("/", 1)[1] for p in task.heldout_prompts()] == [
        "eval-row-1",
        "eval-row-2",
    ]
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n\n")
    task = make(str(path), heldout_fraction=0.1)
    assert task.name.startswith("dataset:mine-") and len(task.train_prompts()) == 9


def test_mistakes_name_the_row_and_column(tmp_path):
    with pytest.raises(UserError, match=r"dataset row 2: no 'prompt' column \(the row has \['answer', 'question'\]\)"):
        read_rows([ROWS[0], {"question": "1+1=", "answer": 2}], "dataset")
    with pytest.raises(UserError, match=r"dataset row 1 column 'prompt': give a string or a list of chat messages"):
        read_rows([{"prompt": [{"role": "user"}]}], "dataset")
    with pytest.raises(UserError, match=r"dataset row 3 column 'prompt': empty text"):
        read_rows([ROWS[0], ROWS[1], {"prompt": "  "}], "dataset")
    with pytest.raises(UserError, match="dataset has no rows"):
        read_rows([], "dataset")
    with pytest.raises(UserError, match="give a datasets.Dataset, a list of dicts or a JSON-lines path, not dict"):
        read_rows({"prompt": ["1+1="]}, "dataset")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1="}\n{"prompt": \n')
    with pytest.raises(UserError, match=r"bad.jsonl line 2: malformed JSON"):
        read_rows(str(bad), "dataset")
    with pytest.raises(UserError, match="dataset file not found"):
        read_rows(str(tmp_path / "none.jsonl"), "dataset")


def test_a_handle_this_process_does_not_hold_is_refused_with_the_reason():
    with pytest.raises(UserError, match="live only in the process that called rollwise.train"):
        REGISTRY.resolve("dataset:rows-0000000000").obj("rows-0000000000", {})


def test_the_reward_error_names_the_data_row():
    def boom(prompts, completions, **kwargs):
        raise ValueError("no parser")

    task = make(funcs=[boom], heldout_fraction=0.1)
    p = task.train_prompts()[0]
    with pytest.raises(
        UserError, match=rf"reward function 'boom' raised ValueError: no parser \(dataset row {p.metadata['row']}\)"
    ):
        task.verify(p, "1")


def test_a_redefined_function_of_the_same_name_gets_its_own_handle():
    def score(prompts, completions, **kwargs):
        return [1.0]

    first = make(funcs=[score], heldout_fraction=0.1)

    def score(prompts, completions, **kwargs):  # noqa: F811 - redefined, as in a notebook
        return [0.0]

    second = make(funcs=[score], heldout_fraction=0.1)
    again = make(funcs=[score], heldout_fraction=0.1)
    assert first.name != second.name == again.name and second.name == first.name + "-2"
    p = first.train_prompts()[0]
    assert first.verify(p, "1").score == 1.0 and second.verify(second.train_prompts()[0], "1").score == 0.0
