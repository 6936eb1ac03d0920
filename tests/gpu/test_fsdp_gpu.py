"""GPU check of FSDP2 training (``train.fsdp``; rollwise.trainer.fsdp) on NCCL: 2 ranks, one GPU
each (the process group is ``cpu:gloo,cuda:nccl``, data_parallel.start). Skipped without CUDA or
with fewer than 2 GPUs (NCCL refuses two ranks on one device). The CPU (gloo) equivalences are in
tests/invariants/test_fsdp.py; here:

- the trainer's two FSDP steps on the fixed batch, on ``cuda:LOCAL_RANK``, equal plain data
  parallel's within ``ATOL`` (CUDA kernels may sum in other orders than the CPU's);
- a 2-step loop run with ``train.fsdp = true`` on the GPUs writes its metrics, checkpoints and
  ``final/``, with the same weights on both ranks.
"""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "invariants"))  # the CPU tests' helpers (spawned ranks too)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    pytest.mark.skipif(
        torch.cuda.is_available() and torch.cuda.device_count() < 2,
        reason="FSDP on NCCL needs 2 GPUs (one per rank); this machine has 1",
    ),
]

ATOL = 1e-5  # fp32 weights after two AdamW steps of lr 1e-3 (CUDA reductions in other orders)


def _rank(rank, out_dir, run_dir):
    import os

    from test_data_parallel import _fixed_batch, _overrides
    from test_fsdp import _trainer, _whole

    from conftest import as_sets
    from rollwise.config import load_config
    from rollwise.distributed import data_parallel
    from rollwise.loop import train

    os.environ["LOCAL_WORLD_SIZE"] = "2"
    cfg = load_config(overrides=as_sets(_overrides(run_dir, "fsdp", **{"train.fsdp": True, "model.device": "cuda"})))
    dp = data_parallel.start(cfg)  # NCCL for CUDA tensors, cuda:LOCAL_RANK set
    out = {}
    for fsdp in (False, True):
        model, batch = _fixed_batch()
        trainer = _trainer(model.cuda(), dp, 3, fsdp)
        out[fsdp] = []
        for _ in range(2):
            trainer.optimize(batch)
            out[fsdp].append({k: v.cpu() for k, v in _whole(trainer).items()})
    torch.save(out, f"{out_dir}/rank{rank}.pt")
    train(cfg, log=lambda *a: None)


def test_fsdp_on_two_gpus_with_nccl(tmp_path):
    from test_data_parallel import _spawn, _weights

    _spawn(_rank, str(tmp_path), tmp_path / "runs", timeout=600)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for rank in ranks:
        for plain, sharded in zip(rank[False], rank[True], strict=True):
            assert max(float((plain[k] - sharded[k]).abs().max()) for k in plain) <= ATOL
    run = tmp_path / "runs" / "fsdp"
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
    assert any((run / "final").glob("*.safetensors"))
    w = _weights(run, 2)
    assert all(torch.isfinite(v).all() for v in w.values())
