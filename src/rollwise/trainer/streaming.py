"""Periodic asynchrony's consumer (``train.async.periodic``): back-propagate each group as soon as it
is generated, take the optimizer step when the batch is complete.

Paper: Jian Lu, "Periodic Asynchrony: an on-policy producer-consumer pipeline for RL post-training",
arXiv 2511.18871; docs/specs/systems.md §4. The mechanism is a **reconstruction from the abstracts**
(the spec marks it [inferred]; no code was found): weights are synced at the start of each
iteration, every rollout of iteration k is drawn from θ_k, and the trainer's data loader consumes
finished samples while generation runs, accumulating gradients, with one optimizer step per batch.
So the algorithm is the synchronous one; only the schedule overlaps.

How rollwise does it: the async pool (``rollwise.distributed.async_pool``, run with η = 0) generates
the step's plan in ``train.async.periodic_chunks`` chunks on its own copy of the weights and hands
each chunk's finished groups to :meth:`StreamingTrainer.consume` in the loop's thread while the
next chunk generates. ``consume`` makes those groups' rows exactly as the loop will (filters,
reward shaping, advantages, collation: ``batches.Batches.stream``) and runs
``Trainer.accumulate`` on them with unit denominators (``num_loss_tokens = num_sequences =
num_rows = 1``), because the step's global loss-token count is not known until the last group
arrives. The loop then calls :meth:`optimize` with the full batch as always; every objective's
loss is a sum of per-row terms over one global constant (``objectives.common.aggregate``), so
the accumulated gradient times ``d_unit / D`` (``objectives.common.denominator``) is the
full-batch gradient up to summation order, and the optimizer step is the synchronous one
(tests/unit/trainer/test_streaming.py; spec §4 property 1).

If the batch the loop trains on is not made of the streamed rows (a top-up round changed a group,
a batch-level advantage statistic, a filter that keeps a share of the batch), ``optimize`` drops
the streamed gradients and computes the batch from scratch (``periodic/recomputed`` = 1): still
exact, without the overlap. A part that always does so (batch statistics, ``finish_batch``:
its ``Compat.batch_statistics``) is refused at config load (``rollwise.compat.check_periodic``).
Differences from the paper: no shared-prompt attention packing
(§4 item 6; rollwise packs rows first-fit instead), chunks of groups rather than single samples.
Logs ``periodic/streamed_rows`` and ``periodic/recomputed``.
"""

from __future__ import annotations

import dataclasses

from rollwise.objectives.common import denominator
from rollwise.registry import Compat
from rollwise.types import Batch

# Strictly on-policy and streamed: every row of the batch must be a row it back-propagated as its group
# arrived (what cannot be, e.g. batch statistics, is refused by rollwise.compat.check_periodic); one
# generator per process, not shared across data-parallel ranks.
COMPAT = Compat(decode_hooks=False, per_rank=False)


def row_keys(batch: Batch) -> list[tuple]:
    """One hashable key per row: its token ids, loss mask, sampler log-probs and advantages."""
    out = []
    for i in range(batch.size):
        n = int(batch.attention_mask[i].sum())
        tok = None if batch.token_advantages is None else tuple(batch.token_advantages[i, :n].tolist())
        out.append(
            (
                tuple(batch.input_ids[i, :n].tolist()),
                tuple(batch.loss_mask[i, :n].tolist()),
                tuple(batch.old_logprobs[i, :n].tolist()),
                float(batch.advantages[i]),
                tok,
            )
        )
    return out


def unit_counts(batch: Batch) -> Batch:
    """``batch`` with the step's global counts set to 1 (its loss is then the plain sum)."""
    return dataclasses.replace(
        batch, num_loss_tokens=1, num_sequences=1, num_rows=None if batch.num_rows is None else 1
    )


class StreamingTrainer:
    """The trainer, plus :meth:`consume`; ``prepare(groups) -> Batch`` makes a batch of groups as
    the loop does."""

    def __init__(self, trainer, prepare):
        self.trainer, self.prepare = trainer, prepare
        self._reset()

    def __getattr__(self, name):  # state_dict, model, ... of the trainer
        return getattr(self.trainer, name)

    def _reset(self) -> None:
        self.acc, self.keys = None, []

    def consume(self, groups) -> None:
        batch = self.prepare(groups)
        if batch is None or batch.size == 0:
            return
        self.acc = self.trainer.accumulate(unit_counts(batch), None, self.acc)
        self.keys += row_keys(batch)

    def optimize(self, batch: Batch) -> dict[str, float]:
        streamed, acc, keys = len(self.keys), self.acc, self.keys
        self._reset()
        if acc is None:
            return {**self.trainer.optimize(batch), "periodic/streamed_rows": 0, "periodic/recomputed": 0}
        if batch.num_loss_tokens == 0 or sorted(keys) != sorted(row_keys(batch)):
            self.trainer.optimizer.zero_grad(set_to_none=True)  # not the rows the loop trains on: start over
            return {**self.trainer.optimize(batch), "periodic/streamed_rows": 0, "periodic/recomputed": 1}
        opts = self.trainer.options
        args = (opts.aggregation, None, opts.norm_constant, opts.count_empty_rows)
        scale = denominator(args[0], unit_counts(batch), *args[2:]) / denominator(args[0], batch, *args[2:])
        return {
            **self.trainer.step(batch, acc, grad_scale=scale),
            "periodic/streamed_rows": streamed,
            "periodic/recomputed": 0,
        }
