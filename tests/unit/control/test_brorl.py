"""BroRL (control/brorl.py, docs/specs/allocation.md §6): the §6.4 properties (mixed-group probability
and the softmax-bandit direction test), the controller's allocation within the budget, and
memory that does not grow with n: generation in chunks of ``model.max_batch`` and training in
micro-batches of ``train.micro_batch``."""

import json

import numpy as np
import pytest
import torch

import rollwise
from conftest import as_sets, tiny_overrides
from rollwise.backends.hf import HFBackend
from rollwise.backends.scripted import ScriptedBackend
from rollwise.config import load_config
from rollwise.control import REGISTRY
from rollwise.control.brorl import BroRL
from rollwise.distributed.local import LocalPool
from rollwise.tokens import Codec
from rollwise.trainer.tiny import build_tiny, char_tokenizer
from rollwise.types import Plan, Prompt, Request, Sampling, Verdict


def _prompts(n):
    return [Prompt(f"p{i}", "t", f"{i}", "0") for i in range(n)]


def _brorl(*overrides, **options):
    cfg = load_config(overrides=["control.prompts_per_step=4", "control.rollouts_per_prompt=8", *overrides]).control
    return BroRL(_prompts(20), cfg, BroRL.Options(**options), seed=0)


# ------------------------------------------------------------------ §6.4 properties


def test_mixed_group_probability_increases_with_n():
    # P(mixed) = 1 - p^N - (1-p)^N. p = 0.1: N=2 -> 1 - .01 - .81 = .18; N=16 -> 1 - 0.1^16 - 0.9^16 = .8147
    mixed = lambda p, n: 1 - p**n - (1 - p) ** n  # noqa: E731
    assert mixed(0.1, 2) == pytest.approx(0.18) and mixed(0.1, 16) == pytest.approx(1 - 0.9**16)
    # the filtered share p^N + (1-p)^N strictly falls (computed directly: 1 - it rounds to 1.0 at large N)
    filtered = lambda p, n: p**n + (1 - p) ** n  # noqa: E731
    ns = [1, 2, 4, 8, 16, 64, 512]
    for p in (0.01, 0.1, 0.5, 0.9):
        vals = [filtered(p, n) for n in ns]
        assert all(a > b for a, b in zip(vals, vals[1:])), (p, vals)
    assert mixed(0.01, 512) > 0.99  # a hard prompt is almost never filtered at N = 512


def _bandit_decrease_fraction(n, trials=400, vocab=16, dim=4, n_correct=4, lr=0.5, seed=0):
    """Share of random softmax bandits whose total correct-token probability *drops* after one
    group-normalised policy-gradient step on ``n`` samples. Logits are ``E @ theta`` with shared
    parameters (dim < vocab), so an update on sampled tokens also moves unsampled ones (the
    "unsampled coupling" of the paper). Same problems for every n (common random numbers)."""
    rng = np.random.default_rng(seed)
    drops = 0
    for _ in range(trials):
        emb = rng.normal(size=(vocab, dim))
        theta = rng.normal(size=dim)
        correct = np.zeros(vocab, bool)
        correct[:n_correct] = True

        def mass(th):
            z = emb @ th
            p = np.exp(z - z.max())
            p /= p.sum()
            return p, p[correct].sum()

        pi, before = mass(theta)
        ys = np.random.default_rng(rng.integers(1 << 31)).choice(vocab, size=n, p=pi)
        r = correct[ys].astype(float)
        adv = (r - r.mean()) / (r.std() + 1e-6)  # group-normalised (all equal -> 0, no step)
        grad = (adv[:, None] * (emb[ys] - pi @ emb)).mean(0)  # sum_i A_i grad log pi(y_i) / n
        _, after = mass(theta + lr * grad)
        drops += after < before - 1e-12
    return drops / trials


def test_bandit_direction_correct_mass_falls_less_often_as_n_grows():
    # Measured (seed 0, 400 bandits): N = 2, 8, 32, 128, 512 -> 0.04, 0.025, 0.0025, 0, 0.
    # Caveat: with stronger coupling (dim = 2) the share first *rises* for small N, because a group
    # of 2 is often all-equal and makes no step at all; the fall with N holds from N ~ 8 on.
    ns = [2, 8, 32, 128, 512]
    frac = [_bandit_decrease_fraction(n) for n in ns]
    assert all(a >= b for a, b in zip(frac, frac[1:])), frac
    assert frac[0] > 0.02 and frac[-1] == 0.0, frac


# ------------------------------------------------------------------ the controller


def test_keeps_samples_per_step_within_the_budget():
    # default budget = 4 prompts x 8 = 32 rollouts; n = 16 -> floor(32 / 16) = 2 prompts of 16
    b = _brorl(n=16)
    ps = b.select(None)
    assert len(ps) == 2 and [r.n for r in b.plan(ps, None).requests] == [16, 16]
    assert not b.next_round([], None)
    # n = 512 > budget: one prompt, trimmed to the 32 rollouts of the budget
    b = _brorl()
    assert [r.n for r in b.plan(b.select(None), None).requests] == [32]
    # explicit budget 1100, n = 512: 2 prompts of 512 (1024 <= 1100)
    b = _brorl("control.budget_rollouts=1100")
    assert [r.n for r in b.plan(b.select(None), None).requests] == [512, 512]
    assert REGISTRY.get("brorl") is BroRL


def test_fixed_prompts_mode_and_token_budget():
    # keep_samples_per_step = false: 4 prompts x n = 64 (budget defaults to 4 x 64 = 256)
    b = _brorl(n=64, keep_samples_per_step=False)
    assert [r.n for r in b.plan(b.select(None), None).requests] == [64] * 4 and b.budget == 256
    # ... with budget_rollouts 150 the last ones are trimmed: 64, 64, 22
    b = _brorl("control.budget_rollouts=150", n=64, keep_samples_per_step=False)
    assert [r.n for r in b.plan(b.select(None), None).requests] == [64, 64, 22]
    # token budget 1000 with max_new_tokens 4 (no data): 250 rollouts -> floor(250 / 100) = 2 prompts
    b = _brorl("control.budget_tokens=1000", "sampling.max_new_tokens=4", "control.budget_rollouts=100000", n=100)
    assert [r.n for r in b.plan(b.select(None), None).requests] == [100, 100]


def test_state_round_trip():
    from rollwise.types import Group, Rollout, RunState

    b = _brorl(n=16)
    ps = b.select(None)
    b.observe(
        [
            Group(p, tuple(Rollout(p.id, (1,), (2, 3), (-1.0, -1.0), "stop", 0, "", Verdict(1.0)) for _ in range(16)))
            for p in ps
        ],
        RunState(step=0),
    )
    c = _brorl(n=16)
    c.load_state_dict(json.loads(json.dumps(b.state_dict())))
    assert [p.id for p in c.select(None)] == [p.id for p in b.select(None)]
    assert c.history.records == b.history.records


# ------------------------------------------------------------------ memory: chunked generation and training


class Recording:
    """A backend that records the number of sequences of every ``generate`` call."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def generate(self, sequences, sampling, generator=None):
        self.calls.append(len(sequences))
        return self.inner.generate(sequences, sampling, generator)


def test_pool_generates_n_256_in_chunks_of_max_batch():
    tok = char_tokenizer()
    backend = Recording(ScriptedBackend(lambda seq, i: tok.encode("7"), tok.eos_token_id))
    pool = LocalPool(
        backend, Codec(tok, use_chat=False), lambda p, t: Verdict(1.0), Sampling(1.0, 1.0, 4), max_batch=48
    )
    prompt = Prompt("p0", "arithmetic", "3+4=", "7")
    groups = pool.generate(Plan((Request(prompt, 256),)), [], version=0)
    # 256 = 5 x 48 + 16
    assert backend.calls == [48, 48, 48, 48, 48, 16]
    assert [g.size for g in groups] == [256] and pool.cost.rollouts == 256


class ForwardSizes(torch.nn.Module):
    """Wraps a model; records the batch size of every forward pass."""

    def __init__(self, model):
        super().__init__()
        self.model, self.sizes = model, []

    def forward(self, input_ids, **kw):
        self.sizes.append(int(input_ids.shape[0]))
        return self.model(input_ids=input_ids, **kw)


def test_hf_generation_and_training_never_see_more_than_their_chunk():
    from rollwise.collate import collate, flatten
    from rollwise.objectives import ADVANTAGES, OBJECTIVES
    from rollwise.trainer.trainer import Trainer

    model, tok = build_tiny("tiny-s", seed=0)
    spy = ForwardSizes(model)
    codec = Codec(tok, use_chat=False)
    pool = LocalPool(
        HFBackend(spy, [tok.eos_token_id], tok.pad_token_id, max_batch=32, seed=0),
        codec,
        lambda p, t: Verdict(float(len(t) % 2)),
        Sampling(1.0, 1.0, 2),
        max_batch=32,
    )
    groups = pool.generate(Plan((Request(Prompt("p0", "arithmetic", "3+4=", "7"), 96),)), [], version=0)
    assert groups[0].size == 96 and spy.sizes and max(spy.sizes) <= 32  # every decode step of every chunk
    spy.sizes.clear()
    rows, rewards, gidx = flatten(groups)
    adv = ADVANTAGES.get("dr_grpo")
    batch = collate(rows, rewards, gidx, adv(rewards, gidx, adv.Options()), tok.pad_token_id)
    obj = OBJECTIVES.get("grpo")
    cfg = load_config(overrides=["train.micro_batch=40"]).train
    metrics = Trainer(spy, obj, obj.Options(), cfg, 1.0).optimize(batch)
    assert spy.sizes == [40, 40, 16]  # 96 rows = 2 x 40 + 16, one optimizer step
    assert np.isfinite(metrics["train/loss"])


def test_loop_with_brorl_chunks_generation_and_trains_groups_of_different_sizes(tmp_path, monkeypatch):
    # keep_samples_per_step = false: 3 prompts x n = 24 in a budget of 60 -> 24, 24, 12;
    # model.max_batch = 16 -> the backend sees calls of at most 16 sequences
    from rollwise.trainer.trainer import Trainer

    seen, real = [], Trainer.optimize
    monkeypatch.setattr(
        Trainer, "optimize", lambda self, b: (seen.append(torch.bincount(b.group_index).tolist()), real(self, b))[1]
    )
    tok = char_tokenizer()
    backend = Recording(ScriptedBackend(lambda seq, i: tok.encode(str(i % 3)), tok.eos_token_id))
    o = tiny_overrides(
        tmp_path,
        steps=2,
        **{
            "control.name": "brorl",
            "control.options": {"n": 24, "keep_samples_per_step": False},
            "control.prompts_per_step": 3,
            "control.budget_rollouts": 60,
            "model.max_batch": 16,
            "eval.at_start": False,
            "model.warm_start.steps": 0,
            "eval.n_prompts": 2,
        },
    )
    result = rollwise.train(load_config(overrides=as_sets(o)), backend=backend, log=lambda m: None)
    lines = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["control/budget_used"] for m in lines] == [60, 60]
    assert all(m["control/rollouts_per_prompt_max"] == 24 and m["control/rollouts_per_prompt_min"] == 12 for m in lines)
    assert max(backend.calls) <= 16
    assert [sorted(s) for s in seen] == [[12, 24, 24]] * 2
