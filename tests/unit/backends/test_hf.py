import pytest
import torch

from rollwise.backends.hf import HFBackend, top_p_logprobs
from rollwise.trainer.tiny import build_tiny
from rollwise.types import Sampling


@pytest.fixture(scope="module")
def tiny():
    model, tok = build_tiny("tiny-s", seed=1)
    return model.eval(), tok


def _backend(tiny, seed=0):
    model, tok = tiny
    return HFBackend(model, [tok.eos_token_id], tok.pad_token_id, max_batch=8, seed=seed)


def test_logprobs_match_a_full_forward(tiny):
    model, tok = tiny
    b = _backend(tiny)
    seq = [tok.bos_token_id] + tok.encode("12+34=")
    c = b.generate([seq, seq[:3]], Sampling(1.0, 1.0, 6))[0]
    full = torch.tensor([seq + list(c.token_ids)])
    with torch.no_grad():
        lp = torch.log_softmax(model(full).logits[0], -1)
    expect = lp[len(seq) - 1 : -1].gather(1, torch.tensor(c.token_ids)[:, None])[:, 0]
    assert torch.allclose(expect, torch.tensor(c.logprobs), atol=1e-4)


def test_continuing_a_greedy_prefix_equals_uninterrupted(tiny):
    _, tok = tiny
    b = _backend(tiny)
    seq = [tok.bos_token_id] + tok.encode("7+8=")
    whole = b.generate([seq], Sampling(0.0, 1.0, 10))[0]
    head = b.generate([seq], Sampling(0.0, 1.0, 4))[0]
    tail = b.generate([seq + list(head.token_ids)], Sampling(0.0, 1.0, 6))[0]
    assert head.finish == "length" or head.finish == "stop"
    assert head.token_ids + tail.token_ids == whole.token_ids[: len(head.token_ids) + len(tail.token_ids)]


def test_same_seed_same_samples_and_left_padding_isolated(tiny):
    _, tok = tiny
    a, b = _backend(tiny, seed=3), _backend(tiny, seed=3)
    seqs = [[1] + tok.encode("1+1="), [1] + tok.encode("123+456=")]
    assert a.generate(seqs, Sampling(1.0, 1.0, 5)) == b.generate(seqs, Sampling(1.0, 1.0, 5))
    # greedy result of a row does not depend on its batch-mates (padding is masked)
    alone = a.generate(seqs[:1], Sampling(0.0, 1.0, 5))[0]
    together = a.generate(seqs, Sampling(0.0, 1.0, 5))[0]
    assert alone.token_ids == together.token_ids


def test_stops_at_eos_and_reports_finish(tiny):
    model, tok = tiny
    with torch.no_grad():  # make EOS overwhelmingly likely
        model.lm_head.bias = None
    b = HFBackend(_ForceEOS(model, tok.eos_token_id), [tok.eos_token_id], tok.pad_token_id)
    c = b.generate([[1, 5, 6]], Sampling(1.0, 1.0, 5))[0]
    assert c.token_ids == (tok.eos_token_id,) and c.finish == "stop"
    long = _backend(tiny).generate([[1, 5, 6]], Sampling(1.0, 1.0, 1))[0]
    assert len(long.token_ids) == 1


class _ForceEOS(torch.nn.Module):
    def __init__(self, model, eos):
        super().__init__()
        self.model, self.eos = model, eos

    def forward(self, **kw):
        out = self.model(**kw)
        out.logits[..., self.eos] += 1e4
        return out


def test_top_p_keeps_smallest_nucleus():
    # probs [0.5, 0.3, 0.2]; top_p 0.7 keeps {0.5, 0.3} -> renormalised [0.625, 0.375, 0]
    logp = torch.tensor([[0.5, 0.3, 0.2]]).log()
    out = top_p_logprobs(logp, 0.7).exp()
    assert torch.allclose(out, torch.tensor([[0.625, 0.375, 0.0]]), atol=1e-6)
