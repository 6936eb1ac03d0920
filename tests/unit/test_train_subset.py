"""task.max_train_prompts: RL draws from the first N train prompts; the warm start and the
held-out split still come from the whole task (components.TrainSubset)."""

import pytest

from rollwise.components import build_task
from rollwise.config import load_config
from rollwise.registry import UserError


def test_subset_limits_train_only():
    full = build_task(load_config(data={}))
    sub = build_task(load_config(data={"task": {"max_train_prompts": 7}}))
    assert list(sub.train_prompts()) == list(full.train_prompts()[:7])
    assert list(sub.heldout_prompts()) == list(full.heldout_prompts())
    assert sub.sft_examples(20, 0) == full.sft_examples(20, 0)  # warm-start data from the whole split
    assert sub.name == full.name


def test_negative_is_refused_naming_the_key():
    with pytest.raises(UserError, match="max_train_prompts"):
        load_config(data={"task": {"max_train_prompts": -1}})
