"""``train.packing`` (issue #42 item 4): a micro-batch's rows packed into fewer decoder rows, each
sequence with its own position ids, must train exactly as the padded rows do (loss and gradients),
on the tiny model and on a random-weight model of SmolLM2-135M's shape (grouped-query attention);
the chunked LM head must give the unchunked values; ``"on"`` is refused where it cannot apply."""

import json

import pytest
import torch

from conftest import smollm2_shaped_config
from rollwise.collate import collate
from rollwise.config import load_config
from rollwise.objectives import OBJECTIVES
from rollwise.registry import UserError
from rollwise.trainer.tiny import build_tiny
from rollwise.trainer.trainer import Trainer, pack_layout, token_logprobs
from rollwise.types import Advantages, Rollout

# (prompt, completion) lengths: totals 20, 9, 11, 7, 16, 5, padded to 6 rows of 20, packed into
# one row of 68 (PACK_ROW_TOKENS = 256)
LENGTHS = [(8, 12), (4, 5), (6, 5), (3, 4), (7, 9), (3, 2)]
# totals 180, 110, 70, 130 in rows of 256: 180 + 70 | 130 + 110, two rows of 250 (the second
# with a 10-position tail)
LONG = [(100, 80), (50, 60), (30, 40), (60, 70)]


def _smollm2_shaped(seed: int = 0):
    """SmolLM2-135M's shape (hidden 576, 9 heads over 3 KV heads, MLP 1536, its 49,152-word tied
    vocabulary), two decoder layers, random weights."""
    from transformers import LlamaForCausalLM

    cfg = smollm2_shaped_config(max_position_embeddings=2048, rope_theta=10000.0)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LlamaForCausalLM(cfg)


def _model(kind: str):
    if kind == "tiny":
        model, tok = build_tiny("tiny-s", seed=2)
        return model, len(tok), tok.pad_token_id
    return _smollm2_shaped(), 49152, 0


def _batch(vocab: int, pad_id: int, lengths=LENGTHS, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i, (p, c) in enumerate(lengths):
        ids = torch.randint(4, vocab, (p + c,), generator=g).tolist()
        lp = (-0.5 - torch.rand(c, generator=g)).tolist()
        rows.append(Rollout(f"p{i}", tuple(ids[:p]), tuple(ids[p:]), tuple(lp), "stop", 0))
    b = len(rows)
    adv = Advantages(torch.tensor([1.0, -0.5, 0.25, -1.0, 2.0, 0.5])[:b], torch.ones(b, dtype=torch.bool))
    return collate(rows, torch.zeros(b), torch.arange(b) // 2, adv, pad_id=pad_id)


def _accumulate(model, batch, packing: str):
    """Loss and gradients of one GRPO accumulation under ``train.packing = packing``, and the
    (rows, width) of every input the decoder saw."""
    grpo = OBJECTIVES.get("grpo")
    cfg = load_config(overrides=[f"train.packing={packing}", "train.micro_batch=64"]).train
    trainer = Trainer(model, grpo, grpo.Options(), cfg, temperature=0.8)
    seen = []
    hook = model.get_decoder().register_forward_pre_hook(
        lambda m, a, kw: seen.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    try:
        model.zero_grad(set_to_none=True)
        acc = trainer.accumulate(batch)
    finally:
        hook.remove()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return acc.loss, grads, seen


@pytest.mark.parametrize(
    "kind, lengths, padded, packed",
    [
        ("tiny", LENGTHS, (6, 20), (1, 68)),
        ("tiny", LONG, (4, 180), (2, 250)),
        ("smollm2_shaped", LENGTHS, (6, 20), (1, 68)),
    ],
)
def test_packed_training_equals_padded_training_in_loss_and_gradients(kind, lengths, padded, packed):
    model, vocab, pad = _model(kind)
    batch = _batch(vocab, pad, lengths)
    loss_off, grads_off, seen_off = _accumulate(model, batch, "off")
    loss_on, grads_on, seen_on = _accumulate(model, batch, "on")
    assert seen_off == [padded] and seen_on == [packed]  # the decoder's input: padded rows, then packed ones
    assert loss_off != 0.0
    assert loss_on == pytest.approx(loss_off, rel=1e-5, abs=1e-7)
    assert grads_on.keys() == grads_off.keys() and len(grads_on) == len(list(model.parameters()))
    scale = max(float(g.abs().max()) for g in grads_off.values())
    assert scale > 0
    for name, g in grads_off.items():
        assert torch.allclose(grads_on[name], g, rtol=1e-4, atol=1e-6 * scale), name


def test_chunked_logprobs_equal_unchunked_on_a_smollm2_shaped_model():
    # grouped-query attention, a 49k vocabulary: LM head in chunks of 5 completion positions
    # (37 of them here) against one chunk, and against the plain full-logits forward
    model = _smollm2_shaped()
    batch = _batch(49152, 0)
    out = {}
    for chunk in (5, 10**6):
        model.zero_grad(set_to_none=True)
        lp, ent = token_logprobs(model, batch, 0.8, with_entropy=True, chunk=chunk, packing="on")
        (lp.sum() + 0.1 * ent.sum()).backward()
        out[chunk] = lp.detach(), ent.detach(), [p.grad.clone() for p in model.parameters()]
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long()).logits[:, :-1]
        logp = torch.log_softmax(logits.float() / 0.8, -1)
        full = logp.gather(2, batch.input_ids[:, 1:, None])[..., 0]
    comp = ((batch.loss_mask != 0) | (batch.old_logprobs != 0))[:, 1:]
    (lp5, ent5, g5), (lp1, ent1, g1) = out[5], out[10**6]
    assert int(comp.sum()) == 37
    assert torch.allclose(lp5, lp1, atol=1e-6) and torch.allclose(ent5, ent1, atol=1e-5)
    assert torch.allclose(lp5[:, 1:][comp], full[comp], atol=1e-5)
    assert bool((lp5[:, 1:][~comp] == 0).all())
    for a, b in zip(g5, g1):  # sums over 5-position chunks in another order: rounding only
        assert float(b.abs().max()) > 0 and torch.allclose(a, b, rtol=1e-4, atol=1e-5 * float(b.abs().max()))


def test_pack_layout_follows_the_setting_and_the_device():
    # six sequences of 12 tokens and two of 6: one packed row of 84 positions against 8 padded rows
    # of 12 (84 / 96 = 0.875, above PACK_MAX_ROW_FRACTION 0.85), so "auto" packs on CUDA only
    lengths, packed = [12] * 6 + [6, 6], ([list(range(8))], 84)
    alone = ([[i] for i in range(8)], 12)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert pack_layout(lengths, 12, "on", cpu) == packed
    assert pack_layout(lengths, 12, "auto", cuda) == packed
    assert pack_layout(lengths, 12, "auto", cpu) == alone
    assert pack_layout(lengths, 12, "off", cuda) == alone
    # saving enough: four of 6 tokens, one row of 24 against 48 padded positions, packed on CPU too
    assert pack_layout([6, 6, 6, 6], 12, "auto", cpu) == ([[0, 1, 2, 3]], 24)
    # rows of 256 tokens, first-fit decreasing: 200 | 150 + 100 | 60 (56 left beside the 200);
    # the rows' width is the fullest one's, 250
    assert pack_layout([200, 100, 60, 150], 200, "on", cpu) == ([[0], [3, 1], [2]], 250)


def test_packing_is_a_documented_setting_that_names_its_choices():
    assert load_config().train.packing == "auto"
    with pytest.raises(Exception, match="packing") as info:
        load_config(overrides=["train.packing=always"])
    assert "'on'" in str(info.value) and "'off'" in str(info.value)


def test_packing_on_is_refused_at_load_for_a_model_whose_config_caps_its_logits(tmp_path):
    # a Gemma-2-style config: its logits are tanh-capped after the LM head
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"], "final_logit_softcapping": 30.0})
    )
    assert load_config(overrides=[f"model.name={tmp_path}", "train.packing=auto"]).train.packing == "auto"
    with pytest.raises(UserError, match=r"train\.packing = 'on'.*final_logit_softcapping"):
        load_config(overrides=[f"model.name={tmp_path}", "train.packing=on"])


def test_packing_on_is_refused_by_the_trainer_for_a_model_it_cannot_pack():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    gemma = Gemma2ForCausalLM(
        Gemma2Config(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
        )
    )
    assert gemma.config.final_logit_softcapping  # Gemma 2 caps its logits: the full path
    grpo = OBJECTIVES.get("grpo")
    on = load_config(overrides=["train.packing=on"]).train
    with pytest.raises(UserError, match=r"train\.packing = 'on'.*final_logit_softcapping"):
        Trainer(gemma, grpo, grpo.Options(), on, temperature=1.0)
    Trainer(gemma, grpo, grpo.Options(), load_config().train, temperature=1.0)  # "auto": the full path
