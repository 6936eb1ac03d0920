"""Invariant: data-parallel training on 2 processes (gloo, CPU) takes the optimizer steps of one
process with the same global batch (docs/architecture.md §8; rollwise.distributed.data_parallel).

The ranks are started as torchrun would start them (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``), by ``torch.multiprocessing`` with the spawn method, one torch
thread each.

- The loss normaliser is the global loss-token count of the step on every rank (a hand-worked
  case where the ranks hold 3 and 1 loss tokens), and a rank without rows adds a zero gradient.
- On a fixed batch of 6 rows, 3 rows per rank equal one process with ``micro_batch = 3`` exactly
  (AdamW weights and every metric after one and two steps: the same micro-batches, and a sum of
  two gradients does not depend on its order), and one process with ``micro_batch = 6`` within
  ``ATOL`` (SGD of lr 1, so the weight change is the gradient; the only differences are float
  summation orders: packed rows of other shapes).
- A real loop run on 2 ranks, interrupted after step 1 and resumed, equals the uninterrupted
  one-process run with per-request seeds (``distributed.request_seeds``) exactly: same
  ``metrics.jsonl`` and ``eval.jsonl`` (times aside), same weights after steps 1 and 2, one
  ``changes.jsonl`` line (rank 0 alone writes). Exact, because each rank's shard (8 rows) is
  one of the one-process run's micro-batches (``train.micro_batch = 8``).

The two ranks are started once (``dp_dir``) for all of these.
"""

import dataclasses
import datetime
import json
import math
import os
import socket
import time

import pytest
import torch

from conftest import as_sets, tiny_overrides

ATOL = 1e-6  # fp32 weights after SGD steps of lr 1 (w - g): measured 1.5e-8 after one step, 6e-8 after two; the
# steps move them by 0.05


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(fn, *args, world=2, timeout=300):
    """Run ``fn(rank, *args)`` on ``world`` ranks with torchrun's environment; fail if any fails
    (the others are then terminated) or if they are not done within ``timeout`` seconds."""
    import torch.multiprocessing as mp

    ctx = mp.start_processes(
        _rank_main, args=(world, _free_port(), fn, args), nprocs=world, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
                p.join()
            pytest.fail(f"the {world} ranks did not finish in {timeout} s (a collective waiting for a rank?)")


def _rank_main(rank, world, port, fn, args):
    import torch.distributed as dist

    from rollwise.distributed import data_parallel

    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    try:
        fn(rank, *args)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        data_parallel._ACTIVE = None


def _train_cfg(**kw):
    from rollwise.config import TrainConfig

    return TrainConfig(**kw)


def _dp():
    import torch.distributed as dist

    from rollwise.distributed.data_parallel import DataParallel

    if not dist.is_initialized():  # a collective that waits for a rank fails after 2 minutes, not 30
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    return DataParallel(dist.get_rank(), dist.get_world_size())


# ---------------------------------------------------------------- the global normaliser, by hand


class _Theta(torch.nn.Module):
    """Logits ``[theta, 0]`` at every position: token 0 has log-prob ``log sigmoid(theta)``, whose
    derivative at theta = 0 is ``1 - sigmoid(0) = 1/2``."""

    def __init__(self):
        super().__init__()
        self.theta = torch.nn.Parameter(torch.zeros(()))

    def forward(self, input_ids, attention_mask):
        b, t = input_ids.shape
        logits = torch.stack([self.theta.expand(b, t), torch.zeros(b, t)], dim=-1)
        return type("Out", (), {"logits": logits})()


def _hand_batch(rows=2):
    """Row 0: 3 loss tokens, advantage +1; row 1: 1 loss token, advantage -1 (4 in all). Every
    token is id 0; the sampler log-probs are the model's, log(1/2), so the ratio is 1. With
    ``rows = 1`` only row 0."""
    from rollwise.types import Batch

    ids = torch.zeros((2, 4), dtype=torch.long)
    ids[1, 2:] = 1  # padding
    attn = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    mask = torch.tensor([[0, 1, 1, 1], [0, 1, 0, 0]], dtype=torch.float32)
    old = mask * math.log(0.5)
    b = Batch(
        ids,
        attn,
        mask,
        old,
        torch.tensor([1.0, -1.0]),
        torch.tensor([1.0, 0.0]),
        torch.tensor([0, 0]),
        torch.zeros((2, 4), dtype=torch.long),
        num_loss_tokens=4,
        num_sequences=2,
        num_rows=2,
    )
    return b if rows == 2 else dataclasses.replace(b.rows(slice(0, 1)), num_loss_tokens=3, num_sequences=1, num_rows=1)


def _hand_step(dp, rows=2):
    """(metrics, normalisers the objective saw) of one optimizer step on ``_hand_batch(rows)``."""
    from rollwise.objectives import grpo
    from rollwise.trainer.trainer import Trainer

    seen = []

    def objective(mb, new_lp, opts, entropy=None):
        seen.append(mb.num_loss_tokens)
        return grpo.loss(mb, new_lp, opts, entropy=entropy)

    trainer = Trainer(_Theta(), objective, grpo.Options(), _train_cfg(lr=1e-3, micro_batch=2), 1.0, data_parallel=dp)
    return trainer.optimize(_hand_batch(rows)), seen


# ---------------------------------------------------------------- a fixed batch on the tiny model


def _fixed_batch():
    """6 rows of random characters (prompt 3-5 tokens, completion 2-9), log-probs of the
    initial model plus noise (ratios != 1), normal advantages; seeded, so every process builds it."""
    from rollwise.trainer.tiny import build_tiny
    from rollwise.trainer.trainer import token_logprobs
    from rollwise.types import Batch

    g = torch.Generator().manual_seed(7)
    model, tok = build_tiny("tiny-s", seed=3)
    lens = [
        (int(torch.randint(3, 6, (1,), generator=g)), int(torch.randint(2, 10, (1,), generator=g))) for _ in range(6)
    ]
    width = max(p + c for p, c in lens)
    ids = torch.full((6, width), tok.pad_token_id, dtype=torch.long)
    attn = torch.zeros((6, width), dtype=torch.bool)
    mask = torch.zeros((6, width))
    for i, (p, c) in enumerate(lens):
        ids[i, : p + c] = torch.randint(4, len(tok), (p + c,), generator=g)
        attn[i, : p + c] = True
        mask[i, p : p + c] = 1.0
    n = int(mask.sum())
    b = Batch(
        ids,
        attn,
        mask,
        torch.zeros_like(mask),
        torch.randn(6, generator=g),
        torch.zeros(6),
        torch.arange(6) // 3,
        torch.zeros((6, width), dtype=torch.long),
        num_loss_tokens=n,
        num_sequences=6,
        num_rows=6,
    )
    with torch.no_grad():
        lp, _ = token_logprobs(model, b, 1.0, where=mask)
    b = dataclasses.replace(b, old_logprobs=(lp + 0.05 * torch.randn(lp.shape, generator=g)) * mask)
    return model, b


def _fixed_steps(dp, micro_batch, sgd=False):
    """Weights and metrics after each of two optimizer steps (grpo, ESS LR scaling on), with
    AdamW, or with ``sgd`` plain SGD of lr 1 so the weight change is the gradient (AdamW's
    first step is about ``lr * sign(g)``, which turns rounding in near-zero gradient entries
    into changes of up to ``lr``; tests/invariants/test_microbatch.py does the same)."""
    from rollwise.objectives import grpo
    from rollwise.trainer.trainer import Trainer

    model, batch = _fixed_batch()
    cfg = _train_cfg(lr=1e-3, micro_batch=micro_batch, ess_lr_scaling={"enabled": True})
    trainer = Trainer(model, grpo.loss, grpo.Options(), cfg, 1.0, data_parallel=dp)
    if sgd:
        trainer.optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        trainer.scheduler = torch.optim.lr_scheduler.LambdaLR(trainer.optimizer, lambda s: 1.0)
    out = []
    for _ in range(2):
        m = trainer.optimize(batch)
        out.append(({k: v.detach().clone() for k, v in model.state_dict().items()}, m))
    return out


def _rank(rank, out_dir, run_dir):
    """One rank of the spawned pair: the trainer cases, then the loop run (``_loop_rank``)."""
    dp = _dp()
    torch.save(
        {
            "hand": _hand_step(dp),
            "hand_one_row": _hand_step(dp, rows=1),
            "adam": _fixed_steps(dp, micro_batch=6),
            "sgd": _fixed_steps(dp, micro_batch=6, sgd=True),
        },
        f"{out_dir}/rank{rank}.pt",
    )
    _loop_rank(run_dir)


@pytest.fixture(scope="module")
def dp_dir(tmp_path_factory):
    """Where the two ranks (started once for every test here) left their results and their run."""
    d = tmp_path_factory.mktemp("dp")
    _spawn(_rank, str(d), d / "runs")
    return d


@pytest.fixture(scope="module")
def trainer_ranks(dp_dir):
    return [torch.load(dp_dir / f"rank{r}.pt", weights_only=False) for r in range(2)]


def _one_process(**kw):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _fixed_steps(None, **kw)
    finally:
        torch.set_num_threads(threads)


def test_every_rank_normalises_by_the_global_loss_token_count(trainer_ranks):
    # grad = -sum_rows A n_tokens * (dlogp/dtheta = 1/2) / N = -(1*3 + (-1)*1) / 2 / 4 = -0.25;
    # loss = -sum A * ratio(1) * tokens / N = -(3 - 1) / 4 = -0.5. A per-rank normaliser (3 on
    # rank 0, 1 on rank 1) would give -(3/3 - 1/1) / 2 = 0, and no all-reduce -0.375 / +0.125.
    one, seen_one = _hand_step(None)
    assert seen_one == [4]
    assert one["train/grad_norm"] == pytest.approx(0.25, abs=1e-7)
    assert one["train/loss"] == pytest.approx(-0.5, abs=1e-7)
    for rank in trainer_ranks:
        metrics, seen = rank["hand"]
        assert seen == [4]  # each rank has one row (3 and 1 loss tokens), both divide by 4
        assert metrics["train/grad_norm"] == pytest.approx(0.25, abs=1e-7)
        assert metrics["train/loss"] == pytest.approx(-0.5, abs=1e-7)


def test_a_rank_without_rows_adds_a_zero_gradient(trainer_ranks):
    # one row (3 tokens, A = +1) on 2 ranks: rank 0 has no rows, no backward, no gradient;
    # grad = -(1 * 3) * (1/2) / 3 = -0.5, loss = -3 / 3 = -1 on both ranks, as in one process
    one, _ = _hand_step(None, rows=1)
    assert one["train/grad_norm"] == pytest.approx(0.5, abs=1e-7) and one["train/loss"] == pytest.approx(-1.0, abs=1e-7)
    (m0, seen0), (m1, seen1) = (r["hand_one_row"] for r in trainer_ranks)
    assert seen0 == [] and seen1 == [3]
    for m in (m0, m1):
        assert m["train/grad_norm"] == pytest.approx(0.5, abs=1e-7) and m["train/loss"] == pytest.approx(-1.0, abs=1e-7)


def test_two_ranks_equal_one_process_whose_micro_batches_are_the_shards(trainer_ranks):
    """3 rows per rank = one process with ``micro_batch = 3``: the same micro-batches, and a
    two-term sum does not depend on its order, so AdamW's weights and every metric agree exactly."""
    one = _one_process(micro_batch=3)
    assert one[0][1]["train/grad_norm"] > 0.1 and one[0][1]["train/lr_scale"] < 1.0  # a real step, ESS active
    for step in range(2):
        w1, m1 = one[step]
        for rank in trainer_ranks:
            w, m = rank["adam"][step]
            assert w.keys() == w1.keys() and all(torch.equal(w[k], w1[k]) for k in w1)
            assert m == m1


def test_two_ranks_equal_one_process_within_tolerance_when_the_shards_differ(trainer_ranks):
    """One micro-batch of 6 rows against 3 rows per rank (other packed shapes, other summation
    order): SGD weights (w - g) after one and two steps within ``ATOL``, metrics within 1e-5."""
    one = _one_process(micro_batch=6, sgd=True)
    for step in range(2):
        w1, m1 = one[step]
        for rank in trainer_ranks:
            w, m = rank["sgd"][step]
            worst = max(float((w[k] - w1[k]).abs().max()) for k in w1)
            assert worst <= ATOL, f"step {step + 1}: weights differ by {worst:.2e}"
            assert m.keys() == m1.keys()
            for k in m1:
                assert m[k] == pytest.approx(m1[k], rel=1e-5, abs=1e-7), k
        w0, w_1 = trainer_ranks[0]["sgd"][step][0], trainer_ranks[1]["sgd"][step][0]
        assert all(torch.equal(w0[k], w_1[k]) for k in w0)  # the ranks hold the very same weights
    moved = max(float((one[0][0][k] - _fixed_batch()[0].state_dict()[k]).abs().max()) for k in one[0][0])
    assert moved > 1e3 * ATOL  # the step is far larger than the tolerance


# ---------------------------------------------------------------- the loop


def _overrides(tmp_path, name, **extra):
    return tiny_overrides(
        tmp_path,
        name=name,
        steps=2,
        **{
            "run.threads": 1,
            "run.checkpoint_every": 1,
            "eval.every": 1,
            "train.micro_batch": 8,
            # the 20-step warm start answers almost nothing right; DAPO's length penalty over 1-5 tokens
            # gives groups of varied rewards, so both steps have a gradient
            "reward.overlong_penalty": {"enabled": True, "max_len": 5, "cache_len": 4},
            **extra,
        },
    )


def _loop_rank(run_dir):
    """A 2-step run interrupted after step 1 (its end: an evaluation and a checkpoint), then resumed."""
    from rollwise.config import load_config
    from rollwise.loop import train

    first = _overrides(run_dir, "dp", **{"train.steps": 1})
    train(load_config(overrides=as_sets(first)), log=lambda *a: None)
    train(load_config(overrides=as_sets(_overrides(run_dir, "dp"))), resume=True, log=lambda *a: None)


def _lines(path):
    return [
        {k: v for k, v in json.loads(x).items() if k != "wall_s" and not k.startswith("time/")}
        for x in path.read_text().splitlines()
    ]


def _weights(run_dir, step):
    from safetensors.torch import load_file

    return load_file(run_dir / "checkpoints" / f"step-{step}" / "model.safetensors")


def test_two_rank_run_interrupted_and_resumed_equals_the_one_process_run(dp_dir, tmp_path):
    from rollwise.config import load_config
    from rollwise.loop import train

    threads = torch.get_num_threads()
    try:
        one = train(
            load_config(overrides=as_sets(_overrides(tmp_path, "one", **{"distributed.request_seeds": True}))),
            log=lambda *a: None,
        ).run_dir
    finally:
        torch.set_num_threads(threads)
    dp = dp_dir / "runs" / "dp"
    metrics = _lines(one / "metrics.jsonl")
    assert len(metrics) == 2 and all(m["train/grad_norm"] > 0 for m in metrics)  # two real steps
    assert _lines(dp / "metrics.jsonl") == metrics  # costs summed over ranks, losses and sums gathered
    assert _lines(dp / "eval.jsonl") == _lines(one / "eval.jsonl")  # evaluations at steps 0, 1, 2
    for step in (1, 2):
        a, b = _weights(one, step), _weights(dp, step)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    changes = (dp / "changes.jsonl").read_text().splitlines()
    assert len(changes) == 1 and json.loads(changes[0])["changes"] == {"train.steps": [1, 2]}  # rank 0 alone writes
