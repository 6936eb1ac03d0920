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


def _levels(prompts):
    return [p.metadata["difficulty"] for p in prompts]


def test_train_mix_draws_each_difficulty_in_its_share_in_split_order():
    opts = {"levels": [1, 2]}
    full = build_task(load_config(data={"task": {"options": opts}}))
    mixed = build_task(
        load_config(data={"task": {"options": opts, "max_train_prompts": 8, "train_mix": {"1": 0.75, "2": 0.25}}})
    )
    assert _levels(mixed.train_prompts()).count(1) == 6 and _levels(mixed.train_prompts()).count(2) == 2
    # the first six level-1 and the first two level-2 prompts of the split, interleaved evenly: level 1's i-th
    # at (i + 0.5) / 6 (1/12, 3/12, 5/12, 7/12, 9/12, 11/12), level 2's at (i + 0.5) / 2 (3/12, 9/12), ties to level 1
    ones = [p for p in full.train_prompts() if p.metadata["difficulty"] == 1][:6]
    twos = [p for p in full.train_prompts() if p.metadata["difficulty"] == 2][:2]
    expected = [ones[0], ones[1], twos[0], ones[2], ones[3], ones[4], twos[1], ones[5]]
    assert list(mixed.train_prompts()) == expected
    assert list(mixed.heldout_prompts()) == list(full.heldout_prompts())
    assert mixed.sft_examples(20, 0) == full.sft_examples(20, 0)  # the warm start's data is the whole task's


def test_mix_quotas_largest_remainders():
    from rollwise.tasks import mix_quotas

    # 7 x (0.5, 0.3, 0.2) = 3.5, 2.1, 1.4: floors 3, 2, 1 (6), the one left goes to the largest remainder (0.5)
    assert mix_quotas({"a": 0.5, "b": 0.3, "c": 0.2}, 7) == {"a": 4, "b": 2, "c": 1}
    assert mix_quotas({"x": 0.5, "y": 0.5}, 3) == {"x": 2, "y": 1}  # a tie goes to the difficulty named first


@pytest.mark.parametrize(
    "task, match",
    [
        ({"train_mix": {"1": 1.0}}, "needs task.max_train_prompts"),
        ({"max_train_prompts": 8, "train_mix": {"1": 0.5, "2": 0.4}}, "sum to 1"),
        ({"max_train_prompts": 8, "train_mix": {"1": 1.0, "2": 0.0}}, "must be > 0"),
        ({"max_train_prompts": 8, "train_mix": {"1": 0.5, "9": 0.5}}, r"difficulty \['9'\]"),
        ({"max_train_prompts": 100000, "train_mix": {"1": 1.0}}, r"short by"),
    ],
)
def test_train_mix_refusals_name_the_key(task, match):
    with pytest.raises(UserError, match=match):
        build_task(load_config(data={"task": {"options": {"levels": [1, 2]}, **task}}))
