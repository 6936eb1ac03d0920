"""Random ragged batches shared by the peer parity tests (plain helpers, imported by name).

Every comparison runs in float64 on a fixed seed. Tolerance for "exact" comparisons: ``RTOL`` /
``ATOL`` below -- round-off only (verl's ``seq-mean-token-mean`` divides each row by
``count + 1e-8``, a relative difference of at most 1e-8, the largest deviation any exact test sees).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rollwise.types import Batch

RTOL, ATOL = 1e-7, 1e-10
SEEDS = [0, 1, 2]


@dataclass(frozen=True)
class Ragged:
    """A response-only batch: row i has ``lengths[i]`` loss tokens (the peers' response_mask)."""

    mask: torch.Tensor  # (B, T) float64
    old: torch.Tensor  # (B, T) sampler / old log-probs
    new: torch.Tensor  # (B, T) current log-probs (a leaf; clone with requires_grad per use)
    ref: torch.Tensor  # (B, T) reference log-probs
    adv: torch.Tensor  # (B,) advantages
    groups: torch.Tensor  # (B,) long group ids (ragged sizes, shuffled)
    rewards: torch.Tensor  # (B,) rewards

    def batch(self, num_rows: bool = False) -> Batch:
        """The rollwise ``Batch`` for the same tensors (no prompt tokens; global counts its own)."""
        B, T = self.mask.shape
        return Batch(
            input_ids=torch.zeros(B, T, dtype=torch.long),
            attention_mask=torch.ones(B, T, dtype=torch.bool),
            loss_mask=self.mask,
            old_logprobs=self.old,
            advantages=self.adv,
            rewards=self.rewards,
            group_index=self.groups,
            policy_versions=torch.zeros(B, T, dtype=torch.long),
            num_loss_tokens=int(self.mask.sum().item()),
            num_sequences=int((self.mask.sum(dim=1) > 0).sum().item()),
            ref_logprobs=self.ref,
            num_rows=B if num_rows else None,
        )


def ragged(
    seed: int, *, min_len: int = 1, max_len: int = 9, drift: float = 0.3, singletons: bool = False, binary: bool = False
) -> Ragged:
    """Groups of 2..5 rows (plus one-row groups with ``singletons``), lengths in [min_len, max_len]
    (with ``min_len = 0`` row 0 is empty),
    ``new = old + drift * N(0, 1)`` on loss tokens (ratios around 1, some clipped), ref likewise."""
    gen = torch.Generator().manual_seed(seed)
    sizes = [int(s) for s in torch.randint(2, 6, (5,), generator=gen)] + ([1, 1] if singletons else [])
    groups = torch.cat([torch.full((s,), 10 * g + 3) for g, s in enumerate(sizes)])
    groups = groups[torch.randperm(len(groups), generator=gen)]
    B = len(groups)
    lengths = torch.randint(min_len, max_len + 1, (B,), generator=gen)
    if min_len == 0:
        lengths[0] = 0  # at least one row without loss tokens
    T = max(int(lengths.max()), 1)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    old = -3 * torch.rand(B, T, generator=gen, dtype=torch.float64) * mask
    new = (old + drift * torch.randn(B, T, generator=gen, dtype=torch.float64)) * mask
    ref = (old + drift * torch.randn(B, T, generator=gen, dtype=torch.float64)) * mask
    if binary:
        rewards = torch.randint(0, 2, (B,), generator=gen).double()
    else:
        rewards = torch.rand(B, generator=gen, dtype=torch.float64)
    adv = torch.randn(B, generator=gen, dtype=torch.float64)
    return Ragged(mask, old, new, ref, adv, groups, rewards)


def leaf(x: torch.Tensor) -> torch.Tensor:
    return x.detach().clone().requires_grad_(True)


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a.detach().double(), b.detach().double(), rtol=RTOL, atol=ATOL)
