"""The refusals a config section keeps beside its models (``rollwise.sections.<section>``), reached
through ``load_config`` as a user meets them."""

import pytest

from rollwise.config import load_config
from rollwise.registry import UserError
from rollwise.sections.task import EPISODE_KEYS, TaskConfig, check_single_turn


def test_options_for_a_filter_that_is_not_on_are_refused():
    with pytest.raises(
        UserError, match=r"filter\.options has entries for filters not in filter\.names: \['overlong'\]"
    ):
        load_config(overrides=["filter.names=['zero_variance']", "filter.options={overlong = {}}"])
    cfg = load_config(overrides=["filter.names=['zero_variance']", "filter.options={zero_variance = {}}"])
    assert cfg.filter.options == {"zero_variance": {}}


def test_episode_keys_changed_on_a_single_turn_task_are_refused():
    """The assembler calls it with the built task (``compat.check_episodes``); the check itself is the section's."""
    assert set(EPISODE_KEYS) <= set(TaskConfig.model_fields)
    with pytest.raises(UserError, match=r"task\.max_turns applies to environment tasks .* task\.name = 'arithmetic'"):
        check_single_turn(TaskConfig(max_turns=3))
    with pytest.raises(UserError, match=r"task\.episode_schedule applies"):
        check_single_turn(TaskConfig(episode_schedule="overlap"))
    check_single_turn(TaskConfig(max_turns=8))  # the default: nothing to refuse
