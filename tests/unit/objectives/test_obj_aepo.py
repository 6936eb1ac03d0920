"""AEPO's entropy-balanced clip (issue #44, ``objectives/aepo.py``): a clipped high-entropy token passes
the gradient rescaled to the clip bound (GRPO gives it 0), with hand-worked numbers."""

from __future__ import annotations

import math

import pytest
import torch
from objtest_utils import make_batch

from rollwise.objectives import OBJECTIVES
from rollwise.objectives.aepo import Options, entropy_weight, high_entropy, loss
from rollwise.objectives.grpo import Options as GrpoOptions
from rollwise.objectives.grpo import loss as grpo_loss

# one row, 1 prompt token then 3 loss tokens; old log-probs 0, so the ratio is exp(new)
ENTROPY = torch.tensor([[0.0, 2.0, 0.5, 0.1]], dtype=torch.float64)  # token 1 is the row's high-entropy one


def grads(objective, opts, ratios, advantage):
    batch = make_batch([1], [3], [advantage], old=torch.zeros(1, 4))
    new = torch.tensor([[0.0] + [math.log(r) for r in ratios]], dtype=torch.float64, requires_grad=True)
    out = objective(batch, new, opts, ENTROPY)
    out.loss.backward()
    return out.loss.item(), new.grad[0, 1:].tolist()


def test_a_clipped_high_entropy_token_passes_the_rescaled_gradient_not_zero():
    """A = 1, clip 0.2, ratios (1.5, 1.0, 1.5), token mean over 3. Token 1 (entropy 2.0, the only one at
    or above the row's 0.8 quantile, 1.4) is clipped: its loss term is -sg(1.2 / 1.5) * r, gradient
    -1.2 / 3 = -0.4 (GRPO: 0). Token 2 is unclipped (-1 / 3). Token 3, clipped but low-entropy: 0.
    The loss value is GRPO's: (-1.2 - 1.0 - 1.2) / 3."""
    value, g = grads(loss, Options(clip_eps=0.2), (1.5, 1.0, 1.5), 1.0)
    assert g == pytest.approx([-0.4, -1 / 3, 0.0])
    grpo_value, grpo_g = grads(grpo_loss, GrpoOptions(clip_eps=0.2), (1.5, 1.0, 1.5), 1.0)
    assert grpo_g == pytest.approx([0.0, -1 / 3, 0.0])
    assert value == pytest.approx(grpo_value) == pytest.approx(-3.4 / 3)


def test_the_negative_side_of_the_clip_too():
    """A = -1, ratio 0.5 < 0.8 on the high-entropy token: clipped (0.8 > 0.5), gradient -A * 0.8 / 3."""
    _, g = grads(loss, Options(clip_eps=0.2), (0.5, 1.0, 0.5), -1.0)
    assert g == pytest.approx([0.8 / 3, 1 / 3, 0.0])


def test_high_entropy_is_per_row_and_the_entropy_aware_weight_is_clamped():
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    assert high_entropy(ENTROPY, mask, 0.8).tolist() == [[False, True, False, False]]
    assert high_entropy(ENTROPY, mask, 0.0).tolist() == [[False, True, True, True]]
    # row mean 2.6 / 3; relative (2.0 - m) / m = 1.31 -> clamped to 1; (0.1 - m) / m = -23 / 26
    w = entropy_weight(ENTROPY, mask, 0.5)[0, 1:].tolist()
    m = 2.6 / 3
    assert w == pytest.approx([1.5, 1 + 0.5 * (0.5 - m) / m, 1 + 0.5 * (0.1 - m) / m])


def test_registered_with_described_options():
    fn = OBJECTIVES.get("aepo")
    assert all(info.description for info in fn.Options.model_fields.values())
    with pytest.raises(ValueError, match="entropy"):
        fn(make_batch([1], [3], [1.0]), torch.zeros(1, 4, dtype=torch.float64), None, None)
