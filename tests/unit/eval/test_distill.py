"""On-policy-distillation diagnostics (rollwise.eval.distill): the logit-space directions, the cosine and
the per-class summary, with hand-worked numbers."""

import math

import pytest
import torch

from rollwise.eval.distill import (
    RolloutScore,
    cosine,
    kl_descent,
    loo_baselines,
    reverse_kl,
    score_rollout,
    success_direction,
    summarise,
)

T = torch.tensor
HALF = torch.log(T([[0.5, 0.5]]))  # logits of p = [0.5, 0.5]
Q = torch.log(T([[0.8, 0.2]]))


def test_kl_descent_by_hand():
    # KL = 0.5 ln(0.5/0.8) + 0.5 ln(0.5/0.2) = 0.5 (-0.4700 + 0.9163) = 0.2231
    assert reverse_kl(HALF, Q).item() == pytest.approx(0.22314, abs=1e-5)
    # -dKL/dz_k = -p_k (ln p_k - ln q_k - KL): -0.5 (-0.4700 - 0.2231) = 0.3466 and -0.5 (0.9163 - 0.2231) = -0.3466
    assert kl_descent(HALF, Q)[0].tolist() == pytest.approx([0.34657, -0.34657], abs=1e-5)
    # matches autograd of the reverse KL through the softmax
    z = HALF.clone().double().requires_grad_(True)
    reverse_kl(z, Q).sum().backward()
    assert (-z.grad)[0].tolist() == pytest.approx(kl_descent(HALF, Q)[0].tolist())


def test_success_direction_by_hand():
    # weight (r - b) = 0.5, y = 0: 0.5 * ([1, 0] - [0.5, 0.5]) = [0.25, -0.25]
    assert success_direction(HALF, T([0]), 0.5)[0].tolist() == pytest.approx([0.25, -0.25])
    assert loo_baselines([1.0, 0.0, 0.0, 1.0]) == pytest.approx([1 / 3, 2 / 3, 2 / 3, 1 / 3])
    assert loo_baselines([1.0]) == [0.0]


def test_a_teacher_whose_kl_gradient_is_the_success_gradient_scores_one():
    # the teacher q = [0.8, 0.2] pulls towards token 0, the rollout's correct token: on two tokens both
    # directions are multiples of [1, -1], with positive factors 0.3466 and 0.25 -> cosine exactly 1
    s = score_rollout(HALF, Q, T([0]), reward=1.0, baseline=0.5)
    assert s.alignment == pytest.approx(1.0) and s.correct
    # the same teacher on a wrong rollout that sampled token 0 (r - b = -0.5) points the other way: -1
    assert score_rollout(HALF, Q, T([0]), reward=0.0, baseline=0.5).alignment == pytest.approx(-1.0)
    assert cosine(T([1.0, 2.0, 3.0]), T([2.0, 4.0, 6.0])) == pytest.approx(1.0)
    assert cosine(T([1.0, 0.0]), T([0.0, 1.0])) == 0.0


def test_a_teacher_identical_to_the_student_gives_a_zero_direction_not_nan():
    z = T([[0.3, -1.0, 2.0], [0.0, 0.5, -0.5]])
    s = score_rollout(z, z, T([2, 1]), reward=1.0, baseline=0.0)
    assert s.distill_norm == 0.0 and s.kl == 0.0
    assert s.alignment == 0.0 and not math.isnan(s.alignment)
    assert s.success_norm > 0.0


def test_summary_splits_correct_and_incorrect_and_skips_rollouts_without_signal():
    scores = [
        RolloutScore(True, 0.2, 1.0, 1.0, 0.1),
        RolloutScore(True, 0.9, 1.0, 0.0, 0.3),  # r = b: no Monte-Carlo signal, out of the mean
        RolloutScore(False, 0.6, 2.0, 1.0, 0.5),
        RolloutScore(False, 0.4, 0.0, 1.0, 0.1),
    ]
    out = summarise(scores)
    assert out["correct"]["rollouts"] == 2 and out["correct"]["with_signal"] == 1 and out["correct"]["no_signal"] == 1
    assert out["correct"]["alignment_mean"] == pytest.approx(0.2)
    assert out["correct"]["kl_mean"] == pytest.approx(0.2)
    assert out["incorrect"]["alignment_mean"] == pytest.approx(0.5)
    assert out["incorrect"]["distill_norm_mean"] == pytest.approx(1.0)
    assert out["all"]["with_signal"] == 3 and out["all"]["alignment_mean"] == pytest.approx(1.2 / 3)
    assert summarise([])["correct"]["alignment_mean"] is None
