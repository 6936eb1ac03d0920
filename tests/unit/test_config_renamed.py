"""Renamed keys and names (issue #27: a feature's config section, module folder and metric prefix
use one word): the old spelling is refused with a message that names the new one, from a TOML
file as from a --set override."""

import pytest

from rollwise.config import RENAMED, load_config
from rollwise.registry import UserError


def test_renamed_table():
    assert RENAMED == {"sampling.tree": "sampling.latr", "filter.d3s": "batch.d3s"}  # old name


@pytest.mark.parametrize(
    "override, new",
    [
        ("sampling.tree.enabled=true", "sampling.latr"),  # old name
        ("filter.d3s.enabled=true", "batch.d3s"),  # old name
        ("filter.d3s={ramp_steps = 3}", "batch.d3s"),  # old name
    ],
)
def test_old_key_in_an_override_names_the_new_key(override, new):
    with pytest.raises(UserError, match=rf"was renamed {new}"):
        load_config(overrides=[override])


def test_old_section_in_a_file_names_the_new_key(tmp_path):
    path = tmp_path / "old.toml"
    path.write_text("[sampling.tree]\nenabled = true\n")  # old name
    with pytest.raises(UserError, match=r"sampling\.tree was renamed sampling\.latr"):  # old name
        load_config(path)
    path.write_text("[filter]\nnames = ['zero_variance']\n\n[filter.d3s]\nenabled = true\n")  # old name
    with pytest.raises(UserError, match=r"filter\.d3s was renamed batch\.d3s"):  # old name
        load_config(path)


def test_new_keys_load():
    cfg = load_config(overrides=["sampling.latr.enabled=true", "batch.d3s.enabled=true", "batch.d3s.ramp_steps=3"])
    assert cfg.sampling.latr.enabled and cfg.batch.d3s.enabled and cfg.batch.d3s.ramp_steps == 3
    assert "tree" not in type(cfg.sampling).model_fields and "d3s" not in type(cfg.filter).model_fields


@pytest.mark.parametrize("old, new", [("partial", "april"), ("speculative", "spec_rl")])  # old name
def test_old_replay_name_names_the_new_one(old, new):
    with pytest.raises(UserError, match=rf"replay {old!r} is not a replay name: .*'{new}'"):
        load_config(overrides=[f"replay.name={old}"])
    assert load_config(overrides=[f"replay.name={new}"]).replay.name == new


# ---------------------------------------------------------------- distinct names for distinct knobs (issue #41)
# ``max_staleness`` is the bound of train.async (AReaL's eta); the option of rollout_replay and of ar3po that
# bounded the age of what they reuse had the same name and is refused under it, naming the new one.

STALENESS_RENAMES = [
    ("replay", "rollout_replay", "max_replay_age"),
    ("control", "ar3po", "max_reuse_age"),
]


@pytest.mark.parametrize("section, name, new", STALENESS_RENAMES)
def test_old_staleness_option_in_an_override_names_the_new_key(section, name, new):
    with pytest.raises(UserError, match=rf"{section}\.options\.max_staleness was renamed {section}\.options\.{new}"):
        load_config(overrides=[f"{section}.name={name}", f"{section}.options.max_staleness=2"])  # old name


@pytest.mark.parametrize("section, name, new", STALENESS_RENAMES)
def test_old_staleness_option_in_a_file_names_the_new_key(tmp_path, section, name, new):
    path = tmp_path / "old.toml"
    path.write_text(f'[{section}]\nname = "{name}"\n\n[{section}.options]\nmax_staleness = 2\n')  # old name
    with pytest.raises(UserError, match=rf"{section}\.options\.max_staleness was renamed {section}\.options\.{new}"):
        load_config(path)


@pytest.mark.parametrize("section, name, new", STALENESS_RENAMES)
def test_new_staleness_option_loads(tmp_path, section, name, new):
    path = tmp_path / "new.toml"
    path.write_text(f'[{section}]\nname = "{name}"\n\n[{section}.options]\n{new} = 2\n')
    assert getattr(load_config(path), section).options == {new: 2}
    assert load_config(overrides=[f"{section}.name={name}", f"{section}.options.{new}=3"]).model_dump()[section][
        "options"
    ] == {new: 3}


def test_the_async_bound_keeps_its_name():
    assert load_config(overrides=["train.async.max_staleness=0"]).train.async_.max_staleness == 0
