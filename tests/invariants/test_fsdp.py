"""Invariant: FSDP2 training (``train.fsdp``; rollwise.trainer.fsdp) on 2 processes (gloo, CPU)
takes the optimizer steps of plain data parallel (rollwise.distributed.data_parallel), while each
rank holds half of the trained weights and of the AdamW moments.

The ranks are started as in tests/invariants/test_data_parallel.py (whose helpers this reuses):
torchrun's environment, ``torch.multiprocessing`` spawn, one torch thread each, started once
(``fsdp_dir``) for every case here.

- On the fixed 6-row batch of the data-parallel test (the tiny Llama, grpo, ESS scaling on, AdamW),
  two steps with FSDP equal two steps of plain data parallel within ``ATOL`` (weights) and 1e-5
  (metrics). FSDP sums the gradients in a reduce-scatter per backward and reads the clipping norm
  from the shards, so float rounding may differ; measured: identical here (0.0).
- Uneven shards: 5 rows with ``train.micro_batch = 2`` (rank 0: 1 pass, rank 1: 2) and 1 row
  (rank 0: no rows) need zero-weight padding passes on rank 0; the steps (plain SGD of lr 1, so
  the weight change is the gradient) still equal plain data parallel within ``ATOL``.
- Sharded state: each rank's trained parameters and each AdamW moment hold about half of the
  model's elements (within one row of the largest sharded tensor); the whole copy holds all.
- Trainer resume: the optimizer state gathered after step 1 (``Trainer.state_dict``, full tensors,
  the format of one process), loaded into a fresh trainer before it is sharded (as a resumed run
  does), gives step 2 exactly as the uninterrupted trainer.
- A real loop run with FSDP on 2 ranks, interrupted after step 1 and resumed, equals the
  uninterrupted one-process run with per-request seeds (which plain data parallel equals exactly,
  test_data_parallel.py): the same ``metrics.jsonl`` and ``eval.jsonl`` within 1e-5 (times aside),
  weights of the checkpoints of steps 1 and 2 within ``ATOL``.
"""

import dataclasses
import json

import pytest
import torch
from test_data_parallel import _dp, _fixed_batch, _lines, _overrides, _spawn, _train_cfg, _weights

from conftest import as_sets

ATOL = 1e-6  # fp32 weights; FSDP's other summation order only. Measured: 0.0 (even shards, AdamW), 1.1e-8 (uneven
# shards, SGD of lr 1: steps of 0.057), 7.5e-9 (the loop's weights after step 2); metrics within 2.5e-7 absolute


def _batch(rows):
    """The first ``rows`` rows of the fixed batch, with their own global counts."""
    model, b = _fixed_batch()
    if rows < b.size:
        b = dataclasses.replace(
            b.rows(slice(0, rows)),
            num_loss_tokens=int(b.loss_mask[:rows].sum()),
            num_sequences=rows,
            num_rows=rows,
        )
    return model, b


def _trainer(model, dp, micro_batch, fsdp):
    from rollwise.objectives import grpo
    from rollwise.trainer.trainer import Trainer

    cfg = _train_cfg(lr=1e-3, micro_batch=micro_batch, ess_lr_scaling={"enabled": True})
    trainer = Trainer(model, grpo.loss, grpo.Options(), cfg, 1.0, data_parallel=dp)
    if fsdp:
        trainer.shard()
    return trainer


def _whole(trainer):
    return {k: v.detach().clone() for k, v in trainer.scoring_model.state_dict().items()}


def _steps(dp, micro_batch, rows=6, fsdp=True, sgd=False):
    """Whole weights and metrics after each of two optimizer steps; with ``sgd`` plain SGD of lr 1,
    so the weight change is the gradient (AdamW's first step, about ``lr * sign(g)``, turns rounding
    in near-zero gradient entries into changes of up to ``lr``: test_data_parallel.py does the same)."""
    model, batch = _batch(rows)
    trainer = _trainer(model, dp, micro_batch, fsdp)
    if sgd:
        trainer.optimizer = torch.optim.SGD([p for p in trainer.model.parameters() if p.requires_grad], lr=1.0)
        trainer.scheduler = torch.optim.lr_scheduler.LambdaLR(trainer.optimizer, lambda s: 1.0)
    out = []
    for _ in range(2):
        m = trainer.optimize(batch)
        out.append((_whole(trainer), m))
    return out


def _sharding(dp):
    """Elements of the trained parameters and AdamW moments on this rank, and in the whole model."""
    from rollwise.trainer.fsdp import local_numel

    model, batch = _batch(6)
    trainer = _trainer(model, dp, 3, fsdp=True)
    trainer.optimize(batch)
    moments = [s["exp_avg"] for s in trainer.optimizer.state.values()]
    largest_row = max(p.shape[1:].numel() if p.dim() else 1 for p in trainer.full_model.parameters())
    return {
        "params": local_numel(trainer.model.parameters()),
        "moments": local_numel(moments),
        "whole": sum(p.numel() for p in trainer.full_model.parameters()),
        "largest_row": largest_row,
        "dtensors": all(type(p).__name__ == "DTensor" for p in trainer.model.parameters()),
    }


def _resumed(dp):
    """Step 1 on one trainer; its gathered optimizer state and whole weights into a fresh trainer
    (loaded before sharding, as ``Run`` resumes), then step 2: the whole weights after step 2."""
    model, batch = _batch(6)
    first = _trainer(model, dp, 3, fsdp=True)
    first.optimize(batch)
    state, weights = first.state_dict(), _whole(first)
    model2, _ = _batch(6)
    model2.load_state_dict(weights)
    second = _trainer(model2, dp, 3, fsdp=False)
    second.load_state_dict(state)
    second.shard()
    second.optimize(batch)
    return _whole(second), state


def _rank(rank, out_dir, run_dir):
    dp = _dp()
    torch.save(
        {
            "dp": _steps(dp, 3, fsdp=False),
            "fsdp": _steps(dp, 3),
            "dp_uneven": _steps(dp, 2, rows=5, fsdp=False, sgd=True),
            "fsdp_uneven": _steps(dp, 2, rows=5, sgd=True),
            "dp_one_row": _steps(dp, 2, rows=1, fsdp=False, sgd=True),
            "fsdp_one_row": _steps(dp, 2, rows=1, sgd=True),
            "sharding": _sharding(dp),
            "resumed": _resumed(dp),
        },
        f"{out_dir}/rank{rank}.pt",
    )
    _loop_rank(run_dir)


def _loop_rank(run_dir):
    """A 2-step FSDP run interrupted after step 1 (an evaluation and a checkpoint), then resumed."""
    from rollwise.config import load_config
    from rollwise.loop import train

    fsdp = {"train.fsdp": True}
    train(load_config(overrides=as_sets(_overrides(run_dir, "fsdp", **fsdp, **{"train.steps": 1}))), log=lambda *a: 0)
    train(load_config(overrides=as_sets(_overrides(run_dir, "fsdp", **fsdp))), resume=True, log=lambda *a: 0)


@pytest.fixture(scope="module")
def fsdp_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("fsdp")
    _spawn(_rank, str(d), d / "runs")
    return d


@pytest.fixture(scope="module")
def ranks(fsdp_dir):
    return [torch.load(fsdp_dir / f"rank{r}.pt", weights_only=False) for r in range(2)]


def _worst(a, b):
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.mark.parametrize("case", ["", "_uneven", "_one_row"])
def test_fsdp_steps_equal_data_parallel_steps(ranks, case):
    for rank in ranks:
        for step in range(2):
            (w_dp, m_dp), (w, m) = rank["dp" + case][step], rank["fsdp" + case][step]
            assert _worst(w_dp, w) <= ATOL, f"step {step + 1}"
            assert m.keys() == m_dp.keys()
            for k in m_dp:
                assert m[k] == pytest.approx(m_dp[k], rel=1e-5, abs=1e-7), k
    for step in range(2):  # every rank's whole copy holds the very same weights
        assert _worst(ranks[0]["fsdp" + case][step][0], ranks[1]["fsdp" + case][step][0]) == 0.0
    assert all(r["dp" + case][0][1]["train/grad_norm"] > 0 for r in ranks)  # a real first step
    moved = _worst(ranks[0]["fsdp" + case][0][0], _batch(1)[0].state_dict())
    assert moved > 1e2 * ATOL  # the step is far larger than the tolerance


def test_each_rank_holds_half_of_the_trained_state(ranks):
    s0, s1 = ranks[0]["sharding"], ranks[1]["sharding"]
    assert s0["dtensors"] and s1["dtensors"]
    assert s0["params"] + s1["params"] == s0["whole"] and s0["moments"] + s1["moments"] == s0["whole"]
    for s in (s0, s1):  # torch.chunk rows per tensor: at most one row per tensor off the half
        assert abs(s["params"] - s["whole"] / 2) <= 20 * s["largest_row"]
        assert s["params"] < 0.51 * s["whole"]


def test_gathered_optimizer_state_resumes_the_sharded_trainer_exactly(ranks):
    for rank in ranks:
        resumed, state = rank["resumed"]
        assert _worst(resumed, rank["fsdp"][1][0]) == 0.0
        # the one-process format: integer keys, full-size moments as plain tensors
        p0 = state["optimizer"]["state"][0]
        assert (
            type(p0["exp_avg"]) is torch.Tensor and p0["exp_avg"].shape == _batch(1)[0].model.embed_tokens.weight.shape
        )


def test_fsdp_run_interrupted_and_resumed_equals_the_one_process_run(fsdp_dir, tmp_path):
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
    run = fsdp_dir / "runs" / "fsdp"
    expect, got = _lines(one / "metrics.jsonl"), _lines(run / "metrics.jsonl")
    assert len(expect) == 2 and all(m["train/grad_norm"] > 0 for m in expect)
    for a, b in zip(expect, got, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            numeric = isinstance(a[k], float) and not isinstance(a[k], bool)
            assert b[k] == (pytest.approx(a[k], rel=1e-5, abs=1e-7) if numeric else a[k]), k
    assert _lines(run / "eval.jsonl") == _lines(one / "eval.jsonl")
    for step in (1, 2):
        assert _worst(_weights(one, step), _weights(run, step)) <= ATOL
    assert any((run / "final").glob("*.safetensors"))  # exported as usual
    assert json.loads((run / "changes.jsonl").read_text().splitlines()[0])["changes"] == {"train.steps": [1, 2]}


def test_fsdp_is_refused_without_torchrun_and_with_lora(tmp_path, monkeypatch):
    from conftest import tiny_overrides
    from rollwise.config import load_config
    from rollwise.registry import UserError

    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(UserError, match=r"train\.fsdp = true shards .* torchrun"):
        load_config(overrides=as_sets(tiny_overrides(tmp_path, **{"train.fsdp": True})))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    with pytest.raises(UserError, match=r"train\.fsdp = true with model\.lora\.enabled = true"):
        load_config(overrides=as_sets(tiny_overrides(tmp_path, **{"train.fsdp": True, "model.lora.enabled": True})))
    load_config(overrides=as_sets(tiny_overrides(tmp_path, **{"train.fsdp": True})))  # under torchrun: accepted
