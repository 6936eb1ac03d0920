"""The static path's generation copy (``rollwise.backends.generation_copy``): current after every
optimizer step, refreshed in place, LoRA merged, and made only where the static path decodes."""

import copy

import pytest
import torch

from rollwise.backends.generation_copy import GenerationCopy
from rollwise.backends.hf import HFBackend
from rollwise.distributed.weights import policy_weights
from rollwise.trainer.tiny import build_tiny
from rollwise.types import Sampling

GREEDY_ONE = Sampling(0.0, 1.0, 1)


def _tiny(seed=1):
    model, tok = build_tiny("tiny-s", seed=seed)
    return model, tok.pad_token_id, [1] + tok.encode("12+34=")


def _linears(module):
    return [m for m in module.modules() if isinstance(m, torch.nn.Linear)]


def test_the_copy_is_current_after_an_optimizer_step_and_refreshed_in_place():
    """bf16 compute on a CPU (the dtype a GPU decodes in): AdamW steps (the trainer's optimizer) on the
    linears move the greedy first token of a prompt to another id; the static path then samples that id, as the
    eager path on the fp32 master does, from the same copy whose tensors kept their storage (what a
    CUDA graph reads) and now hold the master's weights cast to bf16, bit for bit."""
    model, pad, prompt = _tiny()
    fast = HFBackend(model, [pad], pad, compute_dtype=torch.bfloat16, sampler="static")
    eager = HFBackend(model, [pad], pad, compute_dtype=torch.bfloat16, sampler="eager")
    before = fast.generate([prompt], GREEDY_ONE)[0].token_ids[0]
    gen = fast._static.gen
    storage = [t.data_ptr() for _, t in gen.own]
    assert gen.own and {t.dtype for _, t in gen.own} == {torch.bfloat16}

    target = next(i for i in range(3, model.config.vocab_size) if i not in (before, pad))
    # the decoder's linears only (the LM head is tied to the embedding, which the copy shares): weights
    # the copy holds itself, so that a stale copy would still sample ``before``
    tied = model.get_input_embeddings().weight
    opt = torch.optim.AdamW([p for m in _linears(model) for p in m.parameters() if p is not tied], lr=0.02)
    ids = torch.tensor([prompt])
    for _ in range(50):
        logp = model(input_ids=ids).logits[0, -1].float().log_softmax(-1)
        if logp[target] > torch.cat([logp[:target], logp[target + 1 :]]).max() + 1.0:
            break
        opt.zero_grad()
        (-logp[target]).backward()
        opt.step()
    assert eager.generate([prompt], GREEDY_ONE)[0].token_ids[0] == target != before  # the step moved the argmax

    assert fast.generate([prompt], GREEDY_ONE)[0].token_ids[0] == target
    assert fast._static.gen is gen and [t.data_ptr() for _, t in gen.own] == storage  # in place
    master = policy_weights(model)
    assert all(torch.equal(t, master[name].to(torch.bfloat16)) for name, t in gen.own)


def test_the_copy_copies_once_per_change_of_the_weights():
    """``refresh`` copies when a master parameter changed in place since the last copy, not otherwise."""
    model, _, _ = _tiny()
    gen = GenerationCopy(model, torch.bfloat16)
    assert not gen.stale() and gen.refresh() is False
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)
    assert gen.stale() and gen.refresh() is True and gen.refresh() is False
    assert torch.equal(gen.module.lm_head.weight, model.lm_head.weight.to(torch.bfloat16))


@pytest.fixture
def lora_model():
    from rollwise.trainer.hf_models import apply_lora

    model, _, prompt = _tiny(seed=2)
    model = apply_lora(model, r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"]).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:  # off zero, so that the adapters count
                p.normal_(0, 0.2, generator=torch.Generator().manual_seed(len(n)))
    return model, torch.tensor([prompt, prompt[::-1]])


def test_lora_merged_into_the_copy_equals_the_adapted_forward(lora_model):
    """The copy holds plain linears with ``W + B A * alpha / r`` (no adapter layers left): its forward
    is the peft model's within fp32 rounding, before and after the adapters take an optimizer step,
    and only the adapted weights are tensors of its own."""
    model, ids = lora_model
    gen = GenerationCopy(model)
    assert not any("lora" in n for n, _ in gen.module.named_modules())
    layers = model.config.num_hidden_layers
    assert sorted(n for n, _ in gen.own) == sorted(
        f"model.layers.{i}.self_attn.{p}.weight" for i in range(layers) for p in ("q_proj", "v_proj")
    )
    for step in range(2):
        with torch.no_grad():
            adapted, merged = model(input_ids=ids).logits, gen.module(input_ids=ids).logits
        assert (adapted - merged).abs().max() < 1e-5
        if step == 0:
            with torch.no_grad(), model.disable_adapter():
                assert (adapted - model(input_ids=ids).logits).abs().max() > 1e-2  # the adapters count
            opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.05)
            model(input_ids=ids).logits.float().pow(2).mean().backward()
            opt.step()
            assert gen.refresh() is True


def test_the_copy_holds_only_what_it_casts_or_merges(lora_model):
    """Memory: under fp32 without LoRA the copy shares every tensor with the master; under bf16 it
    holds its linears (LM head included, untied from the fp32 embedding) and nothing else; with LoRA
    under fp32 only the adapted weights."""
    model, pad, prompt = _tiny()
    same = GenerationCopy(model)
    assert same.own == [] and same.own_bytes() == 0
    assert {p.data_ptr() for p in same.module.parameters()} == {p.data_ptr() for p in model.parameters()}

    half = GenerationCopy(model, torch.bfloat16)
    cast = _linears(half.module)
    assert half.own_bytes() == sum(2 * sum(t.numel() for t in m.parameters()) for m in cast)
    assert half.module.model.embed_tokens.weight is model.model.embed_tokens.weight  # shared, fp32
    assert half.module.lm_head.weight.dtype == torch.bfloat16 and model.lm_head.weight.dtype == torch.float32
    norms = [p for n, p in half.module.named_parameters() if "norm" in n]
    assert norms and all(p.dtype == torch.float32 for p in norms)

    peft_model, _ = lora_model
    merged = GenerationCopy(peft_model)
    adapted = [m.base_layer for m in peft_model.modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer")]
    assert merged.own_bytes() == sum(4 * m.weight.numel() for m in adapted)


def test_the_copy_is_made_only_where_the_static_path_decodes():
    """An eager sampler makes none; a static one at its first decode; the asynchronous generator's
    shallow copy of the backend (distributed/async_pool.py) makes its own, from its own model, and the
    run's backend, which then never decodes, makes none."""
    model, pad, prompt = _tiny()
    eager = HFBackend(model, [pad], pad, compute_dtype=torch.bfloat16, sampler="eager")
    eager.generate([prompt], GREEDY_ONE)
    assert eager._static is None
    fast = HFBackend(model, [pad], pad, compute_dtype=torch.bfloat16, sampler="static")
    assert fast._static.gen is None
    local = copy.copy(fast)
    local.model = copy.deepcopy(model)
    local.generate([prompt], GREEDY_ONE)
    assert fast._static.gen is None and local._static.gen.master is local.model


def test_an_fp8_sampler_keeps_its_quantised_linears_in_the_copy():
    """``model.rollout_precision = "fp8"``: the sampler's module quantises its master weights itself
    (hardware/fp8.py); its generation copy shares them and computes what that module computes."""
    from rollwise.hardware import fp8

    model, _, prompt = _tiny()
    sampler = fp8.sampler_copy(model, block=16)
    gen = GenerationCopy(sampler, torch.bfloat16)
    ids = torch.tensor([prompt])
    with torch.no_grad():
        quantised, copied, plain = (m(input_ids=ids).logits for m in (sampler, gen.module, model))
    assert gen.own == [] and torch.equal(copied, quantised) and not torch.equal(copied, plain)


def test_a_new_copy_when_the_compute_dtype_or_a_master_parameter_is_replaced():
    """The copy follows its master: another compute dtype, or a parameter object replaced (not
    written in place), makes the decoder build a new copy rather than decode on the old one."""
    model, pad, prompt = _tiny()
    fast = HFBackend(model, [pad], pad, sampler="static")
    fast.generate([prompt], GREEDY_ONE)
    first = fast._static.gen
    assert first.own == []  # fp32: all shared
    fast.compute_dtype = torch.bfloat16
    fast.generate([prompt], GREEDY_ONE)
    second = fast._static.gen
    assert second is not first and second.own and second.dtype == torch.bfloat16
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach() * 2)
    fast.generate([prompt], GREEDY_ONE)
    third = fast._static.gen
    assert third is not second
    assert torch.equal(third.module.lm_head.weight, model.lm_head.weight.to(torch.bfloat16))
