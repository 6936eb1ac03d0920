"""Trainer options: proximal log-probs for decoupled PPO, VCPO ESS learning-rate scaling, the
reference model (KL in the loss or in the reward) and the entropy metric."""

import copy
import math
from types import SimpleNamespace

import pytest
import torch

from rollwise.collate import collate
from rollwise.config import load_config
from rollwise.objectives import ADVANTAGES, OBJECTIVES
from rollwise.trainer.trainer import Trainer, token_logprobs
from rollwise.types import Advantages, Rollout

V = 4  # vocabulary of the constant model


class ConstLM(torch.nn.Module):
    """Logits = one learned bias vector at every position; starts uniform: log p = -log 4."""

    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(V))

    def forward(self, input_ids, attention_mask=None):
        return SimpleNamespace(logits=self.bias.expand(*input_ids.shape, V))


def _train_cfg(*overrides):
    return load_config(overrides=["train.max_grad_norm=0", *overrides]).train


def _spy(fn, seen):
    def wrapped(batch, new_lp, opts, entropy=None):
        seen.append(batch.prox_logprobs)
        return fn(batch, new_lp, opts, entropy=entropy)

    return wrapped


def _record_lr(trainer):
    """The learning rates in force when ``optimizer.step()`` runs, one list per step."""
    used = []
    trainer.optimizer.register_step_pre_hook(lambda opt, args, kwargs: used.append([g["lr"] for g in opt.param_groups]))
    return used


def _const_batch(log_w):
    """One row per entry of ``log_w``: prompt token 1, completion token 2 whose sampler log-prob is
    -log 4 - log_w, so the sequence weight pi_prox / mu under ConstLM is exp(log_w)."""
    rows = [Rollout(f"p{i}", (1,), (2,), (-math.log(V) - w,), "stop", 0) for i, w in enumerate(log_w)]
    b = len(rows)
    adv = Advantages(torch.tensor([1.0, -1.0] * (b // 2)), torch.ones(b, dtype=torch.bool))
    return collate(rows, torch.zeros(b), torch.arange(b) // 2, adv, pad_id=0)


def test_ess_lr_scaling_uses_the_hand_computed_lr_and_restores_it():
    # w = [1, 3] -> rho = (1 + 3)^2 / (2 * (1 + 9)) = 0.8, sqrt rule -> scale sqrt(0.8) = 0.894427;
    # one row per micro-batch: the weights are gathered over the whole step
    batch = _const_batch([0.0, math.log(3)])
    grpo = OBJECTIVES.get("grpo")
    seen = []
    tr = Trainer(
        ConstLM(),
        _spy(grpo, seen),
        grpo.Options(),
        _train_cfg("train.lr=0.1", "train.micro_batch=1", "train.ess_lr_scaling.enabled=true"),
        temperature=1.0,
    )
    used = _record_lr(tr)
    m = tr.optimize(batch)
    assert m["train/ess_ratio"] == pytest.approx(0.8)
    assert m["train/lr_scale"] == pytest.approx(math.sqrt(0.8))
    assert used == [[pytest.approx(0.1 * math.sqrt(0.8))]]
    assert tr.optimizer.param_groups[0]["lr"] == pytest.approx(0.1)  # restored after the step
    assert seen == [None, None]  # grpo keeps the sampler's log-probs as "old" (bypass mode)
    # linear rule with rho_base 0.9: min(1, 0.8 / 0.9) = 0.8889
    tr = Trainer(
        ConstLM(),
        grpo,
        grpo.Options(),
        _train_cfg(
            "train.lr=0.1",
            "train.ess_lr_scaling.enabled=true",
            "train.ess_lr_scaling.rule=linear",
            "train.ess_lr_scaling.base_ess_ratio=0.9",
        ),
        temperature=1.0,
    )
    used = _record_lr(tr)
    assert tr.optimize(batch)["train/lr_scale"] == pytest.approx(0.8 / 0.9)
    assert used == [[pytest.approx(0.1 * 0.8 / 0.9)]]
    # off: the scheduled LR, no ESS metrics
    tr = Trainer(ConstLM(), grpo, grpo.Options(), _train_cfg("train.lr=0.1"), temperature=1.0)
    used = _record_lr(tr)
    assert "train/lr_scale" not in tr.optimize(batch) and used == [[0.1]]


def test_entropy_metric_is_counted_once_and_kl_in_loss_starts_at_zero():
    batch = _const_batch([0.0, 0.0])
    grpo = OBJECTIVES.get("grpo")
    tr = Trainer(ConstLM(), grpo, grpo.Options(kl_coef=0.1, entropy_coef=0.01), _train_cfg(), temperature=1.0)
    m = tr.optimize(batch)
    assert m["train/entropy"] == pytest.approx(math.log(V))  # uniform over 4 tokens: log 4 = 1.386
    assert m["train/kl"] == pytest.approx(0.0, abs=1e-7)  # reference == policy before the step


def test_policy_and_reference_logprobs():
    batch = _const_batch([0.0, 0.5])
    grpo = OBJECTIVES.get("grpo")
    tr = Trainer(ConstLM(), grpo, grpo.Options(), _train_cfg("train.micro_batch=1"), temperature=1.0, reference=True)
    with torch.no_grad():
        tr.model.bias.copy_(torch.tensor([0.0, 0.0, math.log(3), 0.0]))  # policy: p(2) = 3/6 = 1/2
    policy, ref = tr.policy_and_reference_logprobs(batch)
    assert policy[:, 1].tolist() == pytest.approx([math.log(0.5)] * 2)
    assert ref[:, 1].tolist() == pytest.approx([-math.log(V)] * 2)  # the frozen initial weights
    with pytest.raises(ValueError, match="reference"):
        Trainer(ConstLM(), grpo, grpo.Options(), _train_cfg(), temperature=1.0).policy_and_reference_logprobs(batch)


def _tiny_rows(tok):
    texts = [("3+4=", "7"), ("3+4=", "8"), ("3+4=", "71"), ("3+4=", "7")]
    rows = []
    for _i, (p, c) in enumerate(texts):
        pids = tuple([tok.bos_token_id] + tok.encode(p))
        cids = tuple(tok.encode(c) + [tok.eos_token_id])
        rows.append(Rollout("g0", pids, cids, tuple(-4.0 - 0.1 * j for j in range(len(cids))), "stop", 0))
    return rows, torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.zeros(4, dtype=torch.long)


def test_trainer_fills_prox_logprobs_and_decoupled_ppo_trains_a_step():
    from rollwise.trainer.tiny import build_tiny

    model, tok = build_tiny("tiny-s", seed=0)
    rows, rewards, gidx = _tiny_rows(tok)
    adv = ADVANTAGES.get("grpo")
    batch = collate(rows, rewards, gidx, adv(rewards, gidx, adv.Options()), tok.pad_token_id)
    before = copy.deepcopy(model)
    with torch.no_grad():
        expected, _ = token_logprobs(before, batch, 1.0)  # pi_prox: the weights before the update
    fn = OBJECTIVES.get("decoupled_ppo")
    opts = fn.Options()
    assert opts.needs_prox and not OBJECTIVES.get("grpo").Options().needs_prox
    seen = []
    tr = Trainer(model, _spy(fn, seen), opts, _train_cfg("train.micro_batch=2"), temperature=1.0)
    m = tr.optimize(batch)
    prox = torch.cat([torch.nn.functional.pad(p, (0, batch.input_ids.shape[1] - p.shape[1])) for p in seen])
    mask = batch.loss_mask
    assert len(seen) == 2 and torch.allclose(prox * mask, expected * mask, atol=1e-5)
    # the logged behaviour weight is the token mean of exp(prox - old) (all below the cap 5)
    w = torch.exp(expected - batch.old_logprobs)
    assert m["train/tis_weight"] == pytest.approx(float((w * mask).sum() / mask.sum()), rel=1e-4)
    assert m["train/ratio"] == pytest.approx(1.0)  # u = pi_theta / pi_prox = 1 at the step
    assert math.isfinite(m["train/loss"]) and m["train/grad_norm"] > 0
    w0 = torch.cat([p.flatten() for p in before.parameters()])
    assert not torch.allclose(w0, torch.cat([p.detach().flatten() for p in model.parameters()]))


def test_update_epochs_take_one_step_each_and_keep_the_pre_update_prox():
    # grpo (bypass mode, ratio against the sampler): 2 epochs == two single-epoch optimize calls.
    # Row 0 answers token 2 with advantage +1, row 1 token 3 with -1: the gradient does not cancel
    rows = [Rollout(f"p{i}", (1,), (t,), (-math.log(V),), "stop", 0) for i, t in enumerate((2, 3))]
    batch = collate(
        rows,
        torch.zeros(2),
        torch.zeros(2, dtype=torch.long),
        Advantages(torch.tensor([1.0, -1.0]), torch.ones(2, dtype=torch.bool)),
        pad_id=0,
    )
    grpo = OBJECTIVES.get("grpo")
    two = Trainer(ConstLM(), grpo, grpo.Options(), _train_cfg("train.lr=0.1", "train.epochs=2"), temperature=1.0)
    used = _record_lr(two)
    two.optimize(batch)
    assert len(used) == 2  # one optimizer step per epoch
    one = Trainer(ConstLM(), grpo, grpo.Options(), _train_cfg("train.lr=0.1"), temperature=1.0)
    one.optimize(batch)
    assert not torch.allclose(one.model.bias, two.model.bias)  # the second epoch moved the weights on
    one.optimize(batch)
    assert torch.allclose(one.model.bias, two.model.bias, atol=1e-7)
    # decoupled PPO: both epochs see the proximal log-probs of the weights before the first update
    # (uniform ConstLM: log 1/4 for the completion token), not the weights after epoch 1
    fn = OBJECTIVES.get("decoupled_ppo")
    seen = []
    tr = Trainer(ConstLM(), _spy(fn, seen), fn.Options(), _train_cfg("train.lr=0.1", "train.epochs=2"), temperature=1.0)
    tr.optimize(batch)
    assert len(seen) == 2
    for prox in seen:
        assert prox[:, 1].tolist() == pytest.approx([-math.log(V)] * 2)
