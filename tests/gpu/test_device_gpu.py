"""model.device on a CUDA GPU (issue #29): placement of every part, the ledger's device facts,
seeded reproducibility on one device, bf16 autocast by default, LoRA and activation checkpointing.
Skipped without a CUDA device (benchmarks/gpu_check.py runs them on a lent GPU)."""

import json

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


def _run(tmp_path, name, **extra):
    import rollwise
    from conftest import as_sets, tiny_overrides

    o = tiny_overrides(tmp_path, name=name, steps=3, **{"model.device": "cuda", "reward.kl.coef": 0.01, **extra})
    logs = []
    result = rollwise.train(rollwise.load_config(overrides=as_sets(o)), log=logs.append)
    lines = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return result, lines, logs


def test_every_part_on_the_gpu_and_in_the_ledger(tmp_path):
    import rollwise
    from conftest import as_sets, tiny_overrides
    from rollwise.session import Run

    cfg = rollwise.load_config(
        overrides=as_sets(tiny_overrides(tmp_path, name="placed", **{"model.device": "cuda", "reward.kl.coef": 0.01}))
    )
    run = Run(cfg, log=lambda m: None)
    assert next(run.model.parameters()).device.type == "cuda"
    assert next(run.trainer.ref_model.parameters()).device.type == "cuda"
    assert next(run.backend.model.parameters()).device.type == "cuda"
    assert run.compute_dtype == torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    _, lines, logs = _run(tmp_path, "ledger")
    assert lines[0]["device/type"] == "cuda" and lines[0]["device/memory_gib"] > 1
    assert lines[-1]["device/peak_memory_gib"] > 0
    assert any(m.startswith("device: cuda:0") for m in logs)


def test_a_seed_reproduces_on_one_gpu(tmp_path):
    _, a, _ = _run(tmp_path, "a")
    _, b, _ = _run(tmp_path, "b")
    keys = ("reward/mean", "cost/generated_tokens", "train/loss")
    assert [[x[k] for k in keys] for x in a] == [[x[k] for k in keys] for x in b]


def test_lora_and_activation_checkpointing_on_the_gpu(tmp_path):
    pytest.importorskip("peft")
    _, lines, _ = _run(
        tmp_path,
        "lora",
        **{"model.lora.enabled": True, "train.activation_checkpointing": True, "model.warm_start.steps": 0},
    )
    assert len(lines) == 3 and all(x["device/type"] == "cuda" for x in lines)
