"""Extra per-row inputs that some advantage estimators declare (``fn.inputs``), computed from
the batch's rollouts. The loop calls ``advantage_inputs(fn, rows)`` for every estimator; the
plain ones declare nothing and get ``{}``.
"""

from __future__ import annotations

from typing import Sequence

import torch

from rollwise.types import Rollout


def sequence_logprob(rows: Sequence[Rollout]) -> torch.Tensor:
    """(B,) mean sampler log-prob of each row's completion tokens (0.0 for an empty completion)."""
    return torch.tensor([sum(r.logprobs) / len(r.logprobs) if r.logprobs else 0.0 for r in rows], dtype=torch.float32)


def tree_paths(rows: Sequence[Rollout]) -> list:
    """Each row's ``Rollout.tree`` (None for a rollout sampled alone), for the ``tree`` advantage."""
    return [getattr(r, "tree", None) for r in rows]


def completion_logprobs(rows: Sequence[Rollout]) -> list[tuple[float, ...]]:
    """Each row's sampler log-probs (one per completion token; their count is the completion length)."""
    return [r.logprobs for r in rows]


_INPUTS = {"seq_logprob": sequence_logprob, "tree_paths": tree_paths, "completion_logprobs": completion_logprobs}


def advantage_inputs(fn, rows: Sequence[Rollout]) -> dict[str, torch.Tensor]:
    """Keyword inputs an estimator declares in ``fn.inputs`` beyond (rewards, group ids), computed
    from the batch's rows (the ``rows`` of ``train.batching.flatten``); ``{}`` for the others."""
    return {name: _INPUTS[name](rows) for name in getattr(fn, "inputs", ())}
