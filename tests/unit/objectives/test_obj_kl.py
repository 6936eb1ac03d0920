"""KL estimators beyond the numerical guard, and the peer-convention KL options (issue #19).

The k3 numbers are the issue's repro: with l = log pi_ref - log pi_theta,
k3 = e^l - 1 - l and d k3 / d log pi_theta = 1 - e^l.

- l = 21: e^21 = 1318815734.48 -> k3 = 1318815712.48 (1.32e9), gradient -1318815733.48 (-1.32e9).
  The old code clamped only the exponential at 20: k3 = e^20 - 22 = 485165173.41 (4.85e8) and
  gradient +1 (the clamped exponential has no gradient, -l gives +1).
- grpo, kl_coef = 0.1, one loss token at l = 25, ratio 1, advantage 0 (token_mean over 1 token):
  d loss / d log pi_theta = 0.1 (1 - e^25) = 0.1 (1 - 72004899337.39) = -7200489933.64 (the old
  code gave +0.1: descent pushed the token further from the reference).
"""

from __future__ import annotations

import math

import pytest
import torch
from objtest_utils import make_batch, place

from rollwise.objectives import cispo, dapo, grpo, gspo
from rollwise.objectives.common import kl_penalty

E21 = math.exp(21.0)
E25 = math.exp(25.0)


def _k3_and_grad(l: float, dtype=torch.float64) -> tuple[float, float]:
    new = torch.tensor([0.0], dtype=dtype, requires_grad=True)
    ref = torch.tensor([l], dtype=dtype)
    k = kl_penalty(new, ref, "k3")
    k.sum().backward()
    return k.item(), new.grad.item()


def test_k3_beyond_the_guard_has_the_exact_value_and_gradient():
    value, grad = _k3_and_grad(21.0)
    assert value == pytest.approx(E21 - 1 - 21, rel=1e-9)  # 1.32e9, not 4.85e8
    assert value > 1.3e9
    assert grad == pytest.approx(1 - E21, rel=1e-9)  # -1.32e9, not +1
    assert grad < 0


def test_k3_grpo_kl_gradient_pulls_towards_the_reference_at_l_25():
    b = make_batch([1], [1], [0.0], old=torch.zeros(1, 2), ref=torch.tensor([[0.0, 25.0]]))
    new = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    out = grpo.loss(b, new, grpo.Options(kl_coef=0.1))
    out.loss.backward()
    g = new.grad[0, 1].item()
    assert g == pytest.approx(0.1 * (1 - E25), rel=1e-9)  # -7.2e9, not +0.1
    assert g < 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_k3_is_finite_convex_and_increasing_far_beyond_the_guard(dtype):
    # Far out (l = 200, where e^l overflows every float dtype) k3 continues along its tangent at
    # the guard: still finite, still growing with l, gradient still pointing towards the reference.
    ls = [0.5, 5.0, 21.0, 60.0, 200.0, 1000.0]
    vals, grads = zip(*(_k3_and_grad(l, dtype) for l in ls))
    assert all(math.isfinite(v) and math.isfinite(g) for v, g in zip(vals, grads))
    assert all(a < b for a, b in zip(vals, vals[1:])), vals
    assert all(g < 0 for g in grads)
    assert all(a >= b for a, b in zip(grads, grads[1:])), grads  # convex in l: slope never shrinks


def test_k3_below_the_guard_is_unchanged_and_negative_side_exact():
    # l = 1: e - 2 = 0.718281828; gradient 1 - e = -1.718281828.
    value, grad = _k3_and_grad(1.0)
    assert value == pytest.approx(math.e - 2, rel=1e-12)
    assert grad == pytest.approx(1 - math.e, rel=1e-12)
    # l = -30 (pi_theta far above the reference): e^-30 - 1 + 30 = 29.0000000000000936, gradient
    # 1 - e^-30 (the old code clamped e^l at e^-20 there: value off by 2e-9, gradient exactly 1).
    value, grad = _k3_and_grad(-30.0)
    assert value == pytest.approx(29.0 + math.exp(-30), rel=1e-15)
    assert grad == pytest.approx(1 - math.exp(-30), rel=1e-15)


def test_kl_cap_reproduces_verl_low_var_kl_clamp():
    # verl's low_var_kl clamps k3 to [-10, 10]. l = 3: e^3 - 4 = 16.0855 -> 10, gradient 0;
    # l = 1: 0.71828 stays, gradient 1 - e.
    new = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([3.0, 1.0], dtype=torch.float64)
    k = kl_penalty(new, ref, "k3", cap=10.0)
    assert k.tolist() == pytest.approx([10.0, math.e - 2])
    k.sum().backward()
    assert new.grad.tolist() == pytest.approx([0.0, 1 - math.e])


def test_kl_cap_is_an_objective_option_and_only_for_k3():
    b = make_batch([1], [1], [0.0], old=torch.zeros(1, 2), ref=torch.tensor([[0.0, 3.0]]))
    new = torch.zeros(1, 2, dtype=torch.float64)
    capped = grpo.loss(b, new, grpo.Options(kl_coef=0.5, kl_cap=10.0))
    assert capped.loss.item() == pytest.approx(0.5 * 10.0)  # one token, A = 0: the loss is 0.5 * min(16.09, 10)
    assert capped.metrics["kl_sum"] == pytest.approx(10.0)
    with pytest.raises(ValueError, match="kl_cap"):
        grpo.Options(kl_estimator="k1", kl_cap=10.0)


@pytest.mark.parametrize("objective", [grpo, dapo, cispo])
def test_kl_bias_correction_multiplies_the_kl_by_the_token_ratio(objective):
    # TRL's use_bias_correction_kl: per-token KL times coef_1 = pi_theta / pi_old (not detached).
    # One token, new = 0, old = -ln 2 -> ratio 2; ref = 1 -> l = 1, k3 = e - 2 = 0.71828.
    # A = 0 so the policy term is 0: loss = 0.1 * 2 * 0.71828 = 0.143656.
    # d/dnew [r(new) k3(new)] = r k3 + r (1 - e^l) = 2 (e - 2) + 2 (1 - e) = -2, times 0.1 = -0.2.
    b = make_batch([1], [1], [0.0], old=torch.tensor([[0.0, -math.log(2)]]), ref=torch.tensor([[0.0, 1.0]]))
    new = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    out = objective.loss(b, new, objective.Options(kl_coef=0.1, kl_bias_correction=True))
    assert out.loss.item() == pytest.approx(0.1 * 2 * (math.e - 2))
    out.loss.backward()
    assert new.grad[0, 1].item() == pytest.approx(-0.2)
    assert out.metrics["kl_sum"] == pytest.approx(math.e - 2)  # the metric is the plain estimator


def test_kl_bias_correction_in_gspo_uses_the_sequence_ratio():
    # TRL with importance_sampling_level="sequence": coef_1 = exp(mean_t(new - old)) per row.
    # Two tokens, new - old = [ln 2, 0] -> s = sqrt(2); ref = new -> k3 = 0 on token 0, and
    # ref - new = 1 on token 1 -> k3 = e - 2. A = 0. seq_mean_token_mean over 1 row:
    # loss = 0.1 * sqrt(2) * (0 + (e - 2)) / 2.
    b = make_batch([1], [2], [0.0], old=torch.tensor([[0.0, -math.log(2), 0.0]]), ref=torch.tensor([[0.0, 0.0, 1.0]]))
    new = torch.zeros(1, 3, dtype=torch.float64)
    out = gspo.loss(b, new, gspo.Options(kl_coef=0.1, kl_bias_correction=True))
    assert out.loss.item() == pytest.approx(0.1 * math.sqrt(2) * (math.e - 2) / 2)


def test_kl_bias_correction_needs_reference_logprobs():
    b = make_batch([1], [2], [1.0])
    new = place(b, [[-0.1, -0.2]])
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo.loss(b, new, grpo.Options(kl_coef=0.1, kl_bias_correction=True))
