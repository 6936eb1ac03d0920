"""Options that reproduce verl's and TRL's defaults where rollwise differs (issue #19), each on a
case worked by hand. The KL options (kl_cap, kl_bias_correction) are in test_obj_kl.py; the
comparison against the peers' own code is tests/peers/."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from objtest_utils import make_batch

from rollwise.objectives import advantages as adv
from rollwise.objectives import dapo, decoupled_ppo, grpo


def test_grpo_trl_eps_and_batch_scale():
    # Groups {1, 0} and {1, 1}. Group means 0.5 and 1 -> r - mean = [0.5, -0.5, 0, 0].
    # scale="group", eps=1e-4 (TRL): group 0 std (unbiased) = sqrt(0.5) = 0.70711 -> 0.5 / 0.70721 = 0.70700.
    # scale="batch": batch mean 0.75, unbiased var (3 * 0.0625 + 0.5625) / 3 = 0.25 -> std 0.5
    #   -> 0.5 / (0.5 + 1e-4) = 0.99980004; the all-equal group stays 0.
    r = torch.tensor([1.0, 0.0, 1.0, 1.0])
    g = torch.tensor([0, 0, 1, 1])
    group = adv.grpo(r, g, adv.grpo.Options(eps=1e-4)).values
    assert group.tolist() == pytest.approx([0.5 / (math.sqrt(0.5) + 1e-4), -0.5 / (math.sqrt(0.5) + 1e-4), 0, 0])
    batch = adv.grpo(r, g, adv.grpo.Options(eps=1e-4, scale="batch")).values
    assert batch.tolist() == pytest.approx([0.5 / 0.5001, -0.5 / 0.5001, 0.0, 0.0])
    none = adv.grpo(r, g, adv.grpo.Options(scale="none")).values
    assert none.tolist() == adv.dr_grpo(r, g).values.tolist() == [0.5, -0.5, 0.0, 0.0]


def test_singleton_groups_zero_by_default_reward_like_verl():
    # Row 2 is alone in its group with reward 0.7. verl: baseline 0, std 1 -> grpo 0.7 / (1 + 1e-6),
    # dr_grpo and rloo 0.7; rollwise's default gives 0. The two-row group is unaffected: [0.5, -0.5] etc.
    r = torch.tensor([1.0, 0.0, 0.7])
    g = torch.tensor([3, 3, 9])
    assert adv.grpo(r, g).values[2].item() == 0.0
    assert adv.grpo(r, g, adv.grpo.Options(singleton="reward")).values[2].item() == pytest.approx(0.7 / (1 + 1e-6))
    assert adv.dr_grpo(r, g, adv.dr_grpo.Options(singleton="reward")).values.tolist() == pytest.approx([0.5, -0.5, 0.7])
    assert adv.rloo(r, g, adv.rloo.Options(singleton="reward")).values.tolist() == pytest.approx([1.0, -1.0, 0.7])
    assert adv.rloo(r, g).values[2].item() == 0.0


def test_reinforce_pp_token_whitening_weighs_rows_by_length():
    # a = r - group mean = [0.5, -0.5, 0, 0]; lengths [3, 1, 1, 1] -> token mean (1.5 - 0.5) / 6 = 1/6,
    # unbiased token var (3 (1/3)^2 + (2/3)^2 + 2 (1/6)^2) / (6 - 1) = (15/18) / 5 = 1/6
    # -> A = (a - 1/6) / sqrt(1/6) = [0.8165, -1.6330, -0.4082, -0.4082].
    # Sequence whitening (default): mean 0, var 1/6 -> [1.2247, -1.2247, 0, 0].
    r = torch.tensor([1.0, 0.0, 1.0, 1.0])
    g = torch.tensor([0, 0, 1, 1])
    lengths = torch.tensor([3.0, 1.0, 1.0, 1.0])
    s = math.sqrt(1 / 6)
    tok = adv.reinforce_pp_baseline(r, g, adv.reinforce_pp_baseline.Options(whiten="token"), completion_lengths=lengths)
    assert tok.values.tolist() == pytest.approx([(1 / 3) / s, (-2 / 3) / s, (-1 / 6) / s, (-1 / 6) / s], rel=1e-6)
    seq = adv.reinforce_pp_baseline(r, g, completion_lengths=lengths)  # lengths ignored by the default
    assert seq.values.tolist() == pytest.approx([0.5 / s, -0.5 / s, 0, 0], rel=1e-6)
    # equal lengths with the population variance: token whitening equals sequence whitening
    # (with 'unbiased' they differ by the Bessel factor: n = 20 tokens vs 4 rows)
    pop = {"std": "population"}
    same = adv.reinforce_pp_baseline(
        r, g, adv.reinforce_pp_baseline.Options(whiten="token", **pop), completion_lengths=torch.full((4,), 5.0)
    )
    seq_pop = adv.reinforce_pp_baseline(r, g, adv.reinforce_pp_baseline.Options(**pop))
    assert same.values.tolist() == pytest.approx(seq_pop.values.tolist(), rel=1e-6)
    with pytest.raises(ValueError, match="completion_lengths"):
        adv.reinforce_pp_baseline(r, g, adv.reinforce_pp_baseline.Options(whiten="token"))
    assert adv.reinforce_pp_baseline.inputs == ("completion_lengths",)


@pytest.mark.parametrize("objective", [grpo, dapo])
def test_dual_clip_bounds_negative_advantage_tokens(objective):
    # Two one-token rows, new - old = 2 -> ratio e^2 = 7.389.
    # A = -1: PPO loss max(7.389, 1.2 or 1.28) = 7.389 (gradient 7.389); dual clip c = 3 -> min(7.389, 3) = 3,
    #   gradient 0. A = +1: max(-7.389, -1.2) = -1.2 either way (dual clip acts on A < 0 only).
    # token_mean over 2 tokens.
    b = make_batch([1, 1], [1, 1], [-1.0, 1.0], old=torch.tensor([[0.0, -2.0], [0.0, -2.0]]))
    new = torch.zeros(2, 2, dtype=torch.float64, requires_grad=True)
    eps_hi = 0.2 if objective is grpo else 0.28
    plain = objective.loss(b, new, objective.Options())
    assert plain.loss.item() == pytest.approx((math.exp(2) - (1 + eps_hi)) / 2)
    dual = objective.loss(b, new, objective.Options(dual_clip=3.0))
    assert dual.loss.item() == pytest.approx((3.0 - (1 + eps_hi)) / 2)
    dual.loss.backward()
    assert new.grad[:, 1].tolist() == [0.0, 0.0]
    assert dual.metrics["clip_frac_sum"] == 2.0
    assert decoupled_ppo.Options(dual_clip=3.0).dual_clip == 3.0
    with pytest.raises(ValueError):
        objective.Options(dual_clip=0.5)


def test_count_empty_rows_divides_by_every_row():
    # Row 0 has two loss tokens with ratio 1 and A = 1 -> per-token loss -1, row mean -1; row 1 has
    # no loss token. seq_mean_token_mean: verl/rollwise -1 / 1 = -1; TRL's "grpo" mean over both rows -1 / 2.
    b = make_batch([1, 3], [2, 0], [1.0, 1.0])
    new = b.old_logprobs.clone()
    assert b.num_sequences == 1
    default = grpo.loss(b, new, grpo.Options(aggregation="seq_mean_token_mean"))
    assert default.loss.item() == pytest.approx(-1.0)
    counted = grpo.loss(
        dataclasses.replace(b, num_rows=2), new, grpo.Options(aggregation="seq_mean_token_mean", count_empty_rows=True)
    )
    assert counted.loss.item() == pytest.approx(-0.5)
    # seq_mean_token_sum_norm (norm 4): row sum -2 / (1 row * 4) = -0.5; counting both rows -2 / (2 * 4) = -0.25
    norm = {"aggregation": "seq_mean_token_sum_norm", "norm_constant": 4.0}
    assert grpo.loss(b, new, grpo.Options(**norm)).loss.item() == pytest.approx(-0.5)
    counted = grpo.loss(dataclasses.replace(b, num_rows=2), new, grpo.Options(count_empty_rows=True, **norm))
    assert counted.loss.item() == pytest.approx(-0.25)
    with pytest.raises(ValueError, match="num_rows"):
        grpo.loss(b, new, grpo.Options(aggregation="seq_mean_token_mean", count_empty_rows=True))
    with pytest.raises(ValueError, match="count_empty_rows"):
        grpo.Options(count_empty_rows=True)  # token_mean has no per-row divisor


def test_defaults_unchanged():
    assert adv.grpo.Options().model_dump() == {"eps": 1e-6, "std": "unbiased", "scale": "group", "singleton": "zero"}
    o = grpo.Options()
    assert (o.dual_clip, o.kl_cap, o.kl_bias_correction, o.count_empty_rows) == (None, None, False, False)
    assert adv.reinforce_pp_baseline.Options().whiten == "sequence"
