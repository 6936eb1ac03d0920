"""The built-in arithmetic task's second named reward (Verdict.rewards, for GDPO) and the
``named_rewards`` advantage input; the default task keeps plain verdicts."""

import pytest
import torch

from rollwise.objectives.inputs import named_rewards
from rollwise.tasks.arithmetic import make
from rollwise.types import Rollout, Verdict


def task(**o):
    return make(None, {"n_train": 20, "n_heldout": 5, **o})


def prompt_of(t, answer_len):
    return next(p for p in t.train_prompts() if len(p.answer) == answer_len)


def test_default_verdicts_have_no_named_rewards():
    t = task()
    p = t.train_prompts()[0]
    assert t.verify(p, p.answer) == Verdict(1.0, "correct", {"answer": p.answer})


def test_format_reward_is_independent_of_correctness():
    t = task(second_reward="format")
    p = prompt_of(t, 2)
    wrong = str(int(p.answer) + 1)
    assert t.verify(p, p.answer).rewards == {"correct": 1.0, "format": 1.0}
    assert t.verify(p, wrong).rewards == {"correct": 0.0, "format": 1.0}  # well formed, wrong
    v = t.verify(p, "4x")
    assert v.score == 0.0 and v.rewards == {"correct": 0.0, "format": 0.0}


def test_length_reward_counts_characters():
    t = task(second_reward="length", max_length=2, levels=[2])
    p = prompt_of(t, 2)
    assert t.verify(p, p.answer).rewards == {"correct": 1.0, "length": 1.0}
    assert t.verify(p, "123").rewards == {"correct": 0.0, "length": 0.0}
    assert t.verify(p, " 7\n").rewards["length"] == 1.0  # stripped


def test_named_rewards_input_and_its_errors():
    def row(pid, rewards):
        return Rollout(pid, (1,), (2,), (0.0,), "stop", 0, "", Verdict(1.0, "correct", {}, rewards))

    got = named_rewards([row("a", {"correct": 1.0, "format": 0.0}), row("b", {"correct": 0.0, "format": 1.0})])
    assert torch.equal(got["correct"], torch.tensor([1.0, 0.0])) and torch.equal(
        got["format"], torch.tensor([0.0, 1.0])
    )
    with pytest.raises(ValueError, match="'b'"):
        named_rewards([row("a", {"correct": 1.0}), row("b", None)])
    with pytest.raises(ValueError, match="'b'"):
        named_rewards([row("a", {"correct": 1.0}), row("b", {"length": 1.0})])


def test_bad_option_is_refused():
    from rollwise.registry import UserError

    with pytest.raises(UserError, match="second_reward"):
        task(second_reward="speed")


def test_reward_only_options_leave_the_sft_examples_alone():
    # the warm-start cache key drops REWARD_ONLY_OPTIONS (components.build_policy), so they must not change SFT data
    from rollwise.tasks.arithmetic import ArithmeticTask

    assert set(ArithmeticTask.REWARD_ONLY_OPTIONS) == {"second_reward", "max_length"}
    base = task().sft_examples(10, seed=1)
    assert task(second_reward="length", max_length=5).sft_examples(10, seed=1) == base
    assert task(second_reward="format").sft_examples(10, seed=1) == base
