"""The Python API (rollwise.api, issue #46): what it refuses, with the key or argument named, before any
model loads; the config validated on assignment as ``--set`` is."""

import pytest

import rollwise
from rollwise.config import load_config
from rollwise.registry import UserError


def exact(prompts, completions, answer, **kwargs):
    return [float(c.strip() == str(a)) for c, a in zip(completions, answer)]


ROWS = [{"prompt": f"{a}+1=", "answer": a + 1} for a in range(10)]


def test_assignment_is_validated_as_set_is_and_names_the_key():
    cfg = load_config()
    cfg.train.steps = 100
    assert cfg.train.steps == 100
    with pytest.raises(
        UserError, match=r"invalid configuration:\n  train.steps: Input should be greater than or equal to 0"
    ):
        cfg.train.steps = -1
    with pytest.raises(UserError, match=r"model.warm_start.lr: Input should be a valid number"):
        cfg.model.warm_start.lr = "fast"
    with pytest.raises(UserError, match=r"train.async.max_staleness: Input should be greater than or equal to 0"):
        cfg.train.async_.max_staleness = -1
    with pytest.raises(UserError, match=r"train.stpes"):
        cfg.train.stpes = 3
    with pytest.raises(UserError) as set_error:
        load_config(overrides=["train.steps=-1"])
    assert "train.steps: Input should be greater than or equal to 0" in str(set_error.value)  # the same line
    assert cfg.train.steps == 100  # a refused assignment leaves the value as it was
    copy = cfg.model_copy(deep=True)
    with pytest.raises(UserError, match="train.steps"):
        copy.train.steps = -2


def test_trainer_holds_a_typed_config_and_checks_it_again_at_train(tmp_path):
    trainer = rollwise.Trainer(model="tiny-s", dataset=ROWS, reward_funcs=[exact], overrides=[f"run.dir={tmp_path}"])
    assert trainer.config.model.name == "tiny-s" and trainer.config.task.name.startswith("dataset:rows-")
    trainer.config.control.name = "no_such_controller"  # a string: only the registry knows it is unknown
    with pytest.raises(UserError, match="no_such_controller"):
        trainer.train()
    assert list(tmp_path.iterdir()) == []  # refused before the run directory or the model


def test_callables_are_refused_where_they_cannot_go(tmp_path):
    o = [f"run.dir={tmp_path}", "distributed.workers=2"]
    with pytest.raises(UserError, match=r"Ray rollout worker does not have; set distributed.workers = 0"):
        rollwise.train(model="tiny-s", dataset=ROWS, reward_funcs=[exact], overrides=o)
    assert list(tmp_path.iterdir()) == []


def test_arguments_that_do_not_go_together_are_named():
    with pytest.raises(UserError, match="dataset= and reward_funcs= come together"):
        rollwise.Trainer(model="tiny-s", dataset=ROWS)
    with pytest.raises(UserError, match="dataset= and reward_funcs= come together"):
        rollwise.Trainer(model="tiny-s", reward_funcs=[exact])
    with pytest.raises(UserError, match="task.name = 'guess_number' and dataset= both say what to train on"):
        rollwise.Trainer(dataset=ROWS, reward_funcs=[exact], overrides=["task.name=guess_number"])
    with pytest.raises(UserError, match=r"reward_weights has 2 value\(s\) for 1 reward function\(s\) \(exact\)"):
        rollwise.Trainer(dataset=ROWS, reward_funcs=[exact], reward_weights=[1.0, 2.0])
    with pytest.raises(UserError, match="unknown model name 'no-such-model'"):
        rollwise.Trainer(model="no-such-model", dataset=ROWS, reward_funcs=[exact])
    with pytest.raises(UserError, match="config: give a rollwise Config, a TOML path or a dict, not list"):
        rollwise.Trainer(config=["train.steps=3"])


def test_a_loaded_model_needs_its_tokenizer_and_is_saved_once(tmp_path, monkeypatch):
    from rollwise.trainer import tiny

    monkeypatch.setenv("ROLLWISE_CACHE", str(tmp_path))
    model, tok = tiny.build_tiny("tiny-s", seed=0)
    with pytest.raises(UserError, match=r"give its tokenizer too \(tokenizer=...\)"):
        rollwise.Trainer(model=model, dataset=ROWS, reward_funcs=[exact])
    with pytest.raises(UserError, match="not int"):
        rollwise.Trainer(model=3, dataset=ROWS, reward_funcs=[exact])
    a = rollwise.Trainer(model=model, tokenizer=tok, dataset=ROWS, reward_funcs=[exact]).config.model.name
    b = rollwise.Trainer(model=model, tokenizer=tok, dataset=ROWS, reward_funcs=[exact]).config.model.name
    assert a == b and a.startswith(str(tmp_path / "api-models")) and len(list((tmp_path / "api-models").iterdir())) == 1


def test_train_cfg_keeps_working_and_a_config_object_takes_overrides(tmp_path):
    cfg = load_config(overrides=["train.steps=7"])
    t = rollwise.Trainer(config=cfg, overrides=["control.prompts_per_step=3"])
    assert (t.config.train.steps, t.config.control.prompts_per_step, t.config.task.name) == (7, 3, "arithmetic")
    assert cfg.control.prompts_per_step == 32  # the given config is left as it was


def test_a_placed_section_equals_a_fresh_one_with_the_same_values():
    """Where a section sits (its key, set for error messages) is not part of its value: the check that
    refuses episode keys on single-turn tasks compares ``task.turn_budget`` with a fresh default, and a
    config made through the API (placed sections) must not read as changed."""
    from rollwise.sections import place
    from rollwise.sections.task import TurnBudgetConfig

    placed = TurnBudgetConfig()
    place(placed, "task.turn_budget")
    assert placed == TurnBudgetConfig()
    assert placed != TurnBudgetConfig(quantile=0.5)
