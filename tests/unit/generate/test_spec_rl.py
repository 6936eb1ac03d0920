"""SPEC-RL speculative rollouts (generate/spec_rl.py; systems.md §5 testable properties)."""

import io
import math

import pytest
import torch

from rollwise.backends.hf import HFBackend
from rollwise.backends.scripted import ScriptedBackend
from rollwise.distributed.local import LocalPool
from rollwise.generate.spec_rl import (
    SpeculativeRollouts,
    first_rejection,
    residual_distribution,
    speculative_distribution,
)
from rollwise.tokens import Codec
from rollwise.trainer.tiny import build_tiny, char_tokenizer
from rollwise.types import Plan, Prompt, Request, Sampling, Verdict


@pytest.fixture(scope="module")
def tiny():
    model, tok = build_tiny("tiny-s", seed=1)
    return model.eval(), tok


def _prompts(k):
    return [Prompt(f"p{i}", "t", f"{i}+{i}=", str(2 * i)) for i in range(k)]


def _verify(p, t):
    return Verdict(float(t == p.answer))


def _hf_pool(tiny, seed=0, budget=8):
    model, tok = tiny
    backend = HFBackend(model, [tok.eos_token_id], tok.pad_token_id, max_batch=64, seed=seed)
    return LocalPool(backend, Codec(tok, use_chat=False), _verify, Sampling(1.0, 1.0, budget), 64)


# ---------------------------------------------------------------- the acceptance rule (pure)


def test_first_rejection_limits():
    lp_old = [-1.0, -2.0, -0.5, -3.0]
    lp_new = [-1.5, -4.0, -0.1, -9.0]
    log_u = [-0.2, -0.1, -0.3, -0.01]
    # bias 0: accept iff log u <= new - old: -0.2 <= -0.5? no -> cut 0
    assert first_rejection(lp_new, lp_old, log_u, 0.0) == 0
    # bias 0.5: -0.2 <= 0.0 yes; -0.1 <= -1.5 no -> cut 1
    assert first_rejection(lp_new, lp_old, log_u, 0.5) == 1
    assert first_rejection(lp_new, lp_old, log_u, math.inf) == 4  # l -> inf: full reuse (cut = L + 1 in 1-based)
    assert first_rejection(lp_new, lp_old, log_u, -math.inf) == 0  # l -> 0: regenerate everything
    assert first_rejection(lp_old, lp_old, log_u, 0.0) == 4  # p_new = p_old, l >= 1: accept all
    assert first_rejection(lp_new, lp_old, log_u, math.inf, min_logprob=math.log(0.1)) == 1  # tau: p_new >= 0.1


def test_bias_of_the_lenient_rule_on_a_one_step_toy_distribution():
    """Property 3: draft p, target q. SPEC-RL (accept min(1, l q/p), else resample q) gives
    min(p, l q) + (1 - beta) q, beta = sum min(p, l q); worked by hand for p = (0.8, 0.2),
    q = (0.5, 0.5), l = 1: (0.5, 0.2) + 0.3 * (0.5, 0.5) = (0.65, 0.35), total variation 0.15 from q.
    The residual mode resamples from max(0, q - p) / (1 - beta) = (0, 1): (0.5, 0.2) + 0.3 * (0, 1) = q."""
    p, q = torch.tensor([0.8, 0.2]), torch.tensor([0.5, 0.5])
    lenient = speculative_distribution(p, q, bias=0.0)
    assert torch.allclose(lenient, torch.tensor([0.65, 0.35]))
    assert 0.5 * (lenient - q).abs().sum().item() == pytest.approx(0.15)
    assert torch.allclose(speculative_distribution(p, q, bias=0.0, residual=True), q)
    assert torch.allclose(residual_distribution(p, q), torch.tensor([0.0, 1.0]))
    # the bias grows with the lenience: l = e^0.5 accepts min(0.8, 0.82) = 0.8 and min(0.2, 0.82) = 0.2: the draft p
    # itself
    assert torch.allclose(speculative_distribution(p, q, bias=0.5), p)
    assert torch.allclose(speculative_distribution(p, q, bias=math.inf), p)
    assert torch.allclose(speculative_distribution(q, q, bias=0.0), q)  # p = q: exact
    # Monte Carlo on a 5-way distribution with the same rule as the pool (first_rejection + resample)
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.4, 0.3, 0.1, 0.1, 0.1])
    q = torch.tensor([0.1, 0.2, 0.3, 0.2, 0.2])
    n = 40_000
    for residual, expect in ((False, speculative_distribution(p, q)), (True, q)):
        counts = torch.zeros(5)
        draws = torch.multinomial(p, n, replacement=True, generator=g)
        log_u = torch.rand(n, generator=g, dtype=torch.float64).log()
        resample = torch.multinomial(residual_distribution(p, q) if residual else q, n, replacement=True, generator=g)
        for x, lu, y in zip(draws.tolist(), log_u.tolist(), resample.tolist()):
            cut = first_rejection([math.log(q[x])], [math.log(p[x])], [lu], 0.0)
            counts[x if cut == 1 else y] += 1
        assert torch.allclose(counts / n, expect, atol=0.01)
    # by hand: min(p, q) = (.1, .2, .1, .1, .1), beta = .6 -> min + .4 q = (.14, .28, .22, .18, .18); TV to q = .12
    assert torch.allclose(speculative_distribution(p, q), torch.tensor([0.14, 0.28, 0.22, 0.18, 0.18]))
    assert 0.5 * (speculative_distribution(p, q) - q).abs().sum().item() == pytest.approx(0.12)


# ---------------------------------------------------------------- the pool


def _two_steps(pool, spec, plan):
    sp = spec.wrap_pool(pool)
    first = sp.generate(plan, [], 0)
    pool.take_cost()
    second = sp.generate(plan, [], 1)
    return first, second, pool.take_cost()


def test_identical_policy_accepts_every_draft_on_the_hf_sampler(tiny):
    """p_new = p_old (weights unchanged) and l = 1: every draft is accepted, nothing is generated."""
    pool = _hf_pool(tiny)
    spec = SpeculativeRollouts(None, SpeculativeRollouts.Options(bias=0.0), 0)
    plan = Plan(tuple(Request(p, 4) for p in _prompts(5)))
    first, second, cost = _two_steps(pool, spec, plan)
    drafted = sum(len(r.completion_ids) for g in first for r in g.rollouts)
    assert [[r.completion_ids for r in g.rollouts] for g in second] == [
        [r.completion_ids for r in g.rollouts] for g in first
    ]
    assert cost.generated_tokens == 0 and cost.reused_tokens == drafted == cost.verify_tokens
    assert cost.rollouts == 20 and cost.metrics["spec_rl/full_accept_rows"] == 20
    # accepted prefixes are scored by the current policy: their log-probs equal the sampler's
    for g1, g2 in zip(first, second):
        for a, b in zip(g1.rollouts, g2.rollouts):
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
            assert b.finish == a.finish and b.policy_version == 1


def test_infinite_lenience_reuses_everything_after_a_weight_change(tiny):
    model, tok = tiny
    pool = _hf_pool((model, tok))
    spec = SpeculativeRollouts(None, SpeculativeRollouts.Options(bias=math.inf), 0)
    plan = Plan(tuple(Request(p, 3) for p in _prompts(4)))
    sp = spec.wrap_pool(pool)
    first = sp.generate(plan, [], 0)
    pool.take_cost()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with torch.no_grad():
            for prm in model.parameters():
                prm.add_(0.5 * torch.randn_like(prm))
        second = sp.generate(plan, [], 1)
    finally:
        model.load_state_dict(state)
    cost = pool.take_cost()
    assert [[r.completion_ids for r in g.rollouts] for g in second] == [
        [r.completion_ids for r in g.rollouts] for g in first
    ]
    assert cost.generated_tokens == 0 and cost.metrics["spec_rl/accepted_token_frac"] == 1.0


def test_rejection_keeps_only_the_prefix_and_continues_within_budget(tiny):
    """Zero lenience (-inf) regenerates from position 0; a partial cut continues from the cut with
    budget R - n (checked on the scripted backend, whose drafts are accepted: then change p_old)."""
    pool = _hf_pool(tiny, budget=6)
    spec = SpeculativeRollouts(None, SpeculativeRollouts.Options(bias=-math.inf), 0)
    plan = Plan(tuple(Request(p, 4) for p in _prompts(3)))
    first, second, cost = _two_steps(pool, spec, plan)
    assert cost.reused_tokens == 0 and cost.generated_tokens > 0 and cost.metrics["spec_rl/mean_cut"] == 0.0
    assert all(len(r.completion_ids) <= 6 for g in second for r in g.rollouts)
    # scripted: answers of 5 digits; make the cached p_old of token 2 huge so it is rejected there
    tok = char_tokenizer()
    backend = ScriptedBackend(
        lambda seq, i: tok.encode("12345", add_special_tokens=False), tok.eos_token_id, logprob=-0.5
    )
    spool = LocalPool(backend, Codec(tok, use_chat=False), _verify, Sampling(1.0, 1.0, 6))
    spec = SpeculativeRollouts(None, SpeculativeRollouts.Options(bias=0.0), 0)
    sp = spec.wrap_pool(spool)
    plan = Plan((Request(_prompts(1)[0], 1),))
    sp.generate(plan, [], 0)
    d = spec.cache["p0"][0]
    # p_old(token 2) = e^50 (not a probability; it makes the ratio e^-50.5): accepted only if u < e^-50.5
    spec.cache["p0"][0] = type(d)(d.ids, (-0.5, -0.5, 50.0) + d.logprobs[3:], d.finish)
    spool.take_cost()
    calls = backend.calls
    (g,) = sp.generate(plan, [], 1)
    cost = spool.take_cost()
    (r,) = g.rollouts
    assert backend.calls == calls + 1 and cost.reused_tokens == 2 and cost.verify_tokens == 6
    # prefix "12" kept, continuation "12345" + EOS cut at the remaining budget 6 - 2 = 4
    assert r.completion_ids == d.ids[:2] + tuple(tok.encode("1234", add_special_tokens=False))
    assert r.finish == "length" and cost.generated_tokens == 4


def test_cache_alignment_rows_get_their_own_prompts_drafts():
    """Property 4: after a reshuffle, a prompt's rows are matched to that prompt's cached responses."""
    tok = char_tokenizer()
    backend = ScriptedBackend(lambda seq, i: tok.encode(str(i), add_special_tokens=False), tok.eos_token_id)
    pool = LocalPool(backend, Codec(tok, use_chat=False), _verify, Sampling(1.0, 1.0, 8))
    spec = SpeculativeRollouts(None, SpeculativeRollouts.Options(), 0)
    sp = spec.wrap_pool(pool)
    ps = _prompts(3)
    first = {g.prompt.id: g for g in sp.generate(Plan(tuple(Request(p, 2) for p in ps)), [], 0)}
    second = sp.generate(Plan(tuple(Request(p, 3) for p in reversed(ps))), [], 1)  # reshuffled, one more row each
    for g in second:
        assert [r.completion_ids for r in g.rollouts[:2]] == [r.completion_ids for r in first[g.prompt.id].rollouts]
    assert backend.calls == 6 + 3  # only the third row of each prompt was generated


def test_residual_mode_runs_and_caches_distributions(tiny):
    pool = _hf_pool(tiny)
    spec = SpeculativeRollouts(None, SpeculativeRollouts.Options(bias=0.0, residual=True), 0)
    plan = Plan(tuple(Request(p, 2) for p in _prompts(3)))
    _, second, cost = _two_steps(pool, spec, plan)
    d = spec.cache["p0"][0]
    assert d.dists is not None and d.dists.shape[0] == len(d.ids)
    assert cost.generated_tokens == 0  # same weights: every draft accepted


def test_state_dict_round_trip(tiny):
    pool = _hf_pool(tiny)
    spec = SpeculativeRollouts(None, SpeculativeRollouts.Options(bias=0.2), 3)
    plan = Plan(tuple(Request(p, 2) for p in _prompts(3)))
    spec.wrap_pool(pool).generate(plan, [], 0)
    f = io.BytesIO()
    torch.save(spec.state_dict(), f)
    f.seek(0)
    copy = SpeculativeRollouts(None, spec.opts, 3)
    copy.load_state_dict(torch.load(f, weights_only=False))
    assert copy.cache == spec.cache
    assert torch.equal(torch.rand(4, generator=copy.generator), torch.rand(4, generator=spec.generator))


def test_a_requested_prefix_keeps_its_own_versions_and_accepted_drafts_are_current():
    """A request continuing an off-policy prefix keeps the request's prefix versions (and log-probs);
    a drafted row's accepted prefix is labelled with the current version (the paper)."""
    tok = char_tokenizer()
    backend = ScriptedBackend(
        lambda seq, i: tok.encode("12345", add_special_tokens=False), tok.eos_token_id, logprob=-0.5
    )
    pool = LocalPool(backend, Codec(tok, use_chat=False), _verify, Sampling(1.0, 1.0, 6))
    spec = SpeculativeRollouts(None, SpeculativeRollouts.Options(bias=0.0), 0)
    sp = spec.wrap_pool(pool)
    p0, p1 = _prompts(2)
    sp.generate(Plan((Request(p0, 1),)), [], 0)
    d = spec.cache["p0"][0]
    spec.cache["p0"][0] = type(d)(d.ids, (-0.5, -0.5, 50.0) + d.logprobs[3:], d.finish)  # reject at token 2
    prefix = tuple(tok.encode("12", add_special_tokens=False))
    out = {
        g.prompt.id: g for g in sp.generate(Plan((Request(p0, 1), Request(p1, 1, prefix, (-0.1, -0.2), (3, 4)))), [], 5)
    }
    (cont,) = out["p1"].rollouts
    assert cont.completion_ids[:2] == prefix and cont.logprobs[:2] == (-0.1, -0.2)
    assert cont.token_versions == (3, 4) + (5,) * (len(cont.completion_ids) - 2) and cont.policy_version == 3
    (drafted,) = out["p0"].rollouts
    assert drafted.completion_ids[:2] == d.ids[:2]
    assert drafted.token_versions == (5,) * len(drafted.completion_ids)


def test_latr_is_refused_under_speculative():
    from rollwise.config import load_config
    from rollwise.registry import UserError

    with pytest.raises(UserError, match=r"sampling\.latr\.enabled.*replay .spec_rl."):
        load_config(overrides=["replay.name=spec_rl", "sampling.latr.enabled=true"])
    load_config(overrides=["replay.name=spec_rl"])
