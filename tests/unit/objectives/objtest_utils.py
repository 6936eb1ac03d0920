"""Batch builders shared by the objective tests (plain helpers, imported by name)."""

from __future__ import annotations

import torch

from rollwise.types import Batch


def make_batch(
    prompt_lens: list[int],
    completion_lens: list[int],
    advantages: list[float] | torch.Tensor,
    *,
    old: torch.Tensor | None = None,
    prox: torch.Tensor | None = None,
    ref: torch.Tensor | None = None,
    group_index: list[int] | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> Batch:
    """A right-padded batch: row i has ``prompt_lens[i]`` prompt tokens then
    ``completion_lens[i]`` completion tokens (the loss tokens). Unset log-prob tensors are
    random on loss tokens and 0 elsewhere; global counts are the batch's own."""
    gen = torch.Generator().manual_seed(seed)
    B = len(prompt_lens)
    lengths = [p + c for p, c in zip(prompt_lens, completion_lens)]
    T = max(max(lengths), 1)
    pos = torch.arange(T)[None, :]
    p = torch.tensor(prompt_lens)[:, None]
    n = torch.tensor(lengths)[:, None]
    attention = pos < n
    loss_mask = ((pos >= p) & attention).to(dtype)

    def logp() -> torch.Tensor:
        return (-torch.rand(B, T, generator=gen, dtype=dtype) * 3) * loss_mask

    old = logp() if old is None else old.to(dtype)
    adv = torch.as_tensor(advantages, dtype=dtype)
    return Batch(
        input_ids=torch.randint(0, 50, (B, T), generator=gen) * attention,
        attention_mask=attention,
        loss_mask=loss_mask,
        old_logprobs=old,
        advantages=adv,
        rewards=torch.zeros(B, dtype=dtype),
        group_index=torch.tensor(group_index if group_index is not None else [0] * B),
        policy_versions=torch.zeros(B, T, dtype=torch.long),
        num_loss_tokens=int(loss_mask.sum().item()),
        num_sequences=int((loss_mask.sum(dim=1) > 0).sum().item()),
        ref_logprobs=None if ref is None else ref.to(dtype),
        prox_logprobs=None if prox is None else prox.to(dtype),
    )


def place(batch: Batch, rows: list[list[float]]) -> torch.Tensor:
    """Put per-row completion values into a (B, T) tensor on the loss tokens (0 elsewhere)."""
    out = torch.zeros_like(batch.loss_mask)
    for i, vals in enumerate(rows):
        idx = batch.loss_mask[i].nonzero().flatten()
        assert len(idx) == len(vals), (i, len(idx), len(vals))
        out[i, idx] = torch.tensor(vals, dtype=out.dtype)
    return out
