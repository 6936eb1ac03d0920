"""Bad input fails before any model is loaded, with a message naming the culprit and no
traceback (exit status 2)."""

import pytest

from rollwise import cli, components


@pytest.fixture(autouse=True)
def _no_model(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a model was loaded before the input was validated")

    monkeypatch.setattr(components, "build_policy", refuse)


def _run(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    out = capsys.readouterr()
    text = " ".join((out.out + out.err).split())  # unwrap rich's line folding
    assert exc.value.code == 2, text
    assert "Traceback" not in text
    return text


def _train(tmp_path, *sets):
    args = ["train", "--set", f"run.dir={tmp_path}", "--set", "run.progress=false"]
    for s in sets:
        args += ["--set", s]
    return args


def _jsonl(tmp_path, text, name="data.jsonl"):
    p = tmp_path / name
    p.write_text(text)
    return p


CASES = [
    ("unknown task", ["task.name=nope"], "unknown task 'nope'"),
    ("unknown model", ["model.name=nope-model"], "nope-model"),
    ("unknown controller", ["control.name=dars9"], "unknown controller 'dars9'; known: "),
    ("unknown objective", ["objective.name=ppo9"], "unknown objective 'ppo9'"),
    ("unknown advantage", ["advantage.name=zzz"], "unknown advantage 'zzz'"),
    ("unknown filter", ["filter.names=['nofilter']"], "unknown filter 'nofilter'"),
    ("unknown key", ["train.stepz=3"], "train.stepz"),
    ("unknown section", ["bogus.key=1"], "bogus"),
    ("bad type", ["train.steps=abc"], "train.steps"),
    ("out of range", ["sampling.temperature=-1"], "sampling.temperature"),
    ("bad strategy option", ["objective.options={clip_epz=0.3}"], "clip_epz"),
    ("bad option range", ["objective.options={clip_eps=-1.0}"], "clip_eps"),
    ("bad task option", ["task.options={levels=[9]}"], "levels"),
    ("k above samples", ["eval.k=[9]"], "eval.k"),
    ("unknown reasoning-gym dataset", ["task.name=reasoning_gym:not_a_dataset"], "not_a_dataset"),
]


@pytest.mark.parametrize("label, sets, needle", CASES, ids=[c[0] for c in CASES])
def test_config_errors(tmp_path, capsys, label, sets, needle):
    assert needle in _run(_train(tmp_path, *sets), capsys)


def test_missing_config_file(tmp_path, capsys):
    assert "config file not found" in _run(["train", "--config", str(tmp_path / "nope.toml")], capsys)


def test_missing_jsonl_file(tmp_path, capsys):
    text = _run(_train(tmp_path, f"task.name=jsonl:{tmp_path}/missing.jsonl"), capsys)
    assert "missing.jsonl" in text


def test_malformed_jsonl_line_is_named(tmp_path, capsys):
    p = _jsonl(tmp_path, '{"question": "1+1", "answer": "2"}\n{"question": "2+2", "answer": \n')
    text = _run(_train(tmp_path, f"task.name=jsonl:{p}"), capsys)
    assert "line 2" in text and "data.jsonl" in text


def test_missing_answer_field_is_named(tmp_path, capsys):
    p = _jsonl(tmp_path, '{"question": "1+1", "answer": "2"}\n{"question": "2+2"}\n')
    text = _run(_train(tmp_path, f"task.name=jsonl:{p}"), capsys)
    assert "answer" in text and "line 2" in text


def test_empty_dataset(tmp_path, capsys):
    p = _jsonl(tmp_path, "")
    assert "empty" in _run(_train(tmp_path, f"task.name=jsonl:{p}"), capsys).lower()


def test_unknown_verifier(tmp_path, capsys):
    p = _jsonl(tmp_path, '{"question": "1+1", "answer": "2"}\n' * 3)
    text = _run(_train(tmp_path, f"task.name=jsonl:{p}", 'task.options={verifier="nope"}'), capsys)
    assert "unknown verifier 'nope'" in text


def test_unwritable_run_directory(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    text = _run(["train", "--set", f"run.dir={blocker}", "--set", "run.name=x"], capsys)
    assert "not writable" in text and str(blocker) in text


def test_existing_run_directory_is_not_clobbered(tmp_path, capsys):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "metrics.jsonl").write_text("{}\n")
    text = _run(_train(tmp_path, "run.name=r"), capsys)
    assert "already exists" in text and "--resume" in text


def test_resume_without_run(tmp_path, capsys):
    assert "no config.resolved.toml" in _run(["train", "--resume", str(tmp_path / "none")], capsys)


def test_bad_override_syntax(tmp_path, capsys):
    assert "bad override" in _run(["train", "--set", "no_equals_sign"], capsys)
