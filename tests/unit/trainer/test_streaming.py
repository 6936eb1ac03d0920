"""Periodic asynchrony's gradient scale (rollwise.trainer.streaming): a streamed loss is the plain
sum (unit denominators), so the step multiplies the gradient by d_unit / D."""

import torch

from rollwise.objectives.common import denominator
from rollwise.trainer.streaming import unit_counts
from rollwise.types import Batch


def _batch(tokens, seqs, rows=None):
    z = torch.zeros(2, 3)
    return Batch(
        torch.zeros(2, 3, dtype=torch.long),
        torch.ones(2, 3, dtype=torch.bool),
        z,
        z,
        torch.zeros(2),
        torch.zeros(2),
        torch.zeros(2, dtype=torch.long),
        torch.zeros(2, 3, dtype=torch.long),
        tokens,
        seqs,
        num_rows=rows,
    )


def test_scale_per_aggregation():
    b = _batch(tokens=4, seqs=2, rows=3)
    u = unit_counts(b)
    assert (u.num_loss_tokens, u.num_sequences, u.num_rows) == (1, 1, 1)
    # token_mean: the sum over tokens / 4 -> scale 1 / 4
    assert denominator("token_mean", u) / denominator("token_mean", b) == 0.25
    # seq_mean_token_mean: / 2 sequences -> 1 / 2; with count_empty_rows / 3 rows -> 1 / 3
    assert denominator("seq_mean_token_mean", u) / denominator("seq_mean_token_mean", b) == 0.5
    assert (
        denominator("seq_mean_token_mean", u, None, True) / denominator("seq_mean_token_mean", b, None, True) == 1 / 3
    )
    # seq_mean_token_sum_norm with norm 8: unit 1 * 8 = 8, full 2 * 8 = 16 -> 1 / 2
    assert denominator("seq_mean_token_sum_norm", u, 8.0) / denominator("seq_mean_token_sum_norm", b, 8.0) == 0.5
