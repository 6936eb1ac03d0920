"""Ray rollout workers that own a GPU (issue #29 item 3, ``distributed.gpus_per_worker``): Ray reserves
the GPU and a 2-step run whose one worker holds it trains to the end. Skipped without CUDA or Ray (the lent
GPU machines have no Ray; run it where both are installed)."""

import gc
import importlib.util
import json

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray not installed (rollwise[ray])"),
]


def test_a_worker_with_a_gpu_generates_on_it(tmp_path):
    import ray

    import rollwise
    from conftest import as_sets, tiny_overrides

    common = {"distributed.workers": 1, "model.device": "cuda", "model.compute_dtype": "float32", "eval.every": 2}
    o = tiny_overrides(tmp_path, name="gpu-worker", steps=2, **{**common, "distributed.gpus_per_worker": 1})
    rollwise.train(rollwise.load_config(overrides=as_sets(o)), log=lambda *a: None)
    assert ray.cluster_resources().get("GPU", 0) >= 1
    gc.collect()
    lines = [json.loads(x) for x in (tmp_path / "gpu-worker" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and lines[-1]["cost/generated_tokens"] > 0
