"""Reward shaping (rollwise/reward/shaping.py): DAPO's overlong penalty and KL in the reward, by hand,
then once through the loop with a scripted backend."""

import json
import math

import pytest
import torch

import rollwise
from conftest import as_sets, tiny_overrides
from rollwise.backends.scripted import ScriptedBackend
from rollwise.collate import flatten
from rollwise.config import load_config
from rollwise.registry import UserError
from rollwise.reward import overlong_limits, sequence_kl, shape
from rollwise.types import Group, Prompt, Rollout, Verdict


def _rollout(length, score):
    return Rollout("p", (1, 2), tuple(range(5, 5 + length)), (-1.0,) * length, "stop", 0, "", Verdict(score))


def _cfg(*overrides):
    return load_config(overrides=list(overrides))


def test_overlong_penalty_hand_example():
    cfg = _cfg(
        "reward.overlong_penalty.enabled=true",
        "reward.overlong_penalty.max_len=10",
        "reward.overlong_penalty.cache_len=4",
    )
    rows = [_rollout(n, s) for n, s in [(6, 1.0), (8, 1.0), (10, 0.0), (11, 0.0)]]
    # free up to 10 - 4 = 6 tokens: penalties 0, (6 - 8) / 4 = -0.5, -1, -1 (beyond max_len)
    shaped, m = shape(rows, torch.tensor([1.0, 1.0, 0.0, 0.0]), cfg.reward, max_new_tokens=99)
    assert shaped.tolist() == [1.0, 0.5, -1.0, -1.0]
    assert m["reward/overlong_penalty_mean"] == pytest.approx(-2.5 / 4)
    assert m["reward/overlong_frac"] == 0.75 and m["reward/shaped_mean"] == pytest.approx(-0.5 / 4)


def test_overlong_defaults_follow_max_new_tokens():
    cfg = _cfg("reward.overlong_penalty.enabled=true")
    # max_len = max_new_tokens = 10, cache_len = 10 // 5 = 2: free up to 8; 9 -> -0.5, 10 -> -1
    assert overlong_limits(cfg.reward.overlong_penalty, 10) == (10, 2)
    shaped, _ = shape([_rollout(n, 0.0) for n in (8, 9, 10)], torch.zeros(3), cfg.reward, max_new_tokens=10)
    assert shaped.tolist() == [0.0, -0.5, -1.0]
    with pytest.raises(UserError, match="cache_len"):
        _cfg("sampling.max_new_tokens=8", "reward.overlong_penalty.cache_len=9")  # rejected at load


def test_shaping_off_is_identity_and_unverified_rows_never_reach_it():
    rewards = torch.tensor([1.0, 0.0])
    out, m = shape([_rollout(3, 1.0), _rollout(4, 0.0)], rewards, _cfg().reward, max_new_tokens=8)
    assert out is rewards and m == {}
    g = Group(Prompt("p", "t", "x", "1"), (_rollout(3, 1.0), _rollout(9, None), _rollout(4, 0.0)))
    rows, rewards, _ = flatten([g])  # the unverified rollout is left out, not scored 0
    cfg = _cfg(
        "reward.overlong_penalty.enabled=true",
        "reward.overlong_penalty.max_len=4",
        "reward.overlong_penalty.cache_len=2",
    )
    shaped, _ = shape(rows, rewards, cfg.reward, max_new_tokens=8)
    assert shaped.tolist() == [0.5, -1.0]  # lengths 3 -> (2 - 3) / 2, 4 -> -1
    with pytest.raises(ValueError, match="unverified"):
        shape([_rollout(3, None)], torch.zeros(1), cfg.reward, max_new_tokens=8)


def test_sequence_kl_estimators_by_hand():
    # l = ref - policy = [-0.5, 1.0] on the two loss tokens; the padded third token is ignored
    policy = torch.tensor([[-1.0, -2.0, 7.0]])
    ref = torch.tensor([[-1.5, -1.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert sequence_kl(policy, ref, mask, "k1").item() == pytest.approx(0.5 - 1.0)  # -l summed
    assert sequence_kl(policy, ref, mask, "k2").item() == pytest.approx(0.125 + 0.5)  # l^2 / 2
    k3 = (math.exp(-0.5) + 0.5 - 1) + (math.e - 2)  # e^l - 1 - l = 0.10653 + 0.71828
    assert sequence_kl(policy, ref, mask, "k3").item() == pytest.approx(k3)


def test_kl_in_reward_subtracts_beta_times_kl():
    cfg = _cfg("reward.kl.coef=0.5")
    rows = [_rollout(2, 1.0), _rollout(2, 0.0)]
    shaped, m = shape(rows, torch.tensor([1.0, 0.0]), cfg.reward, 8, kl=torch.tensor([0.4, -0.2]))
    assert shaped.tolist() == pytest.approx([1.0 - 0.2, 0.0 + 0.1])
    assert m["reward/kl_mean"] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="per-sequence KL"):
        shape(rows, torch.tensor([1.0, 0.0]), cfg.reward, 8)


def test_loop_applies_the_penalty_and_the_reference_kl(tmp_path):
    from rollwise.trainer.tiny import char_tokenizer

    tok = char_tokenizer()
    # call i answers "1" * (i % 4 + 1): with EOS lengths 2, 3, 4, 5 -> max_len 4, cache 2, free 2:
    # penalties 0, -0.5, -1, -1 -> mean -0.625, 3 of 4 penalised
    backend = ScriptedBackend(lambda seq, i: tok.encode("1" * (i % 4 + 1)), tok.eos_token_id)
    o = tiny_overrides(
        tmp_path,
        steps=1,
        **{
            "eval.at_start": False,
            "model.warm_start.steps": 0,
            "eval.n_prompts": 2,
            "sampling.max_new_tokens": 8,
            "reward.overlong_penalty.enabled": True,
            "reward.overlong_penalty.max_len": 4,
            "reward.overlong_penalty.cache_len": 2,
            "reward.kl.coef": 0.1,
            "reward.kl.estimator": "k3",
        },
    )
    result = rollwise.train(load_config(overrides=as_sets(o)), backend=backend, log=lambda m: None)
    m = json.loads((result.run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert m["reward/overlong_penalty_mean"] == pytest.approx(-0.625)
    assert m["reward/overlong_frac"] == 0.75
    # step 0: the policy is the reference, so every KL estimate is exactly 0
    assert m["reward/kl_mean"] == pytest.approx(0.0, abs=1e-6)
    assert m["reward/shaped_mean"] == pytest.approx(m["reward/mean"] - 0.625, abs=1e-6)
