"""Default run names: distinct tasks, models, controllers and objectives get distinct names, and an
existing run directory is never silently reused (a second default run gets ``-2``)."""

import pytest

from rollwise import components
from rollwise.config import load_config
from rollwise.registry import UserError


def _name(*sets):
    return load_config(overrides=list(sets)).run_name()


def test_default_name_spells_out_task_model_controller_objective_seed():
    assert _name() == "arithmetic-tiny-uniform-grpo-s0"
    assert _name("run.seed=2", "objective.name=dapo") == "arithmetic-tiny-uniform-dapo-s2"


def test_reasoning_gym_datasets_and_models_get_distinct_names():
    names = {
        _name("task.name=reasoning_gym:chain_sum"),
        _name("task.name=reasoning_gym:leg_counting"),
        _name("task.name=reasoning_gym:chain_sum", 'model.name="tiny-m"'),
        _name(),
    }
    assert len(names) == 4
    assert "rg.chain_sum-tiny-uniform-grpo-s0" in names


def test_jsonl_task_name_uses_the_file_stem(tmp_path):
    p = tmp_path / "my data.jsonl"
    p.write_text('{"question": "1+1", "answer": "2"}\n{"question": "2+2", "answer": "4"}\n')
    assert _name(f'task.name="jsonl:{p}"') == "jsonl.my_data-tiny-uniform-grpo-s0"


def test_an_existing_default_name_is_not_reused(tmp_path):
    cfg = load_config(overrides=[f'run.dir="{tmp_path}"'])
    first = cfg.with_run_name()
    assert first.run.name == "arithmetic-tiny-uniform-grpo-s0" and cfg.run.name is None  # a copy, the input unchanged
    (tmp_path / first.run.name).mkdir()
    assert cfg.with_run_name().run.name == first.run.name  # an empty directory holds no run
    (tmp_path / first.run.name / "metrics.jsonl").write_text("")
    assert cfg.with_run_name().run.name == first.run.name + "-2"
    (tmp_path / (first.run.name + "-2")).mkdir()
    (tmp_path / (first.run.name + "-2") / "metrics.jsonl").write_text("")
    assert cfg.with_run_name().run.name == first.run.name + "-3"


def test_an_explicit_existing_name_is_refused(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "metrics.jsonl").write_text("")
    cfg = load_config(overrides=[f'run.dir="{tmp_path}"', 'run.name="mine"'])
    assert cfg.with_run_name().run.name == "mine"
    with pytest.raises(UserError, match="already exists"):
        components.prepare_run_dir(cfg, resume=False)


def test_a_run_that_fails_validation_leaves_no_directory(tmp_path, monkeypatch):
    import rollwise

    monkeypatch.setattr(components, "build_policy", lambda *a, **k: pytest.fail("model loaded before validation"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"q": "1+1", "answer": "2"}\n')
    cfg = load_config(overrides=[f'run.dir="{tmp_path / "runs"}"', 'run.name="r"', f'task.name="jsonl:{bad}"'])
    with pytest.raises(UserError):
        rollwise.train(cfg, log=lambda m: None)
    assert not (tmp_path / "runs" / "r").exists()
