"""FAPO's judge task (rollwise.tasks.fapo_judge, arXiv 2510.22543): labels from the rule detector,
planted slips keep the answer right, and the reward R_outcome + R_process (-1 invalid) by hand."""

import random

import pytest

from rollwise.flaws import first_false_equation
from rollwise.registry import UserError
from rollwise.tasks import fapo_judge as fj
from rollwise.tasks.arithmetic import trace


def test_reward_hand_worked():
    # n = 4 steps, planted at t* = 1
    assert fj.judge_reward(1, 1, 4) == 2.0  # exact: 1 + (1 - 0/4)
    assert fj.judge_reward(3, 1, 4) == 0.5  # 0 + (1 - 2/4)
    assert fj.judge_reward(0, 1, 4) == 0.75  # 0 + (1 - 1/4)
    assert fj.judge_reward(-1, 1, 4) == 0.0  # says none of a flawed trace: no step distance
    assert fj.judge_reward(-1, -1, 4) == 1.0  # right "none"
    assert fj.judge_reward(2, -1, 4) == 0.0  # flags a clean trace
    assert fj.judge_reward(None, 1, 4) == -1.0 and fj.judge_reward(None, -1, 4) == -1.0


def test_verify_parses_and_scores():
    task = fj.make(None, {"n_train": 30, "n_heldout": 5, "flawed_share": 1.0})
    p = task.train_prompts()[0]
    n, t = p.metadata["n_steps"], p.metadata["t_star"]
    assert t >= 0 and p.answer == str(t)
    assert task.verify(p, f" {t} ").score == 2.0
    assert task.verify(p, "none").score == 0.0
    assert task.verify(p, str(n)).score == -1.0  # out of range: invalid
    assert task.verify(p, "x1").score == -1.0
    assert task.verify(p, "").reason == "invalid"


def test_plant_keeps_the_answer_and_the_rule_detector_finds_it():
    text = trace((47, "+", 85))
    assert text == "7+5+0=12,4+8+1=13,=132"
    for s in range(20):
        bad = fj.plant(text, random.Random(s))
        assert bad.endswith(",=132") and bad != text
        k = first_false_equation(None, bad)
        assert k in (0, 1)
        assert bad.split(",")[1 - k] == text.split(",")[1 - k]  # only the planted step changed


def test_labels_are_the_rule_detectors_and_splits_are_disjoint():
    task = fj.make(None, {"n_train": 200, "n_heldout": 40, "seed": 3})
    train, held = task.train_prompts(), task.heldout_prompts()
    assert not {p.id for p in train} & {p.id for p in held}
    for p in list(train) + list(held):
        label = first_false_equation(None, p.text[: -len(fj.END)])
        assert p.metadata["t_star"] == label
        assert p.answer == ("none" if label == -1 else str(label))
    share = sum(p.answer != "none" for p in train) / len(train)
    assert 0.35 < share < 0.65  # flawed_share 0.5
    assert task.sft_examples(5, 0)[0][1] in {p.answer for p in train}


def test_bad_options_are_refused_naming_the_key():
    with pytest.raises(UserError, match="flawed_share"):
        fj.make(None, {"flawed_share": 1.5})
    with pytest.raises(UserError, match="levels"):
        fj.make(None, {"levels": [9]})
