"""The trainer's fast log-prob path (issue #13): packed rows, LM head only at completion
positions, chunked; it must equal the plain full-logits forward in values and gradients."""

import pytest
import torch

from rollwise.collate import collate
from rollwise.trainer.tiny import build_tiny
from rollwise.trainer.trainer import pack_rows, token_logprobs
from rollwise.types import Advantages, Rollout


class _Plain(torch.nn.Module):
    """The same model without get_decoder / config: token_logprobs takes its full path."""

    def __init__(self, model):
        super().__init__()
        self.inner = model

    def forward(self, **kw):
        return self.inner(**kw)


def _batch(tok, include=(True, True, True, False)):
    # prompts and completions of different lengths, so rows carry 0..7 tokens of padding
    pairs = [("12+34=", "46<"), ("1+1=", "2"), ("99+1=", "100 and"), ("5+5=", "10")]
    rows = [
        Rollout(f"p{i}", tuple(tok.encode(p)), tuple(tok.encode(c)), tuple([-1.5] * len(tok.encode(c))), "stop", 0)
        for i, (p, c) in enumerate(pairs)
    ]
    b = len(rows)
    adv = Advantages(torch.tensor([1.0, -0.5, 0.25, 2.0]), torch.tensor(include))
    return collate(rows, torch.zeros(b), torch.zeros(b, dtype=torch.long), adv, pad_id=tok.pad_token_id)


def test_pack_rows_first_fit_decreasing():
    # lengths 5, 3, 4, 2 into rows of 7: 5 -> row0 (2 left); 4 -> row1 (3 left); 3 -> row1 (0 left); 2 -> row0
    assert pack_rows([5, 3, 4, 2], 7) == [[0, 3], [2, 1]]
    assert pack_rows([7, 7], 7) == [[0], [1]]


@pytest.mark.parametrize("chunk", [3, 512])
def test_fast_path_equals_the_full_forward_in_values_and_gradients(chunk):
    model, tok = build_tiny("tiny-s", seed=2)
    model.train()
    batch = _batch(tok)
    fast_lp, fast_ent = token_logprobs(model, batch, 0.7, with_entropy=True, chunk=chunk)
    (fast_lp.sum() + 0.1 * fast_ent.sum()).backward()
    fast_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    full_lp, full_ent = token_logprobs(_Plain(model), batch, 0.7, with_entropy=True)
    (full_lp.sum() + 0.1 * full_ent.sum()).backward()
    assert torch.allclose(fast_lp, full_lp, atol=1e-5) and torch.allclose(fast_ent, full_ent, atol=1e-5)
    for g_fast, p in zip(fast_grads, model.parameters()):
        assert torch.allclose(g_fast, p.grad, atol=1e-5)
    # completion positions only: row 3 is excluded from the loss but its sampler log-probs are
    # set, so it is scored; prompt positions and padding are 0
    comp = (batch.loss_mask != 0) | (batch.old_logprobs != 0)
    assert bool((fast_lp[~comp] == 0).all()) and bool((fast_lp[comp] < 0).all())
    assert int(comp[3].sum()) == 2


def test_lm_head_sees_only_completion_positions_and_padding_is_packed_away(monkeypatch):
    import rollwise.trainer.trainer as trainer

    model, tok = build_tiny("tiny-s", seed=2)
    batch = _batch(tok)
    head_rows, dec_shapes = [], []
    fused = trainer.head_logprobs  # the LM head runs inside it (rollwise.trainer.head)
    monkeypatch.setattr(
        trainer, "head_logprobs", lambda h, *a, **k: (head_rows.append(h.shape[0]), fused(h, *a, **k))[1]
    )
    h2 = model.model.register_forward_hook(lambda m, i, o: dec_shapes.append(tuple(o.last_hidden_state.shape[:2])))
    with torch.no_grad():
        token_logprobs(model, batch, 1.0, chunk=4)
    h2.remove()
    n_comp = int(((batch.loss_mask != 0) | (batch.old_logprobs != 0)).sum())  # 3 + 1 + 7 + 2 = 13
    assert n_comp == 13 and head_rows == [4, 4, 4, 1]  # 13 positions in chunks of 4
    # lengths 9, 5, 12, 6 share one row of 32 positions instead of 4 rows of 12 (PACK_ROW_TOKENS)
    assert dec_shapes == [(1, 32)]


def test_bf16_autocast_logprobs_stay_close_and_fp32():
    model, tok = build_tiny("tiny-s", seed=2)
    batch = _batch(tok)
    with torch.no_grad():
        lp32, _ = token_logprobs(model, batch, 1.0)
        lp16, _ = token_logprobs(model, batch, 1.0, compute_dtype=torch.bfloat16)
    assert lp16.dtype == torch.float32 and next(model.parameters()).dtype == torch.float32
    assert torch.allclose(lp16, lp32, atol=0.1) and not torch.equal(lp16, lp32)  # bf16 did run


def test_activation_checkpointing_gives_the_same_update():
    from rollwise.config import load_config
    from rollwise.objectives import OBJECTIVES
    from rollwise.trainer.trainer import Trainer

    grpo = OBJECTIVES.get("grpo")
    after = []
    for ckpt in (False, True):
        model, tok = build_tiny("tiny-s", seed=2)
        cfg = load_config(overrides=["train.lr=0.01", f"train.activation_checkpointing={str(ckpt).lower()}"]).train
        tr = Trainer(model, grpo, grpo.Options(), cfg, temperature=1.0)
        assert model.is_gradient_checkpointing == ckpt
        tr.optimize(_batch(tok))
        after.append([p.detach().clone() for p in model.parameters()])
    moved = [not torch.equal(a, b) for a, b in zip(after[0], build_tiny("tiny-s", seed=2)[0].parameters())]
    assert any(moved)  # the step did change the weights
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*after))


def test_rows_holding_one_sequence_each_run_plain_causal_and_match_the_full_forward():
    # two rows of lengths 9 and 12: one shared row of 21 positions saves too little of the 24 padded
    # ones (21 > PACK_MAX_ROW_FRACTION x 24) for CPU: no position ids go to the decoder (plain causal
    # attention, no packed-sequence mask), and the values are unchanged
    model, tok = build_tiny("tiny-s", seed=2)
    batch = _batch(tok).rows(slice(0, 3, 2))  # rows 0 and 2: lengths 9 and 12
    seen = []
    hook = model.model.register_forward_pre_hook(lambda m, a, kw: seen.append(kw.get("position_ids")), with_kwargs=True)
    with torch.no_grad():
        fast, _ = token_logprobs(model, batch, 1.0)
    hook.remove()
    assert seen == [None]
    with torch.no_grad():
        full, _ = token_logprobs(_Plain(model), batch, 1.0)
    assert torch.allclose(fast, full, atol=1e-5)
    hook = model.model.register_forward_pre_hook(lambda m, a, kw: seen.append(kw.get("position_ids")), with_kwargs=True)
    with torch.no_grad():  # the packed batch of the other tests (all four share a row) does pass them
        token_logprobs(model, _batch(tok), 1.0)
    hook.remove()
    assert seen[1] is not None and seen[1].shape == (1, 32)


def test_packing_that_saves_too_few_rows_is_skipped():
    # 8 rows: six of length 12 and two of length 5 -> one packed row of 82 positions against 96
    # padded ones (0.854 > PACK_MAX_ROW_FRACTION 0.85): on CPU not worth the packed mask, so 8 plain rows
    from rollwise.trainer.trainer import PACK_MAX_ROW_FRACTION, pack_layout

    model, tok = build_tiny("tiny-s", seed=2)
    pairs = [("12+34=", "46 and")] * 6 + [("1+1=", "2")] * 2
    rows = [
        Rollout(f"p{i}", tuple(tok.encode(p)), tuple(tok.encode(c)), tuple([-1.5] * len(tok.encode(c))), "stop", 0)
        for i, (p, c) in enumerate(pairs)
    ]
    lengths = [len(r.prompt_ids) + len(r.completion_ids) for r in rows]
    layout, fill = pack_layout(lengths, max(lengths), "on", torch.device("cpu"))
    assert len(layout) == 1 and fill == 82 and 82 > PACK_MAX_ROW_FRACTION * 96
    adv = Advantages(torch.ones(8), torch.ones(8, dtype=torch.bool))
    batch = collate(rows, torch.zeros(8), torch.zeros(8, dtype=torch.long), adv, pad_id=tok.pad_token_id)
    seen = []
    hook = model.model.register_forward_pre_hook(
        lambda m, a, kw: seen.append((kw["input_ids"].shape[0], kw.get("position_ids"))), with_kwargs=True
    )
    with torch.no_grad():
        fast, _ = token_logprobs(model, batch, 1.0)
    hook.remove()
    assert seen[0][0] == 8 and seen[0][1] is None
    with torch.no_grad():
        assert torch.allclose(fast, token_logprobs(_Plain(model), batch, 1.0)[0], atol=1e-5)
