"""Resume never rewrites history: the requested config is compared with the saved one before the
run directory is touched; incoherent changes are refused naming the keys, the safe ones (steps,
budgets, cadences) are allowed and recorded at the step they took effect."""

from __future__ import annotations

import json

import pytest

import rollwise
from conftest import as_sets, tiny_overrides
from rollwise import cli
from rollwise.config import load_config
from rollwise.registry import UserError


def _snapshot(d):
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A 2-step run with a checkpoint at its end (trained once for the module)."""
    tmp = tmp_path_factory.mktemp("resume")
    cfg = load_config(overrides=as_sets(tiny_overrides(tmp, steps=2)))
    res = rollwise.train(cfg, log=lambda m: None)
    return tmp, res.run_dir


def _copy(finished, tmp_path):
    import shutil

    src_root, run = finished
    dst = tmp_path / run.name
    shutil.copytree(run, dst, ignore=shutil.ignore_patterns(".lock"))
    return dst


def _resume_overrides(run_dir, *extra):
    return [f'run.dir="{run_dir.parent.as_posix()}"', f'run.name="{run_dir.name}"', *extra]


@pytest.mark.parametrize(
    "change, key",
    [
        ("task.name=reasoning_gym:chain_sum;task.options={}", "task.name"),
        ("train.lr=1e-5", "train.lr"),
        ("control.name=dars", "control.name"),
        ("run.seed=3", "run.seed"),
        ('model.name="tiny-m"', "model.name"),
        ("task.options.n_train=100", "task.options.n_train"),
    ],
)
def test_incoherent_change_is_refused_and_the_run_directory_is_untouched(finished, tmp_path, change, key):
    run = _copy(finished, tmp_path)
    before = _snapshot(run)
    cfg = load_config(run / "config.resolved.toml", _resume_overrides(run, *change.split(";")))
    with pytest.raises(UserError) as e:
        rollwise.train(cfg, resume=True, log=lambda m: None)
    assert key in str(e.value) and "cannot resume" in str(e.value)
    assert _snapshot(run) == before  # nothing written, truncated or deleted (config.resolved.toml included)


def test_cli_resume_with_another_task_exits_2_and_eval_still_scores_the_saved_task(finished, tmp_path, capsys):
    run = _copy(finished, tmp_path)
    before = _snapshot(run)
    with pytest.raises(SystemExit) as exc:
        cli.main(
            ["train", "--resume", str(run), "--set", "task.name=reasoning_gym:chain_sum", "--set", "task.options={}"]
        )
    out = " ".join(capsys.readouterr().out.split())
    assert exc.value.code == 2 and "task.name" in out and "Traceback" not in out
    assert _snapshot(run) == before
    assert load_config(run / "config.resolved.toml").task.name == "arithmetic"


def test_safe_change_is_allowed_and_recorded_at_its_step(finished, tmp_path):
    run = _copy(finished, tmp_path)
    cfg = load_config(run / "config.resolved.toml", _resume_overrides(run, "train.steps=3", "eval.every=1"))
    res = rollwise.train(cfg, resume=True, log=lambda m: None)
    assert res.steps == 3
    lines = [json.loads(ln) for ln in (run / "changes.jsonl").read_text().splitlines()]
    # the run had trained steps 0 and 1 (checkpoint at step 2); the new values apply from step 2 on
    assert [(ln["step"], ln["changes"]) for ln in lines] == [(2, {"eval.every": [0, 1], "train.steps": [2, 3]})]
    saved = load_config(run / "config.resolved.toml")
    assert saved.train.steps == 3 and saved.eval.every == 1
    steps = [json.loads(ln)["step"] for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2]


def test_unchanged_resume_records_nothing(finished, tmp_path):
    run = _copy(finished, tmp_path)
    cfg = load_config(run / "config.resolved.toml", _resume_overrides(run, "run.progress=false", "run.threads=1"))
    rollwise.train(cfg, resume=True, log=lambda m: None)
    assert not (run / "changes.jsonl").exists()  # where the run lives and how it shows progress are not changes


def test_resuming_a_finished_run_says_so_and_leaves_it_as_it_is(finished, tmp_path):
    run = _copy(finished, tmp_path)
    (run / "final" / "marker").write_text("kept")  # final/ rewritten would lose this
    before = _snapshot(run)
    logs = []
    cfg = load_config(run / "config.resolved.toml", _resume_overrides(run))
    res = rollwise.train(cfg, resume=True, log=logs.append)
    assert res.steps == 2 and any("already complete at step 2" in m for m in logs)
    after = _snapshot(run)
    assert {k: v for k, v in after.items() if k != ".lock"} == {k: v for k, v in before.items() if k != ".lock"}
