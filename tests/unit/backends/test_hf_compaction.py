"""The hf sampler's speed paths (issue #13): finished rows leave the decode batch without
changing any row's tokens, only the last position reaches the LM head, inverse-CDF sampling draws
from the reported distribution, and bf16 autocast generation keeps fp32 weights. (How
model.compute_dtype = "auto" chooses: tests/unit/hardware/test_precision.py.)"""

import math

import pytest
import torch

from rollwise.backends.hf import HFBackend, sample_rows
from rollwise.trainer.tiny import build_tiny
from rollwise.types import Sampling


@pytest.fixture(scope="module")
def tiny():
    model, tok = build_tiny("tiny-s", seed=1)
    return model.eval(), tok


class _Spy(torch.nn.Module):
    """Records (batch rows, logits positions) of every forward; EOS made likely so rows end early."""

    def __init__(self, model, eos, boost):
        super().__init__()
        self.model, self.eos, self.boost, self.calls = model, eos, boost, []

    def forward(self, input_ids, **kw):
        out = self.model(input_ids=input_ids, **kw)
        self.calls.append((int(input_ids.shape[0]), int(out.logits.shape[1])))
        out.logits[..., self.eos] += self.boost
        return out


def _seqs(tok, n):
    return [[tok.bos_token_id] + tok.encode(f"{i}+{2 * i}=") for i in range(n)]


def test_finished_rows_leave_the_batch_and_no_row_changes(tiny):
    model, tok = tiny
    spy = _Spy(model, tok.eos_token_id, boost=4.0)
    seqs, smp = _seqs(tok, 12), Sampling(1.0, 1.0, 16)
    on = HFBackend(spy, [tok.eos_token_id], tok.pad_token_id, max_batch=12, seed=7)
    a = on.generate(seqs, smp)
    sizes_on = [n for n, _ in spy.calls]
    spy.calls.clear()
    off = HFBackend(spy, [tok.eos_token_id], tok.pad_token_id, max_batch=12, seed=7)
    off.compact = False
    b = off.generate(seqs, smp)
    sizes_off = [n for n, _ in spy.calls]
    lengths = sorted(len(c.token_ids) for c in a)
    assert lengths[0] < lengths[-1]  # rows did end at different steps: the test means something
    # same seed, same tokens, finish reasons and (to rounding) log-probs with and without compaction
    for x, y in zip(a, b):
        assert (x.token_ids, x.finish) == (y.token_ids, y.finish)
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)
    # without compaction every forward carries all 12 rows; with it, forward t carries exactly
    # the rows that have produced t tokens and not yet finished
    assert set(sizes_off) == {12}
    expect = [sum(1 for c in a if len(c.token_ids) > t) for t in range(len(sizes_on))]
    assert sizes_on == expect and sizes_on[-1] < 12
    assert sum(sizes_on) == sum(len(c.token_ids) for c in a)  # no forward row is wasted


def test_only_the_last_position_reaches_the_lm_head(tiny):
    model, tok = tiny
    spy = _Spy(model, tok.eos_token_id, boost=0.0)
    HFBackend(spy, [tok.eos_token_id], tok.pad_token_id, seed=0).generate(_seqs(tok, 3), Sampling(1.0, 1.0, 3))
    assert [pos for _, pos in spy.calls] == [1, 1, 1]  # the prefill too (prompts are 5-6 tokens)


def test_a_rows_tokens_do_not_depend_on_its_batch_mates(tiny):
    # row 0 reads u[0, t] whatever the batch: alone or with 4 others, the same draws
    model, tok = tiny
    seqs, smp = _seqs(tok, 5), Sampling(1.0, 1.0, 8)
    alone = HFBackend(model, [tok.eos_token_id], tok.pad_token_id, seed=3).generate(seqs[:1], smp)[0]
    batched = HFBackend(model, [tok.eos_token_id], tok.pad_token_id, seed=3).generate(seqs, smp)[0]
    assert alone.token_ids == batched.token_ids


def test_inverse_cdf_draws_the_reported_distribution():
    # probs (0.5, 0, 0.25, 0.25) -> cdf (0.5, 0.5, 0.75, 1.0): u in [0, .5) -> 0, [.5, .75) -> 2,
    # [.75, 1) -> 3; token 1 has probability 0 and is never drawn, even at u = 0.5 exactly
    logp = torch.tensor([[0.5, 0.0, 0.25, 0.25]]).log().expand(6, 4)
    u = torch.tensor([0.0, 0.49, 0.5, 0.74, 0.75, 0.999], dtype=torch.float64)
    tok, lp = sample_rows(logp, Sampling(1.0, 1.0, 1), logp, u)
    assert tok.tolist() == [0, 0, 2, 2, 3, 3]
    assert lp.tolist() == pytest.approx([math.log(0.5)] * 2 + [math.log(0.25)] * 4)
    greedy, _ = sample_rows(logp, Sampling(0.0, 1.0, 1), logp, None)
    assert greedy.tolist() == [0] * 6


def test_sample_frequencies_follow_the_probabilities():
    # 20000 draws of (0.7, 0.2, 0.1): each frequency within 4 standard errors (sd <= 0.0033)
    g = torch.Generator().manual_seed(0)
    logp = torch.tensor([[0.7, 0.2, 0.1]]).log().expand(20000, 3)
    tok, _ = sample_rows(logp, Sampling(1.0, 1.0, 1), logp, torch.rand(20000, generator=g, dtype=torch.float64))
    freq = torch.bincount(tok, minlength=3).double() / 20000
    assert freq.tolist() == pytest.approx([0.7, 0.2, 0.1], abs=0.014)


def test_bf16_autocast_generation_keeps_fp32_weights_and_sane_logprobs(tiny):
    model, tok = tiny
    b = HFBackend(model, [tok.eos_token_id], tok.pad_token_id, seed=0, compute_dtype=torch.bfloat16)
    out = b.generate(_seqs(tok, 4), Sampling(1.0, 1.0, 6))
    assert next(model.parameters()).dtype == torch.float32
    assert all(len(c.logprobs) == len(c.token_ids) and all(lp <= 0 for lp in c.logprobs) for c in out)
