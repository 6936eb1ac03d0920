"""CurES controller (control/cures.py, allocation.md §3, §3.5): posterior, sampler weights, the
gradient-noise formula, quotas proportional to it, the online update, resume, and the real loop."""

import json
import math
from collections import Counter

import pytest

import rollwise
from conftest import as_sets, tiny_overrides
from rollwise.backends.scripted import ScriptedBackend
from rollwise.config import load_config
from rollwise.control import REGISTRY
from rollwise.control.cures import (
    CurES,
    CuresOptions,
    code_tau,
    gradient_noise,
    posterior_mean,
    proportional_quota,
    sampling_weight,
)
from rollwise.registry import UserError
from rollwise.types import Group, Prompt, Rollout, RunState, Verdict


def _prompts(n):
    return [Prompt(f"p{i}", "t", f"{i}+{i}=", str(2 * i)) for i in range(n)]


def _rollout(pid, score):
    return Rollout(pid, (1,), (2,), (-1.0,), "stop", 0, "", Verdict(score))


def _ctrl(n_prompts=3, opts=None, n_train=10, **cfg):
    cfg.setdefault("prompts_per_step", n_prompts)
    over = [f"control.{k}={json.dumps(v)}" for k, v in cfg.items()]
    return CurES(_prompts(n_train), load_config(overrides=over).control, CuresOptions(**(opts or {})), seed=0)


def _merge(groups, plan, reward_of):
    merged = {g.prompt.id: g for g in groups}
    for req in plan.requests:
        g = merged.get(req.prompt.id) or Group(req.prompt, ())
        new = tuple(_rollout(req.prompt.id, float(reward_of(req.prompt, g.size + j))) for j in range(req.n))
        merged[req.prompt.id] = Group(g.prompt, g.rollouts + new)
    return list(merged.values())


def _step(ctrl, reward_of, state=None):
    state = state or RunState()
    prompts = ctrl.select(state)
    plan = ctrl.plan(prompts, state)
    groups, sizes = [], []
    while plan:
        sizes.append(plan.total)
        groups = _merge(groups, plan, reward_of)
        plan = ctrl.next_round(groups, state)
    ctrl.observe(groups, state)
    return prompts, groups, sizes


# ------------------------------------------------------------------ formulas (§3.1, §3.5)


def test_posterior_mean():
    assert posterior_mean(0, 0) == 0.5  # Beta(1, 1): an unseen prompt
    assert posterior_mean(3, 4) == pytest.approx(4 / 6)  # (3 + 1) / (4 + 2)
    assert posterior_mean(0, 4) == pytest.approx(1 / 6)


def test_sampling_weight_peaks_at_one_half():
    ps = [i / 20 for i in range(21)]
    w = [sampling_weight(p, 0.1) for p in ps]
    assert max(range(21), key=lambda i: w[i]) == 10
    assert sampling_weight(0.5, 0.1) == pytest.approx(math.exp(5.0))  # sqrt(0.25) / 0.1 = 5


def test_code_tau_makes_the_sampler_almost_uniform():
    """The released tau_i = 100 (c_i + 1): the exponent sqrt(p(1-p)) / tau is at most 0.5 / 100 =
    0.005, so the largest/smallest weight ratio is at most exp(0.005) = 1.00501 <= 1.006."""
    assert code_tau(0) == pytest.approx(100.0) and code_tau(4) == pytest.approx(500.0)
    ws = [sampling_weight(posterior_mean(c, n), code_tau(c)) for n in range(0, 40) for c in range(0, n + 1)]
    assert max(ws) / min(ws) <= math.exp(0.005) + 1e-12 < 1.006


def test_gradient_noise_formula():
    # a = 0.5, b = 0.5: a b^2 E[g_c^2] = 0.125 * 4 = 0.5; a^2 b E[g_w^2] = 0.125 * 1 = 0.125;
    # a^2 b^2 (E[g_c] - E[g_w])^2 = 0.0625 * 1 -> sigma^2 = 0.5625, sigma = 0.75
    assert gradient_noise(0.5, gc2=4, gw2=1, gc=2, gw=1) == pytest.approx(0.75)
    # unit norms: a b (a + b) = a b -> sqrt(a (1 - a)); a = 1/4: sqrt(3/16) = 0.4330
    assert gradient_noise(0.25) == pytest.approx(math.sqrt(3 / 16))
    assert gradient_noise(0.0) == 0.0 and gradient_noise(1.0) == 0.0


def test_proportional_quota_hand_example():
    # total 16, w = [0.5, 0.433, 0]: exact 8.574, 7.426, 0 -> floors 8, 7 -> +1 to the larger remainder
    assert proportional_quota(16, [0.5, math.sqrt(3 / 16), 0.0]) == [9, 7, 0]
    assert proportional_quota(10, [1, 1, 1]) == [4, 3, 3]  # ties: earlier first
    assert proportional_quota(10, [0, 0]) == [0, 0]
    assert proportional_quota(0, [1, 2]) == [0, 0]
    q = proportional_quota(1000, [0.1, 0.2, 0.3, 0.4])
    assert q == [100, 200, 300, 400] and sum(q) == 1000


# ------------------------------------------------------------------ controller


def test_quotas_follow_the_probe_noise_and_skip_saturated_prompts():
    """Probe 4 each: p0 1,0,1,0 (a = 1/2, sigma = 0.5), p1 1,0,0,0 (sigma = 0.433), p2 all wrong,
    p3 all right (sigma = 0). Budget 32 -> R = 32 - 16 = 16 -> m = [9, 7, 0, 0] (hand example above)."""
    ctrl = _ctrl(4, budget_rollouts=32)
    pattern = {"p0": [1, 0, 1, 0], "p1": [1, 0, 0, 0], "p2": [0, 0, 0, 0], "p3": [1, 1, 1, 1]}
    prompts = _prompts(4)
    plan = ctrl.plan(prompts, RunState())
    assert [(r.prompt.id, r.n) for r in plan.requests] == [("p0", 4), ("p1", 4), ("p2", 4), ("p3", 4)]
    groups = _merge([], plan, lambda p, j: pattern[p.id][j])
    quota = ctrl.next_round(groups, RunState())
    assert [(r.prompt.id, r.n) for r in quota.requests] == [("p0", 9), ("p1", 7)]
    assert ctrl.metrics["control/cures_skipped"] == 2
    groups = _merge(groups, quota, lambda p, j: 1)
    assert not ctrl.next_round(groups, RunState())  # one quota round per step
    ctrl.observe(groups, RunState())
    # online Bayesian update: p0 has 4 + 9 rollouts, 2 + 9 correct -> (11 + 1) / (13 + 2) = 0.8
    assert ctrl.posterior("p0") == pytest.approx(12 / 15)
    assert ctrl.posterior("p2") == pytest.approx(1 / 6)  # 0 of 4 -> 1/6
    assert ctrl.posterior("p9") == 0.5  # never seen


def test_all_saturated_probes_leave_the_rest_unspent():
    ctrl = _ctrl(2, budget_rollouts=20)
    plan = ctrl.plan(_prompts(2), RunState())
    assert not ctrl.next_round(_merge([], plan, lambda p, j: 0), RunState())


@pytest.mark.parametrize("budget,probe", [(10, 4), (12, 4), (30, 4), (31, 2), (25, 0), (7, 0)])
def test_budget_is_never_exceeded_and_spent_when_there_is_signal(budget, probe):
    ctrl = _ctrl(3, {"probe_rollouts": probe}, budget_rollouts=budget)
    for step in range(3):  # alternating rewards: every probe is mixed
        _, groups, sizes = _step(ctrl, lambda p, j: j % 2, RunState(step=step))
        assert sum(sizes) == sum(g.size for g in groups) == budget


def test_without_probe_quotas_come_from_the_posterior():
    """probe_rollouts = 0: sigma_i = sqrt(p_i (1 - p_i)) from the history, one round. p0 seen 0 of 4
    (p = 1/6, sigma = 0.3727), p1 unseen (p = 1/2, sigma = 0.5): budget 12 -> exact 5.12, 6.88
    -> floors 5, 6 -> the last one to the larger remainder 0.88 -> [5, 7]."""
    ctrl = _ctrl(2, {"probe_rollouts": 0}, budget_rollouts=12)
    p0, p1 = _prompts(2)
    ctrl.observe([Group(p0, tuple(_rollout("p0", 0.0) for _ in range(4)))], RunState())
    plan = ctrl.plan([p0, p1], RunState(step=1))
    assert [(r.prompt.id, r.n) for r in plan.requests] == [("p0", 5), ("p1", 7)]
    assert not ctrl.next_round(_merge([], plan, lambda p, j: 1), RunState(step=1))


def test_paper_sampler_prefers_medium_difficulty():
    """tau = 0.1: unseen p0 (p = 1/2) has weight e^5 = 148.4; p1 with 0 of 98 (p = 1/100,
    sqrt(0.0099) = 0.0995) has e^0.995 = 2.70 -> P(p0 drawn alone) = 148.4 / 151.1 = 0.982."""
    ctrl = _ctrl(1, {"sampler": "paper", "tau": 0.1}, n_train=2)
    ctrl.observe([Group(_prompts(2)[1], tuple(_rollout("p1", 0.0) for _ in range(98)))], RunState())
    counts = Counter(ctrl.select(RunState())[0].id for _ in range(2000))
    assert counts["p0"] / 2000 == pytest.approx(0.982, abs=0.015)
    code = _ctrl(1, {"sampler": "code"}, n_train=2)  # the released tau: almost a coin flip
    code.observe([Group(_prompts(2)[1], tuple(_rollout("p1", 0.0) for _ in range(98)))], RunState())
    counts = Counter(code.select(RunState())[0].id for _ in range(2000))
    assert counts["p0"] / 2000 == pytest.approx(0.5, abs=0.04)


def test_select_draws_distinct_prompts():
    ctrl = _ctrl(5, n_train=6)
    for _ in range(20):
        ids = [p.id for p in ctrl.select(RunState())]
        assert len(ids) == len(set(ids)) == 5
    small = _ctrl(5, n_train=3)
    assert sorted(p.id for p in small.select(RunState())) == ["p0", "p1", "p2"]


def test_state_round_trip_gives_the_same_future():
    def reward_of(p, j):
        return (j * 5 + int(p.id[1:])) % 3 == 0

    a = _ctrl(3, {"sampler": "paper"}, budget_rollouts=20)
    for step in range(3):
        _step(a, reward_of, RunState(step=step))
    b = _ctrl(3, {"sampler": "paper"}, budget_rollouts=20)
    b.load_state_dict(a.state_dict())
    assert b.counts == a.counts
    for step in range(3, 7):
        pa, ga, sa = _step(a, reward_of, RunState(step=step))
        pb, gb, sb = _step(b, reward_of, RunState(step=step))
        assert [p.id for p in pa] == [p.id for p in pb] and sa == sb
        assert [(g.prompt.id, g.size) for g in ga] == [(g.prompt.id, g.size) for g in gb]


def test_registry_and_options():
    assert REGISTRY.get("cures") is CurES
    with pytest.raises(UserError, match="sampler"):
        load_config(overrides=['control.name="cures"', 'control.options={sampler = "nope"}'])
    for name, info in CuresOptions.model_fields.items():
        assert info.description, name


# ------------------------------------------------------------------ the real loop


def test_loop_runs_with_cures(tmp_path):
    from rollwise.trainer.tiny import char_tokenizer

    tok = char_tokenizer()

    def respond(seq, i):  # calls 0, 2, 4, ... right: every probe of 4 is 2 right / 2 wrong
        a, b = tok.decode(seq, skip_special_tokens=True).rstrip("=").replace("-", "+-").split("+")[:2]
        ans = int(a) + int(b)
        return tok.encode(str(ans if i % 2 == 0 else ans + 1))

    o = tiny_overrides(
        tmp_path, steps=2, **{"eval.at_start": False, "control.name": "cures", "control.rollouts_per_prompt": 6}
    )
    cfg = load_config(overrides=as_sets(o))
    result = rollwise.train(cfg, backend=ScriptedBackend(respond, eos_id=tok.eos_token_id), log=lambda m: None)
    m = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    # budget 4 x 6 = 24: probe 16, then sigma = 0.5 for all four -> 2 more each
    assert [x["control/budget_used"] for x in m] == [24, 24] and [x["control/rounds"] for x in m] == [2, 2]
    assert all(x["control/rollouts_per_prompt_min"] == x["control/rollouts_per_prompt_max"] == 6 for x in m)
