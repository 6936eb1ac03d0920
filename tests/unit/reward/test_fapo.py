"""FAPO flawed-positive penalty and the rule flaw detector (guidance.md §6.6), worked by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rollwise.config import load_config
from rollwise.flaws import first_false_equation, int_value
from rollwise.objectives import ADVANTAGES
from rollwise.registry import UserError
from rollwise.reward import shape
from rollwise.reward.fapo import fapo_penalty
from rollwise.tasks.arithmetic import trace
from rollwise.types import Prompt, Rollout, Verdict


def _row(text, score, pid="p"):
    return Rollout(pid, (1,), (2, 3), (-0.5, -0.5), "stop", 0, text, Verdict(score))


def test_int_value():
    assert int_value("2-7-0") == -5 and int_value("-5+10") == 5 and int_value("12*3") == 36
    assert int_value("x+1") is None and int_value("") is None and int_value("2**3") is None


def test_rule_detector_finds_the_first_false_equation():
    assert first_false_equation(None, "7+5+0=12,4+8+1=14,=132") == 1  # 4+8+1 is 13
    assert first_false_equation(None, "7+5+0=11,4+8+1=14,=132") == 0  # the earliest, not a later one
    assert first_false_equation(None, "2-7-0=-5+10=5,5-1-1=3,=35") == -1  # chains check each link
    assert first_false_equation(None, "2-7-0=-5+10=6,=35") == 0
    assert first_false_equation(None, "132") is None  # nothing to check: cannot judge
    for expr in [(47, "+", 85), (52, "-", 17), (12, "*", 34), (12, "+", 34, "-", 5)]:
        assert first_false_equation(None, trace(expr)) == -1  # the task's own traces are sound


def test_reward_mapping_and_detector_only_sees_positives():
    calls = []

    def detector(prompt, text):
        calls.append(text)
        return {"good": -1, "flawed": 2, "junk": None}[text]

    rows = [_row("good", 1.0), _row("flawed", 1.0), _row("wrong", 0.0), _row("junk", 1.0)]
    delta, m = fapo_penalty(rows, {}, detector, penalty=0.5, correct_at=1.0)
    # 0/1 scores: correct 1, flawed positive 1 - 0.5, wrong 0, unparsable -> not flawed
    assert (torch.tensor([1.0, 1, 0, 1]) + delta).tolist() == [1.0, 0.5, 0.0, 1.0]
    assert calls == ["good", "flawed", "junk"]  # never called on a wrong answer
    assert m["fapo/flawed_frac"] == pytest.approx(1 / 3) and m["fapo/undecided_frac"] == pytest.approx(1 / 3)
    assert m["fapo/checked"] == 3.0


def _advantages(n_c, n_f, n_w):
    rows = [_row("7+5+0=12,=12", 1.0)] * n_c + [_row("7+5+0=13,=12", 1.0)] * n_f + [_row("11", 0.0)] * n_w
    cfg = load_config(overrides=["reward.fapo.enabled=true"])
    shaped, _ = shape(rows, torch.tensor([r.reward for r in rows]), cfg.reward, max_new_tokens=8)
    return ADVANTAGES.get("grpo")(shaped, torch.zeros(len(rows), dtype=torch.long)).values


def test_spec_advantage_arithmetic_unbiased_std_g8():
    # paper scale +-1: 4 correct + 1 flawed + 3 wrong -> rewards (1 x4, 0, -1 x3), mu = 0.125,
    # unbiased std = sqrt((4*0.875^2 + 0.125^2 + 3*1.125^2) / 7) = 0.99103
    # -> flawed (0 - 0.125)/0.99103 = -0.126, correct +0.883, wrong -1.135.
    # On 0/1 scores with penalty 0.5 the rewards are (2r - 1)'s preimage: same advantages.
    a = _advantages(4, 1, 3)
    assert a[0].item() == pytest.approx(0.883, abs=1e-3)
    assert a[4].item() == pytest.approx(-0.126, abs=1e-3)
    assert a[5].item() == pytest.approx(-1.135, abs=1e-3)
    # 2 correct + 2 flawed + 4 wrong: mu = -0.25 -> flawed +0.282 (exploited), correct +1.410, wrong -0.846
    a = _advantages(2, 2, 4)
    assert [a[0].item(), a[2].item(), a[4].item()] == pytest.approx([1.410, 0.282, -0.846], abs=1e-3)


def test_flawed_sign_follows_wrong_minus_correct():
    for n_c, n_w, sign in [(3, 1, -1), (1, 3, 1), (2, 2, 0)]:
        a = _advantages(n_c, 2, n_w)
        flawed = a[n_c].item()
        assert (flawed > 1e-6) - (flawed < -1e-6) == sign


def test_baseline_without_penalty_is_plain_grpo():
    # flawed counted as correct, 4 vs 4: +-0.935 (unbiased std sqrt(8/7 * 0.25))
    rows = [_row("7+5+0=13,=12", 1.0)] * 4 + [_row("11", 0.0)] * 4
    shaped, m = shape(rows, torch.tensor([1.0] * 4 + [0.0] * 4), load_config().reward, max_new_tokens=8)
    assert m == {}
    a = ADVANTAGES.get("grpo")(shaped, torch.zeros(8, dtype=torch.long)).values
    assert a[0].item() == pytest.approx(0.5 / math.sqrt(2 / 7), abs=1e-3) == pytest.approx(0.935, abs=1e-3)


def test_unknown_detector_is_named_at_load():
    with pytest.raises(UserError, match="known: genrm:<arg>, rule") as e:
        load_config(overrides=["reward.fapo.detector=judge"])
    assert str(e.value).startswith("reward.fapo.detector = 'judge': ")  # the key, then the known names
    with pytest.raises(UserError, match="needs an argument") as e:  # the judge needs its run directory
        load_config(overrides=["reward.fapo.detector=genrm"])
    assert str(e.value).startswith("reward.fapo.detector = 'genrm': ")


def test_a_plugin_detector_that_does_not_import_is_refused_naming_the_key():
    with pytest.raises(UserError, match=r"^reward.fapo.detector = 'no_such_pkg.module:f': cannot import module"):
        load_config(overrides=["reward.fapo.detector='no_such_pkg.module:f'"])


def test_detector_gets_the_training_prompt():
    seen = []
    rows = [_row("1+1=2,=2", 1.0, pid="arithmetic/1+1")]
    p = Prompt("arithmetic/1+1", "arithmetic", "1+1=", "2")
    fapo_penalty(rows, {p.id: p}, lambda prompt, text: seen.append(prompt) or -1, 0.5, 1.0)
    assert seen == [p]
