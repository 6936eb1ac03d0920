"""Task ``hf:<path>``: local files through the datasets library, own column names, bad rows named."""

import json

import pytest

pytest.importorskip("datasets")

from rollwise.registry import UserError  # noqa: E402
from rollwise.tasks.hf_dataset import make  # noqa: E402

ROWS = [{"q": f"What is {i} + {i}?", "a": 2 * i, "sys": "Be brief." if i % 2 else None} for i in range(10)]
OPTS = {"question_column": "q", "answer_column": "a", "heldout_fraction": 0.2}


def _write(tmp_path, fmt, rows=ROWS):
    import datasets

    ds = datasets.Dataset.from_list(rows)
    if fmt == "jsonl":
        p = tmp_path / "d.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "json":
        p = tmp_path / "d.json"
        p.write_text(json.dumps(rows))
    elif fmt == "csv":
        p = tmp_path / "d.csv"
        ds.to_csv(str(p))
    elif fmt == "parquet":
        p = tmp_path / "d.parquet"
        ds.to_parquet(str(p))
    elif fmt == "arrow":
        saved = tmp_path / "saved"
        ds.save_to_disk(str(saved))
        p = next(saved.glob("*.arrow"))
    else:  # save_to_disk directory
        p = tmp_path / "disk"
        ds.save_to_disk(str(p))
    return p


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv", "parquet", "arrow", "disk"])
def test_every_format_gives_the_same_prompts(tmp_path, fmt):
    task = make(str(_write(tmp_path, fmt)), OPTS)
    train, held = task.train_prompts(), task.heldout_prompts()
    # 10 distinct questions, 20% held out -> 8 / 2, disjoint, every row used once
    assert (len(train), len(held)) == (8, 2)
    assert {p.text for p in train}.isdisjoint({p.text for p in held})
    assert sorted(p.metadata["row"] for p in train + tuple(held)) == list(range(1, 11))
    p3 = next(p for p in train + tuple(held) if p.metadata["row"] == 4)  # row 4 = i 3: "3 + 3", answer 6
    assert p3.text == "What is 3 + 3?" and p3.answer == "6"
    assert p3.messages == ({"role": "user", "content": "What is 3 + 3?"},)
    assert p3.id == f"hf:{task.name[3:]}/row-4"


def test_system_prompt_column_and_fixed_system_prompt(tmp_path):
    path = str(_write(tmp_path, "jsonl"))
    task = make(path, dict(OPTS, system_prompt_column="sys", heldout_fraction=0.0))
    by_row = {p.metadata["row"]: p for p in task.train_prompts()}
    assert by_row[2].messages[0] == {"role": "system", "content": "Be brief."}  # i = 1: odd -> system prompt
    assert len(by_row[1].messages) == 1  # i = 0: null cell -> no system message
    fixed = make(path, dict(OPTS, system_prompt="Answer with a number.", heldout_fraction=0.0))
    assert fixed.train_prompts()[0].messages[0]["content"] == "Answer with a number."
    plain = make(path, dict(OPTS, chat=False))
    assert plain.train_prompts()[0].messages is None


def test_chat_template_renders_the_messages_for_an_instruct_tokenizer(tmp_path):
    from rollwise.tokens import Codec
    from rollwise.trainer.tiny import char_tokenizer

    tok = char_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}>{% endif %}"
    )
    task = make(str(_write(tmp_path, "jsonl")), dict(OPTS, system_prompt="S", heldout_fraction=0.0))
    p = task.train_prompts()[0]  # row 1: "What is 0 + 0?"
    ids = Codec(tok, use_chat=True).encode_prompt(p)
    assert tok.decode(list(ids)) == "<system>S<user>What is 0 + 0?>"


def test_heldout_split_of_a_datasetdict_and_heldout_path(tmp_path):
    import datasets

    dd = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(ROWS[:8]), "test": datasets.Dataset.from_list(ROWS[7:])}
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    task = make(str(tmp_path / "dd"), dict(OPTS, heldout_split="test"))
    # test holds i = 7, 8, 9; train rows 1..8 minus i = 7 (in test) -> 7 train prompts
    assert [p.text for p in task.heldout_prompts()] == [f"What is {i} + {i}?" for i in (7, 8, 9)]
    assert len(task.train_prompts()) == 7 and task.dropped_overlap == 1
    other = _write(tmp_path, "parquet", ROWS[8:])
    task2 = make(str(_write(tmp_path, "jsonl")), dict(OPTS, heldout_path=str(other)))
    assert len(task2.heldout_prompts()) == 2 and len(task2.train_prompts()) == 8
    assert task2.heldout_prompts()[0].id.endswith("/heldout-row-1")
    with pytest.raises(UserError, match=r"splits \['test', 'train'\], not 'valid'"):
        make(str(tmp_path / "dd"), dict(OPTS, heldout_split="valid"))


def test_verifiers_by_name_and_import_path(tmp_path, monkeypatch):
    pkg = tmp_path / "myverifiers"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "rules.py").write_text(
        "from rollwise.types import Verdict\ndef always_right(prompt, completion):\n    return Verdict(1.0, 'plugin')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    path = str(_write(tmp_path, "jsonl"))
    p = make(path, dict(OPTS, verifier="exact")).train_prompts()[0]
    assert make(path, dict(OPTS, verifier="exact")).verify(p, p.answer).score == 1.0
    assert make(path, dict(OPTS, verifier="exact")).verify(p, p.answer + "1").score == 0.0
    assert make(path, OPTS).verify(p, f"The answer is $\\boxed{{{p.answer}}}$").score == 1.0  # math-verify
    plugin = make(path, dict(OPTS, verifier="myverifiers.rules:always_right"))
    assert plugin.verify(p, "anything").reason == "plugin"
    with pytest.raises(UserError, match="unknown verifier 'nope'"):
        make(path, dict(OPTS, verifier="nope"))


@pytest.mark.parametrize(
    "rows, match",
    [
        ([{"q": "a", "a": 1}, {"q": "", "a": 2}], r"d.jsonl row 2 column 'q': must be a non-empty string"),
        (
            [{"q": "a", "a": 1}, {"q": "b", "a": None}, {"q": "c", "a": 3}],
            r"d.jsonl row 2 column 'a': must be a non-empty string or number",
        ),
        ([{"question": "a", "a": 1}], r"d.jsonl: no column 'q' \(the columns are \['question', 'a'\]\)"),
    ],
)
def test_bad_rows_name_file_row_and_column(tmp_path, rows, match):
    p = tmp_path / "d.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(UserError, match=match):
        make(str(p), OPTS)


def test_bad_csv_cell_and_missing_or_unreadable_files(tmp_path):
    (tmp_path / "d.csv").write_text("q,a\nWhat is 1?,1\nWhat is 2?,\n")
    with pytest.raises(UserError, match=r"d.csv row 2 column 'a'"):
        make(str(tmp_path / "d.csv"), OPTS)
    with pytest.raises(UserError, match="not found"):
        make(str(tmp_path / "none.jsonl"), OPTS)
    (tmp_path / "d.txt").write_text("x")
    with pytest.raises(UserError, match="cannot tell the format"):
        make(str(tmp_path / "d.txt"), OPTS)
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(UserError, match="cannot read .*bad.parquet"):
        make(str(tmp_path / "bad.parquet"), OPTS)


def test_config_validates_hf_options_before_any_model(tmp_path):
    from rollwise.config import load_config

    path = _write(tmp_path, "jsonl")
    with pytest.raises(UserError, match="question_colum"):
        load_config(overrides=[f'task.name="hf:{path}"', 'task.options={question_colum = "q"}'])
