"""Discoverable keys: `rollwise config show` prints every key with its description (unset ones as
comments) and validates as `rollwise train` does; typos get close-match suggestions; options
given to the wrong strategy list the valid ones; `rollwise config options` lists a strategy's
options with defaults; a string field takes any text."""

from __future__ import annotations

import pytest
import tomllib

from rollwise import cli
from rollwise.config import Config, load_config, to_toml
from rollwise.config_doc import annotated_toml
from rollwise.registry import UserError


def _show(capsys, *sets):
    args = ["config", "show"]
    for s in sets:
        args += ["--set", s]
    cli.main(args)
    return capsys.readouterr().out


def _leaf_keys(model, prefix=""):
    from pydantic import BaseModel

    for name, field in model.model_fields.items():
        value, key = getattr(model, name), field.alias or name  # train.async: the field TrainConfig.async_
        if isinstance(value, BaseModel):
            yield from _leaf_keys(value, f"{prefix}{key}.")
        else:
            yield prefix + key, field.description


def test_every_key_appears_with_its_description_unset_ones_too(capsys):
    out = _show(capsys)
    lines = out.splitlines()
    section = None
    seen = set()
    for _i, ln in enumerate(lines):
        if ln.startswith("[") and ln.endswith("]"):
            section = ln[1:-1]
        elif section is not None and " = " in ln:
            key = ln.lstrip("# ").split(" = ")[0]
            seen.add(f"{section}.{key}")
    for key, description in _leaf_keys(load_config()):
        if key.endswith(".options") or key == "filter.options":
            continue  # rendered as tables of their own
        assert key in seen, f"{key} missing from config show"
        assert description and " ".join(description.split())[:40] in " ".join(out.split()), key
    for unset in (
        "train.budget_generated_tokens",
        "train.budget_rollouts",
        "control.budget_rollouts",
        "control.budget_tokens",
        "run.name",
        "run.threads",
    ):
        assert unset in seen


@pytest.mark.parametrize(
    "sets",
    [
        [],
        [
            'filter.names=["zero_variance","overlong"]',
            "filter.options={overlong={}}",
            "train.budget_rollouts=100",
            "task.options={n_train=50, levels=[1]}",
            "sampling.latr.enabled=true",
            "eval.k=[1,2]",
        ],
    ],
)
def test_output_parses_to_the_resolved_config(sets):
    cfg = load_config(overrides=sets)
    assert tomllib.loads(annotated_toml(cfg)) == tomllib.loads(to_toml(cfg))


def test_strategy_options_are_listed_with_defaults(capsys):
    out = _show(capsys, "task.options={n_train=50}")
    table = out[out.index("[task.options]") :].split("\n\n")[0]
    assert "n_train = 50" in table  # set: a key
    assert "# n_heldout = 200" in table and "held-out" in table  # unset: commented default and description


def test_typo_gets_a_close_match():
    with pytest.raises(UserError, match=r"train\.stpes: unknown key; did you mean train\.steps\?"):
        load_config(overrides=["train.stpes=3"])


def test_options_for_the_wrong_task_list_the_valid_options():
    with pytest.raises(UserError) as e:
        load_config(overrides=["task.name=reasoning_gym:chain_sum", "task.options={n_train=3}"])
    msg = str(e.value)
    assert "task.options.n_train" in msg and "size" in msg and "heldout_size" in msg


def test_string_field_takes_digits_as_text():
    assert load_config(overrides=["run.name=2024"]).run.name == "2024"
    assert load_config(overrides=["run.name=007"]).run.name == "007"
    with pytest.raises(UserError, match="train.steps"):  # numbers stay numbers where a number is wanted
        load_config(overrides=["train.steps=abc"])


def test_config_show_rejects_what_train_rejects(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["config", "show", "--set", "task.name=reasoning_gym:no_such_dataset"])
    assert exc.value.code == 2 and "no_such_dataset" in capsys.readouterr().out


def test_config_options_lists_a_tasks_options(capsys):
    cli.main(["config", "options", "task", "jsonl"])
    out = capsys.readouterr().out
    for opt in (
        "question_field",
        "answer_field",
        "solution_field",
        "heldout_path",
        "heldout_fraction",
        "chat",
        "verifier",
    ):
        assert opt in out
    assert 'default "question"' in out and "default 0.1" in out


def test_config_options_without_a_name_lists_the_names(capsys):
    cli.main(["config", "options", "control"])
    out = capsys.readouterr().out
    assert "dars" in out and "uniform" in out


def test_descriptions_exist_for_every_field():
    missing = [k for k, d in _leaf_keys(Config()) if not d]
    assert not missing


def test_dapo_as_a_controller_says_what_dapo_is():
    with pytest.raises(UserError, match=r"DAPO is a filter plus dynamic sampling.*control\.dynamic_sampling\.enabled"):
        load_config(overrides=["control.name=dapo"])


def test_misspelt_strategy_name_gets_a_close_match():
    with pytest.raises(UserError, match=r"unknown controller 'dras'; known: .*\(did you mean dars"):
        load_config(overrides=["control.name=dras"])


@pytest.mark.parametrize("preset", ["xrpo", "cures", "vcrl", "vade", "dapo"])
def test_presets_exist_for_the_strategies_the_readme_names(preset):
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "configs" / f"{preset}.toml"
    cfg = load_config(path)
    assert cfg.control.name == preset or (
        preset == "dapo" and cfg.control.dynamic_sampling.enabled and cfg.filter.names == ["zero_variance"]
    )
