"""The state-zero pass-rate predictor (rollwise.value.predictor): it predicts prompts it has never
seen from the states of similar prompts, uses a prompt's own history on a revisit, and is saved and
restored exactly."""

import pytest
import torch

from rollwise.value.metrics import auc, brier, degenerate_prob
from rollwise.value.predictor import PassRatePredictor

DIM = 12
CLUSTERS = (0.03, 0.5, 0.97)  # three kinds of prompt: almost never, half, almost always solved


def prompts(n, seed):
    """n prompts: a cluster each, a state near the cluster's centre, and the true pass rate."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(len(CLUSTERS), DIM, generator=torch.Generator().manual_seed(99)) * 3
    kinds = torch.randint(0, len(CLUSTERS), (n,), generator=g)
    states = centres[kinds] + torch.randn(n, DIM, generator=g)
    return states, [CLUSTERS[k] for k in kinds.tolist()]


def observe(p, n, g):
    return float(torch.binomial(torch.tensor(float(n)), torch.tensor(p), generator=g)) / n


def test_empty_bank_predicts_half_and_bad_shapes_are_named():
    pred = PassRatePredictor(DIM)
    assert pred.predict(torch.zeros(2, DIM), ["a", "b"]).tolist() == [0.5, 0.5]
    with pytest.raises(ValueError, match=r"\(N, 12\)"):
        pred.predict(torch.zeros(2, 5), ["a", "b"])
    with pytest.raises(ValueError, match="one rate"):
        pred.update(torch.zeros(2, DIM), ["a", "b"], [0.5], [4])


def test_first_visits_predicted_from_similar_prompts():
    g = torch.Generator().manual_seed(1)
    pred = PassRatePredictor(DIM, seed=0)
    for step in range(12):  # 12 steps x 16 prompts seen once each, 8 rollouts per group
        s, p = prompts(16, seed=step)
        pred.update(s, [f"s{step}-{i}" for i in range(16)], [observe(q, 8, g) for q in p], [8] * 16)
    s, p = prompts(200, seed=1000)  # never seen
    hat = pred.predict(s, [f"new-{i}" for i in range(200)]).tolist()
    assert brier(hat, p) < 0.25 * brier([sum(p) / len(p)] * len(p), p)  # far better than the mean pass rate
    degenerate = [float(torch.rand(1, generator=g)) < degenerate_prob(q, 8) for q in p]
    assert auc([degenerate_prob(h, 8) for h in hat], degenerate) > 0.8


def test_revisit_uses_the_prompts_own_history():
    """Two prompts with identical states but different pass rates: only the own-history feature can
    tell them apart, and it does once each has been observed."""
    g = torch.Generator().manual_seed(3)
    pred = PassRatePredictor(DIM, seed=0, min_fit=8)
    state = torch.ones(1, DIM)
    for step in range(20):
        s, p = prompts(8, seed=50 + step)
        ids = [f"x{step}-{i}" for i in range(8)] + ["easy", "hard"]
        rates = [observe(q, 8, g) for q in p] + [1.0, 0.0]
        pred.update(torch.cat([s, state, state]), ids, rates, [8] * 10)
    easy, hard = pred.predict(torch.cat([state, state]), ["easy", "hard"]).tolist()
    assert easy > 0.8 and hard < 0.2


def test_state_dict_round_trip_predicts_identically():
    g = torch.Generator().manual_seed(4)
    a = PassRatePredictor(DIM, seed=0, min_fit=4)
    s, p = prompts(24, seed=7)
    a.update(s, [f"p{i}" for i in range(24)], [observe(q, 4, g) for q in p], [4] * 24)
    b = PassRatePredictor(DIM, seed=0, min_fit=4)
    b.load_state_dict(a.state_dict())
    q, _ = prompts(5, seed=8)
    ids = ["p1", "n1", "n2", "p3", "n3"]
    assert torch.equal(a.predict(q, ids), b.predict(q, ids))


def test_bank_keeps_the_most_recent_context_entries():
    pred = PassRatePredictor(DIM, context=4, min_fit=100)
    for i in range(6):
        pred.update(torch.full((1, DIM), float(i)), [f"p{i}"], [i / 10], [2])
    assert pred.ids == ["p2", "p3", "p4", "p5"] and pred.rates.tolist() == pytest.approx([0.2, 0.3, 0.4, 0.5])


def test_prompt_states_are_the_prefill_state_of_generate():
    """The backend's prompt states equal the last-layer state at the prompt's last token that a decode
    hook sees at step 0 of generate (the same prefill), whatever the batch's padding."""
    from rollwise.backends.hf import HFBackend
    from rollwise.trainer.tiny import build_tiny
    from rollwise.types import Sampling

    model, tok = build_tiny("tiny-s", seed=0)
    be = HFBackend(model, [tok.eos_token_id], tok.pad_token_id, max_batch=8, seed=0)
    seqs = [[1, 5, 6, 7], [1, 9], [1, 4, 4, 4, 4, 4]]
    states = be.prompt_states(seqs)
    assert states.shape == (3, model.config.hidden_size)
    alone = torch.cat([be.prompt_states([s]) for s in seqs])
    assert torch.allclose(states, alone, atol=1e-5)  # padding does not change a prompt's state

    class Hook:
        seen = None

        def wants(self, t):
            return t == 0

        def __call__(self, t, rows, hidden, alive):
            Hook.seen = hidden.clone()
            return None

    be.generate(seqs, Sampling(1.0, 1.0, 2), decode_hook=Hook())
    assert torch.allclose(Hook.seen.float().cpu(), states, atol=1e-5)
