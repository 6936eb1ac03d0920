"""VCPO's off-policy optimal baseline (OPOB; systems.md §3 item 4 and properties 1, 3, 4): the
formula on hand-worked numbers, its defining property (it minimises the variance of the
importance-weighted score-function estimate, below the mean baseline's), the per-row scores the
trainer measures, and the refusal at load."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from rollwise.collate import collate
from rollwise.config import load_config
from rollwise.objectives import ADVANTAGES, OBJECTIVES
from rollwise.objectives.ess import OpobOptions, opob, opob_baseline
from rollwise.registry import UserError
from rollwise.trainer.trainer import Trainer
from rollwise.types import Advantages, Rollout

T = torch.tensor


def test_baseline_hand_worked():
    # R = [1, 0], w = [1, 2], ||g|| = [1, 1]: b* = (1*1*1 + 4*1*0) / (1 + 4) = 0.2, where the mean is 0.5
    b = opob_baseline(T([1.0, 0.0]), T([0, 0]), T([0.0, math.log(2.0)]), T([1.0, 1.0]))
    assert b.tolist() == pytest.approx([0.2, 0.2])
    # the quantity b* minimises, sum w^2 ||g||^2 (R - b)^2: 1 * 0.64 + 4 * 0.04 = 0.8 at b*,
    # 0.25 + 4 * 0.25 = 1.25 at the mean 0.5
    c = T([1.0, 4.0])

    def spread(x):
        return float((c * (T([1.0, 0.0]) - x) ** 2).sum())

    assert spread(0.2) == pytest.approx(0.8) and spread(0.5) == pytest.approx(1.25)
    # norms count too: w = 1, ||g|| = [1, 3] -> b* = (1 * 1) / (1 + 9) = 0.1; without IS weights (w ignored) as well
    assert opob_baseline(T([1.0, 0.0]), T([0, 0]), T([0.0, 0.0]), T([1.0, 3.0])).tolist() == pytest.approx([0.1] * 2)
    no_w = opob_baseline(T([1.0, 0.0]), T([0, 0]), T([0.0, math.log(2.0)]), T([1.0, 1.0]), use_is_weights=False)
    assert no_w.tolist() == pytest.approx([0.5, 0.5])


def test_on_policy_equal_norms_is_grpo():
    # property 1: every w = 1 and equal norms -> b* = the group mean, so the advantage is GRPO's
    r, g = T([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0]), T([0, 0, 0, 0, 1, 1, 1, 1])
    out = opob(r, g, OpobOptions(), seq_log_weights=torch.zeros(8), score_norms=torch.full((8,), 0.7))
    grpo = ADVANTAGES.get("grpo")
    assert torch.allclose(out.values, grpo(r, g, grpo.Options()).values, atol=1e-6)
    assert out.values[:4].tolist() == pytest.approx([0.866025, -0.866025, -0.866025, 0.866025], abs=1e-5)


def test_scale_invariance_and_argmin_on_random_rows():
    # property 3: scaling every w by a constant leaves b* unchanged; property 4: b* is the argmin over b of
    # sum w^2 ||g||^2 (R - b)^2 (zero derivative, and no better b on a fine grid)
    gen = torch.Generator().manual_seed(0)
    r = torch.rand(6, generator=gen, dtype=torch.float64)
    lw = torch.randn(6, generator=gen, dtype=torch.float64) * 3
    n = torch.rand(6, generator=gen, dtype=torch.float64) + 0.1
    gidx = torch.zeros(6, dtype=torch.long)
    b = opob_baseline(r, gidx, lw, n)[0].double()
    assert float(opob_baseline(r, gidx, lw + 5.0, n)[0]) == pytest.approx(float(b), rel=1e-6)
    c = torch.exp(2 * lw.double()) * n.double() ** 2
    assert float((c * (r.double() - b)).sum()) == pytest.approx(0.0, abs=1e-9 * float(c.sum()))
    grid = torch.linspace(0, 1, 2001, dtype=torch.float64)
    spread = ((c[None, :] * (r.double()[None, :] - grid[:, None]) ** 2).sum(dim=1)).min()
    assert float((c * (r.double() - b) ** 2).sum()) <= float(spread) + 1e-12


def test_variance_of_the_estimator_is_lower_than_the_mean_baselines():
    # A two-armed bandit, worked by hand. pi = softmax(theta), theta = (0, 0): pi = (1/2, 1/2); behaviour
    # mu = (1/4, 3/4): w = pi / mu = (2, 2/3); R = (1, 0); grad log pi(a) = e_a - pi, ||.||^2 = 1/2 for both.
    # One draw a ~ mu gives g(a) = w(a) (R(a) - b) grad log pi(a); E g = grad E_pi R = (1/4, -1/4) for every b.
    # b* = E_mu[w^2 ||.||^2 R] / E_mu[w^2 ||.||^2] = 0.5 / (0.5 + 1/6) = 0.75. E||g||^2 = 0.5 (1 - b)^2 + b^2 / 6:
    # 0.125 at b*, 0.2917 at the mean baseline E_mu R = 0.25; Var = E||g||^2 - ||E g||^2 = 0 and 1/6.
    theta = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    mu, reward = T([0.25, 0.75], dtype=torch.float64), T([1.0, 0.0], dtype=torch.float64)
    logp = torch.log_softmax(theta, 0)
    scores = torch.stack([torch.autograd.grad(logp[a], theta, retain_graph=True)[0] for a in range(2)])
    w = logp.detach().exp() / mu

    def variance(b):
        g = w[:, None] * (reward - b)[:, None] * scores
        mean = (mu[:, None] * g).sum(dim=0)
        return float((mu * (g * g).sum(dim=1)).sum() - (mean * mean).sum())

    # b* from OPOB on rows drawn in mu's proportions (one draw of arm 0, three of arm 1)
    arms = [0, 1, 1, 1]
    b = float(opob_baseline(reward[arms], torch.zeros(4, dtype=torch.long), w[arms].log(), scores.norm(dim=1)[arms])[0])
    assert b == pytest.approx(0.75)
    assert variance(b) == pytest.approx(0.0, abs=1e-12)
    assert variance(float((mu * reward).sum())) == pytest.approx(1 / 6)
    assert variance(b) < variance(float((mu * reward).sum()))


def test_constant_and_singleton_groups_get_zero():
    out = opob(
        T([1.0, 1.0, 0.0]),
        T([0, 0, 1]),
        OpobOptions(),
        seq_log_weights=T([0.0, 2.0, 0.0]),
        score_norms=T([1.0, 2.0, 1.0]),
    )
    assert out.values.tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="seq_log_weights"):
        opob(T([1.0, 0.0]), T([0, 0]))


V = 4


class ConstLM(torch.nn.Module):
    """Logits = one learned bias vector at every position; starts uniform: log p = -log 4."""

    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(V))

    def forward(self, input_ids, attention_mask=None):
        return SimpleNamespace(logits=self.bias.expand(*input_ids.shape, V))


def test_trainer_row_scores_hand_worked():
    # uniform policy over 4 tokens: grad_bias log pi(y) = e_y - 1/4. Completion [0, 0]: token mean (3/4, -1/4, -1/4,
    # -1/4), norm sqrt(3/4); completion [0, 1]: (1/4, 1/4, -1/4, -1/4), norm 1/2. Sampler log-probs -1 per token:
    # log w = 2 (-log 4 + 1). A row outside the loss gets 0, 0.
    rows = [Rollout("a", (1,), (0, 0), (-1.0, -1.0), "stop", 0), Rollout("b", (1,), (0, 1), (-1.0, -1.0), "stop", 0)]
    rows.append(Rollout("c", (1,), (2,), (-1.0,), "stop", 0))
    adv = Advantages(torch.zeros(3), T([True, True, False]))
    batch = collate(rows, torch.zeros(3), torch.zeros(3, dtype=torch.long), adv, pad_id=3)
    grpo = OBJECTIVES.get("grpo")
    tr = Trainer(ConstLM(), grpo, grpo.Options(), load_config().train, temperature=1.0)
    log_w, norms = tr.row_scores(batch)
    assert log_w.tolist() == pytest.approx([2 * (1 - math.log(4))] * 2 + [0.0])
    assert norms.tolist() == pytest.approx([math.sqrt(0.75), 0.5, 0.0])
    assert all(p.grad is None for p in tr.model.parameters())


def test_refused_with_fsdp_at_load():
    assert load_config(overrides=["advantage.name=opob"]).advantage.name == "opob"
    with pytest.raises(UserError, match="advantage.name = 'opob'.*train.fsdp"):
        load_config(overrides=["advantage.name=opob", "train.fsdp=true"])
