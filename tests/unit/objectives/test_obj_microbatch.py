"""Micro-batch additivity: for every objective and aggregation mode, summing the losses (and
gradients w.r.t. a leaf ``new_logprobs``) of ``Batch.rows()`` slices equals the full batch."""

from __future__ import annotations

import dataclasses

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from objtest_utils import make_batch

from rollwise.objectives import OBJECTIVES

NAMES = ["grpo", "dapo", "gspo", "cispo", "decoupled_ppo", "echo"]
MODES = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]


@st.composite
def batches(draw):
    B = draw(st.integers(1, 6))
    prompts = draw(st.lists(st.integers(0, 3), min_size=B, max_size=B))
    # completion length 0 gives a row without loss tokens (kept out of num_sequences)
    completions = draw(st.lists(st.integers(0, 5), min_size=B, max_size=B))
    if sum(completions) == 0:
        completions[0] = 1
    seed = draw(st.integers(0, 2**16))
    adv = draw(st.lists(st.floats(-2, 2), min_size=B, max_size=B))
    batch = make_batch(prompts, completions, adv, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)

    def noise(scale: float) -> torch.Tensor:
        return scale * torch.randn(batch.loss_mask.shape, generator=gen, dtype=batch.loss_mask.dtype) * batch.loss_mask

    batch = dataclasses.replace(
        batch, prox_logprobs=batch.old_logprobs + noise(0.5), ref_logprobs=batch.old_logprobs + noise(0.3), num_rows=B
    )
    new = batch.old_logprobs + noise(0.4)
    entropy = torch.rand(batch.loss_mask.shape, generator=gen, dtype=batch.loss_mask.dtype) * batch.loss_mask
    # a random partition of the rows into micro-batches: contiguous slices or index tensors
    order = draw(st.permutations(range(B)))
    cuts = sorted(draw(st.sets(st.integers(1, B - 1), max_size=B - 1))) if B > 1 else []
    parts = [list(order[a:b]) for a, b in zip([0, *cuts], [*cuts, B])]
    use_slices = draw(st.booleans())
    if use_slices:
        parts = [slice(a, b) for a, b in zip([0, *cuts], [*cuts, B])]
    extra = draw(
        st.sampled_from(
            [
                {},
                {"kl_coef": 0.1},
                {"entropy_coef": 0.01},
                {"tis_level": "sequence"},
                # the peer-convention options (issue #19)
                {"kl_coef": 0.1, "kl_bias_correction": True},
                {"kl_coef": 0.1, "kl_cap": 0.05},
                {"count_empty_rows": True},
                {"dual_clip": 1.5},
            ]
        )
    )
    return batch, new, entropy, parts, extra


def _index(part):
    return part if isinstance(part, slice) else torch.tensor(part, dtype=torch.long)


@settings(max_examples=25, deadline=None)
@given(batches())
def test_micro_batches_sum_to_full_batch(data):
    batch, new, entropy, parts, extra = data
    for name in NAMES:
        fn = OBJECTIVES.get(name)
        if not set(extra) <= set(fn.Options.model_fields):
            continue  # e.g. dual_clip exists only on the clipped-PPO objectives
        for mode in MODES:
            if extra.get("count_empty_rows") and mode == "token_mean":
                continue
            kw = {"aggregation": mode, **extra}
            if mode == "seq_mean_token_sum_norm":
                kw["norm_constant"] = 7.0
            o = fn.Options(**kw)
            leaf = new.detach().clone().requires_grad_(True)
            full = fn(batch, leaf, o, entropy)
            full.loss.backward()
            full_grad = leaf.grad.clone()

            leaf = new.detach().clone().requires_grad_(True)
            total, sums = 0.0, {}
            for part in parts:
                idx = _index(part)
                micro = batch.rows(idx)
                length = micro.loss_mask.shape[1]
                out = fn(micro, leaf[idx][:, :length], o, entropy[idx][:, :length])
                out.loss.backward()
                total = total + out.loss.detach()
                for k, v in out.metrics.items():
                    sums[k] = sums.get(k, 0.0) + v
            assert torch.allclose(total, full.loss.detach(), atol=1e-10), (name, mode)
            assert torch.allclose(leaf.grad, full_grad, atol=1e-10), (name, mode)
            assert sums.keys() == full.metrics.keys()
            for k, v in full.metrics.items():
                assert abs(sums[k] - v) <= 1e-8 * max(1.0, abs(v)), (name, mode, k)
