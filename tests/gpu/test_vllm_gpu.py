"""vLLM path on a GPU (skipped without CUDA or without vllm): greedy vLLM == greedy hf on
SmolLM2's weights, a weight push changes the next generation, and a 2-step training run with
model.backend = "vllm" logs weight sync and mismatch metrics. On a GPU install the vllm wheel built
for torch 2.13 (README, "Scale out"), not the CPU extra."""

import importlib.util
import json

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed"),
]


def test_vllm_greedy_equals_hf_and_follows_pushed_weights_on_gpu():
    from rollwise.backends.hf import HFBackend
    from rollwise.backends.vllm import VLLMBackend
    from rollwise.config import ModelConfig
    from rollwise.distributed.weights import policy_weights
    from rollwise.tokens import Codec
    from rollwise.trainer.hf_models import load_pretrained
    from rollwise.types import Prompt, Sampling

    model, tok = load_pretrained("smollm2-135m")
    model = model.cuda()
    codec = Codec(tok, use_chat=True)
    seqs = [
        list(codec.encode_prompt(Prompt(str(i), "t", q, None, ({"role": "user", "content": q},))))
        for i, q in enumerate(("What is 17+25?", "Name a colour."))
    ]
    smp = Sampling(0.0, 1.0, 16)
    eng = VLLMBackend.from_policy(model, codec.eos_ids, ModelConfig(name="smollm2-135m", compute_dtype="float32"))
    eng.load_weights(0, policy_weights(model))
    got = [c.token_ids for c in eng.generate(seqs, smp)]
    want = [
        c.token_ids
        for c in HFBackend(model, codec.eos_ids, codec.pad_id, compute_dtype=torch.float32).generate(seqs, smp)
    ]
    assert got == want
    with torch.no_grad():  # push weights whose greedy answer is different: scale the final norm down
        w = {k: (v * 0.0 if k == "model.norm.weight" else v) for k, v in policy_weights(model).items()}
    eng.load_weights(1, w)
    assert [c.token_ids for c in eng.generate(seqs, smp)] != got
    eng.close()


def test_vllm_training_steps_on_gpu(tmp_path):
    from rollwise.config import load_config
    from rollwise.loop import train

    cfg = load_config(
        "configs/smollm2_vllm.toml",
        [
            f"run.dir={tmp_path}",
            "run.progress=false",
            "train.steps=2",
            "eval.n_prompts=4",
            "eval.every=0",
            "eval.at_start=false",
        ],
    )
    res = train(cfg, log=lambda *a: None)
    lines = [json.loads(x) for x in (res.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all(x["time/weight_sync_s"] > 0 and "mismatch/abs_mean" in x for x in lines)
    assert all(x["train/tis_weight"] > 0 for x in lines)  # TIS against vLLM's log-probs is on by default
