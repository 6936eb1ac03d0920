"""Per-token entropy and confidence signals of a batch's completions, in the three flavours that
docs/specs/guidance.md §8.2 asks to name explicitly (thresholds do not transfer between them):

- ``"sampler"``: the full-vocabulary entropy ``-sum_v mu(v) log mu(v)`` of the behaviour policy at
  each sampled position, recorded by the sampler (``Rollout.entropies``; the hf backend records it
  when a run's advantage asks for it). The papers' definition (ETTRL, ECHO, MSSR).
- ``"surprisal"``: ``-log mu(y_t)`` of the sampled token (its expectation over y_t is the entropy);
  needs only the sampler log-probs.
- ``"sampled_term"``: ``-p log p`` with ``p = mu(y_t)``, the one-term proxy MSSR's released code uses
  (bounded by 1/e).

Confidence ``"sampled_prob"``: ``p = mu(y_t)``, the probability of the sampled token (ECHO's code
on its remove-padding path, the one every released script takes). The paper's mean top-k
probability needs the engine's top-k log-probs, which the backends do not return.

Every function returns a padded (B, L) float tensor over completion positions (L = the longest
completion) and a (B, L) bool mask of real tokens; padding is 0 / False.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch

EntropyFlavour = Literal["sampler", "surprisal", "sampled_term"]
ENTROPY_HELP = (
    "Token entropy: 'sampler' (full-vocabulary entropy recorded at sampling), 'surprisal' (-log mu(y_t) of "
    "the sampled token) or 'sampled_term' (-p log p of the sampled token; MSSR's code proxy)."
)


def padded(rows: Sequence[Sequence[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged per-row values -> (B, L) float tensor (0-padded) and (B, L) bool mask."""
    width = max((len(r) for r in rows), default=0)
    out = torch.zeros((len(rows), width))
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        if len(r):
            out[i, : len(r)] = torch.tensor(list(r), dtype=torch.float32)
            mask[i, : len(r)] = True
    return out, mask


def token_entropy(
    flavour: EntropyFlavour,
    completion_logprobs: Sequence[Sequence[float]],
    completion_entropies: Sequence[Sequence[float] | None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L) token entropies of the chosen flavour and the (B, L) mask. ``"sampler"`` raises when a
    row's entropies were not recorded (it never falls back silently to a proxy)."""
    if flavour == "sampler":
        ents = list(completion_entropies or [None] * len(completion_logprobs))
        for i, (e, lp) in enumerate(zip(ents, completion_logprobs)):
            if e is None or len(e) != len(lp):
                raise ValueError(
                    f"entropy = 'sampler' needs the sampler's entropies (Rollout.entropies) but row {i} has "
                    "none (the hf backend records them; other backends: use 'surprisal' or 'sampled_term')"
                )
        return padded(ents)
    lp, mask = padded(completion_logprobs)
    if flavour == "surprisal":
        return torch.where(mask, -lp, torch.zeros_like(lp)), mask
    if flavour == "sampled_term":
        p = lp.exp()
        return torch.where(mask, -p * lp, torch.zeros_like(lp)), mask
    raise ValueError(f"unknown entropy flavour {flavour!r}; known: sampler, surprisal, sampled_term")


def sampled_prob(completion_logprobs: Sequence[Sequence[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L) probability of each sampled token under the sampler, and the mask."""
    lp, mask = padded(completion_logprobs)
    return torch.where(mask, lp.exp(), torch.zeros_like(lp)), mask


def row_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) mean of ``x`` over each row's real tokens (0 for an empty row)."""
    n = mask.sum(dim=1)
    return torch.where(n > 0, (x * mask).sum(dim=1) / n.clamp(min=1), torch.zeros(n.shape))


MAX_SAMPLED_TERM = 1.0 / math.e  # -p log p <= 1/e (at p = 1/e)
