"""Data-parallel training with ``torch.distributed`` (docs/architecture.md §8, last bullet): ``torchrun
--nproc_per_node N -m rollwise.cli train ...`` runs the same loop in N processes that take the
same optimizer steps, each generating and training on a share of every step.

How a step is shared (the loop is unchanged; ``Run`` and the ``Trainer`` get this module's
:class:`DataParallel`):

- **Generation.** :class:`DataParallelPool` splits a plan's requests across the ranks (whole
  requests, balanced by rollouts: ``local.split``); every request is generated with its own
  seed (``local.request_seed``, as ``distributed.request_seeds``), so what it gets does not
  depend on which rank ran it; ``all_gather_object`` then gives every rank all the rollouts in
  plan order. Every rank therefore holds the same groups, and the controller, filters, replay,
  reward shaping and advantages, which are deterministic, stay identical without further
  messages. Evaluation is shared the same way. Costs are summed over the ranks when the
  rollouts are gathered (``time/generate_s`` is the slowest rank's generation + verification,
  ``time/verify_s`` the ranks' verification seconds summed, as the Ray pool reports them).
- **Training.** Rank ``r`` of ``W`` trains on the contiguous rows ``[B r / W, B (r+1) / W)``
  of the step's batch (:meth:`DataParallel.shard`), in micro-batches of ``train.micro_batch``.
  Every micro-batch's loss is divided by the *global* loss-token count of the optimizer step
  (``Batch.num_loss_tokens``, which ``Batch.rows`` keeps), so the step's gradient is the SUM of
  the ranks' gradients, not their mean: :meth:`DataParallel.all_reduce_grads` sums them once per
  optimizer step, before clipping, and every rank then clips the same gradient and takes the
  same AdamW step. The loss, the objectives' ``*_sum`` metrics, the sampler/trainer mismatch and
  the ESS log-weights are gathered in rank order (:meth:`DataParallel.combine`), so
  ``metrics.jsonl`` reads as a one-process run's.
- **A failure on one rank.** The checks that can fail on one rank only (the trainer's memory
  check, token ids its model cannot embed) run for all of a rank's micro-batches before its first
  pass and meet in :meth:`DataParallel.agree`, so every rank raises the failing rank's message
  (issue #40) rather than wait in the next collective for the process group's timeout.
- **The run directory.** Rank 0 sets up first (directory, lock, config, warm start, resume);
  the others then take its run name, read its checkpoint on resume, and receive its weights
  (a broadcast, as torch DDP does at construction). Only rank 0 writes: ledger lines,
  evaluations, plots, checkpoints, ``final/``, trackers and progress. Resuming needs the run
  directory readable on every node (a shared filesystem).

Why not ``torch.nn.parallel.DistributedDataParallel``: it averages gradients (the global
normaliser would have to be undone by multiplying by ``W``), all-reduces during every
micro-batch's backward unless told ``no_sync``, and wraps the module (the trainer's packed
decoder path reads the Hugging Face model's own decoder and LM head). Summing the accumulated
gradients once per optimizer step is the same arithmetic with none of that; it forgoes DDP's
overlap of communication with the backward pass. With 2 ranks whose shards are exactly the
one-process run's micro-batches, the sum is bit-identical (``a + b`` commutes); otherwise it
differs from one process by float summation order only (tests/invariants/test_data_parallel.py).

Limits (refused by :func:`check_config` with the key to change): Ray rollout workers
(``distributed.workers > 0``), rollout strategies that drive the sampler in this process
(ARRoL, LATR trees, APRIL, SPEC-RL), and ``model.backend = "vllm"`` (one engine per rank on
one device is not handled). Every rank holds the whole model and optimizer state, unless
``train.fsdp = true``: then the trainer shards them with FSDP2 (``rollwise.trainer.fsdp``),
whose reduce-scatter replaces :meth:`DataParallel.all_reduce_grads`, and each rank keeps one whole
copy of the weights for its sampler.

Process group: ``gloo`` on CPU; where every local rank has a GPU, ``cpu:gloo,cuda:nccl`` (CUDA
tensors go through NCCL, CPU tensors and the object collectives through gloo) after
``torch.cuda.set_device(LOCAL_RANK)``. The gradients are all-reduced where the model's
parameters are; the hf trainer keeps its model on the CPU today, so the NCCL path is not
exercised by the tests (CPU only). Started from torchrun's environment (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), once per process.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from rollwise.registry import Compat, UserError

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
BUCKET = 1 << 24  # gradient elements per all-reduce (64 MB of fp32): few messages, bounded extra memory
_ACTIVE: DataParallel | None = None


# ---------------------------------------------------------------- configuration


def env_world_size() -> int:
    """torchrun's ``WORLD_SIZE`` (1 when not started by torchrun)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise UserError(f"WORLD_SIZE = {os.environ['WORLD_SIZE']!r} is not an integer") from None


def env_rank() -> int:
    """torchrun's ``RANK`` of this process (0 when not started by torchrun): the command line
    prints its header and closing lines on rank 0 only."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        raise UserError(f"RANK = {os.environ['RANK']!r} is not an integer") from None


def enabled(cfg) -> bool:
    """Whether this process trains data-parallel: ``distributed.data_parallel``, or when it is
    unset, whether torchrun started more than one process (``WORLD_SIZE > 1``)."""
    on = cfg.distributed.data_parallel
    return env_world_size() > 1 if on is None else bool(on)


def check_config(cfg) -> None:
    """Local refusals for data-parallel training, from ``distributed.data_parallel`` and torchrun's
    environment (``rollwise.compat.check``, so before any model is loaded; again at :func:`start`).
    What it cannot be combined with (Ray workers, asynchrony, vLLM, in-process rollout wrappers) is
    refused by ``rollwise.compat`` from the parts' records. UserErrors name the key."""
    world, on = env_world_size(), cfg.distributed.data_parallel
    if on is False and world > 1:
        raise UserError(
            f"distributed.data_parallel = false, but torchrun started {world} processes (WORLD_SIZE); "
            "start one process, or unset distributed.data_parallel"
        )
    if not enabled(cfg):
        return
    missing = [k for k in TORCHRUN_ENV if k not in os.environ]
    if missing or world < 2:
        raise UserError(
            "distributed.data_parallel = true needs torchrun with at least 2 processes "
            "(torchrun --nproc_per_node 2 -m rollwise.cli train ...); "
            + (f"{', '.join(missing)} not set" if missing else f"WORLD_SIZE = {world}")
        )


COMPAT = Compat(decode_hooks=False)  # one sampler per rank: a wrapper driving it in one process is not shared


def start(cfg) -> DataParallel | None:
    """This process's :class:`DataParallel` (the process group started on first use), or None
    when it trains alone (:func:`enabled`)."""
    global _ACTIVE
    check_config(cfg)
    if not enabled(cfg):
        return None
    if _ACTIVE is None:
        import torch.distributed as dist

        local = int(os.environ.get("LOCAL_RANK", "0"))
        if not dist.is_initialized():
            backend = "gloo"
            # NCCL only where every rank of this node has its own GPU (the same choice on every rank)
            if torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ.get("LOCAL_WORLD_SIZE", "1")):
                torch.cuda.set_device(local)
                backend = "cpu:gloo,cuda:nccl"
            dist.init_process_group(backend)  # env:// from torchrun's variables
        _ACTIVE = DataParallel(dist.get_rank(), dist.get_world_size())
    return _ACTIVE


def shard_bounds(n: int, rank: int, world: int) -> range:
    """Rows ``[n r / W, n (r+1) / W)`` of rank ``r``: contiguous, sizes differing by at most one,
    in rank order covering ``0..n`` (n = 5, W = 2: rank 0 rows 0-1, rank 1 rows 2-4)."""
    return range(n * rank // world, n * (rank + 1) // world)


# ---------------------------------------------------------------- the ranks


def _quiet(*args, **kwargs) -> None:
    pass


class DataParallel:
    """One rank's view: ``rank`` of ``world``; collectives over the default process group."""

    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world

    @property
    def main(self) -> bool:
        """Rank 0: the rank that writes the run directory and logs."""
        return self.rank == 0

    def shard(self, n: int) -> range:
        """This rank's rows of a batch of ``n`` rows (:func:`shard_bounds`)."""
        return shard_bounds(n, self.rank, self.world)

    def all_gather(self, obj: Any) -> list:
        """Every rank's ``obj`` (picklable), in rank order."""
        import torch.distributed as dist

        out: list = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def agree(self, fn):
        """Every rank's ``fn()``, in rank order; if ``fn`` raised on any rank, every rank raises,
        with each failing rank's message (a collective: every rank calls it). A rank that raised
        alone before a collective left the others waiting in it until the process group's timeout
        (issue #40), or ending later with only "connection closed by peer": the checks that may
        fail on one rank (the trainer's memory check, a batch its model cannot read) run here,
        before the first collective of a training pass. The error is a ``UserError`` when every
        failing rank's was, else a ``RuntimeError``. What raises inside a pass, where FSDP's
        collectives have begun, cannot meet the others here: they end when the failing process
        does (gloo: "connection closed by peer"; the command line exits at once, torchrun then
        stops the other ranks), as a gloo collective cannot be released from another process
        that stays alive."""
        try:
            mine = (True, fn())
        except Exception as e:  # every rank must reach the all-gather below
            err = e
            mine = (
                False,
                (isinstance(e, UserError), str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {e}"),
            )
        else:
            err = None
        parts = self.all_gather(mine)
        failed = [(r, v) for r, (ok, v) in enumerate(parts) if not ok]
        if failed:
            cls = UserError if all(user for _, (user, _) in failed) else RuntimeError
            said = "; ".join(f"rank {r}: {msg}" for r, (_, msg) in failed)
            raise cls(f"stopped on all {self.world} data-parallel ranks: {said}") from err
        return [v for _, v in parts]

    # ------------------------------------------------------------ set-up (Run.__init__)
    def follow(self, cfg, log):
        """Ranks > 0: wait until rank 0 has set the run up (:meth:`lead`), then take its run name
        (a default name is chosen by rank 0) and log nothing. Rank 0: unchanged."""
        if self.main:
            return cfg, log
        import torch.distributed as dist

        name = [None]
        dist.broadcast_object_list(name, src=0)
        return cfg.model_copy(update={"run": cfg.run.model_copy(update={"name": name[0]})}), _quiet

    def lead(self, cfg, models) -> None:
        """Rank 0 releases the others (its run name), then every rank copies rank 0's parameters
        and buffers of ``models`` (None entries skipped), so all start from the same weights."""
        import torch.distributed as dist

        if self.main:
            dist.broadcast_object_list([cfg.run.name], src=0)
        with torch.no_grad():
            for m in models:
                if m is not None:
                    tensors = list(m.state_dict(keep_vars=True).values())
                    for bucket in _buckets([t.data for t in tensors]):
                        flat = torch.cat([t.reshape(-1) for t in bucket])
                        dist.broadcast(flat, src=0)
                        _unflatten(flat, bucket)

    # ------------------------------------------------------------ training (Trainer._epoch)
    def all_reduce_grads(self, params) -> None:
        """Sum every rank's gradient of ``params`` in place (missing ones count as zero; a
        parameter that no rank has a gradient for keeps ``grad = None``)."""
        import torch.distributed as dist

        has = torch.tensor([p.grad is not None for p in params], dtype=torch.int32)
        dist.all_reduce(has, op=dist.ReduceOp.MAX)
        for p, h in zip(params, has.tolist()):
            if h and p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p, h in zip(params, has.tolist()) if h]
        for bucket in _buckets(grads):
            flat = torch.cat([g.reshape(-1) for g in bucket])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            _unflatten(flat, bucket)

    def combine(self, loss_total: float, sums: dict, gap, log_w: list, has_tokens: list):
        """The step's loss, metric sums, mismatch meter and per-row ESS log-weights over every
        rank's rows: sums added in rank order (from 0.0, as one process adds micro-batches), the
        meter merged, the row lists concatenated in rank order (= the batch's row order)."""
        parts = self.all_gather((loss_total, sums, gap, [t.cpu() for t in log_w], [t.cpu() for t in has_tokens]))
        total, merged = 0.0, {}
        for loss, s, _, _, _ in parts:
            total += loss
            for k, v in s.items():
                merged[k] = merged.get(k, 0.0) + v
        dev = log_w[0].device if log_w else "cpu"
        return (
            total,
            merged,
            type(gap).merge([p[2] for p in parts]),
            [t.to(dev) for p in parts for t in p[3]],
            [t.to(dev) for p in parts for t in p[4]],
        )


def _buckets(tensors: list[torch.Tensor]):
    """Consecutive runs of ``tensors`` with one device and dtype and at most ``BUCKET`` elements
    (a single larger tensor is a bucket of its own)."""
    bucket: list[torch.Tensor] = []
    size = 0
    for t in tensors:
        if bucket and (size + t.numel() > BUCKET or (t.device, t.dtype) != (bucket[0].device, bucket[0].dtype)):
            yield bucket
            bucket, size = [], 0
        bucket.append(t)
        size += t.numel()
    if bucket:
        yield bucket


def _unflatten(flat: torch.Tensor, bucket: list[torch.Tensor]) -> None:
    off = 0
    for t in bucket:
        t.copy_(flat[off : off + t.numel()].view_as(t))
        off += t.numel()


# ---------------------------------------------------------------- generation


class DataParallelPool:
    """The local pool shared across ranks (module docstring, "Generation"). ``rollouts`` and
    ``generate`` are collectives: every rank calls them with the same plan."""

    def __init__(self, pool, dp: DataParallel, run_seed: int):
        from rollwise.distributed.local import _Seeds
        from rollwise.generate.common import StepCost

        self.pool, self.dp, self.seeds = pool, dp, _Seeds(run_seed)
        self.cost = StepCost()

    def __getattr__(self, name):  # backend, codec, sampling, ... of the local pool
        if name == "pool":
            raise AttributeError(name)
        return getattr(self.pool, name)

    def take_cost(self):
        from rollwise.generate.common import StepCost

        cost, self.cost = self.cost, StepCost()
        return cost

    def rollouts(self, plan, version: int, sampling=None, generator=None, charge: bool = True):
        from rollwise.distributed.local import run_requests, split

        sampling = sampling or self.pool.sampling
        jobs = list(zip(plan.requests, self.seeds(plan, version, generator)))
        mine = split(jobs, [req.n for req, _ in jobs], self.dp.world)[self.dp.rank]
        t0 = time.perf_counter()
        outs = run_requests(self.pool, [jobs[k] for k in mine], version, sampling, charge)
        local = self.pool.take_cost()  # this rank's charges for its share (empty for evaluation)
        wall = time.perf_counter() - t0
        per_job: list = [None] * len(jobs)
        walls = []
        for idx, rank_outs, cost, w in self.dp.all_gather((mine, outs, local, wall)):
            for k, out in zip(idx, rank_outs):
                per_job[k] = out
            walls.append(w)
            if charge:
                self.cost.add(cost, seconds=False)
        if charge:
            self.cost.generate_s += max(walls)
        return [pair for out in per_job for pair in out]

    def generate(self, plan, groups, version: int):
        from rollwise.generate.common import merge_groups

        return merge_groups(groups, self.rollouts(plan, version))
