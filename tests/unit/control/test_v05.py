"""V0.5 (allocation.md §11): fused baseline, z-test escalation, priors; worked by hand."""

from __future__ import annotations

import random

import pytest
import torch

from rollwise.config import load_config
from rollwise.control.v05 import V05, Options, rejects, z_statistic
from rollwise.objectives.inputs import advantage_context
from rollwise.objectives.v05 import V05Options, fuse, v05
from rollwise.registry import UserError
from rollwise.types import Group, Prompt, Rollout, RunState, Verdict

T = torch.tensor


def test_fuse_worked_example_and_properties():
    # v 0.5, r_bar 1, n 4: s2/n = 0.0625, b2 = 0.25 - 0.0625 = 0.1875 -> w = 0.25 -> b = 0.875
    b, w = fuse(T([0.5]), T([1.0]), T([4.0]))
    assert w.item() == pytest.approx(0.25) and b.item() == pytest.approx(0.875)
    # r_bar = v -> w = 1, b = v
    b, w = fuse(T([0.3]), T([0.3]), T([4.0]))
    assert w.item() == 1.0 and b.item() == pytest.approx(0.3)
    # w in [0, 1] and non-increasing in |r_bar - v| at fixed n
    rbar = torch.linspace(0.3, 1.0, 15)
    _, w = fuse(torch.full_like(rbar, 0.3), rbar, torch.full_like(rbar, 8.0))
    assert ((w >= 0) & (w <= 1)).all() and (w[1:] <= w[:-1] + 1e-7).all()
    assert w[-1] < 0.2


def test_fused_mse_beats_or_matches_prior_and_mean_on_average():
    # simulation: true p, biased prior v = p + bias, n = 4 Bernoulli draws; averaged over p and bias
    rng = random.Random(0)
    err = {"fused": 0.0, "prior": 0.0, "mean": 0.0}
    for _ in range(4000):
        p = rng.uniform(0.05, 0.95)
        v = min(max(p + rng.choice([0.0, 0.05, -0.05, 0.3, -0.3]), 0.01), 0.99)
        rbar = sum(rng.random() < p for _ in range(4)) / 4
        b, _ = fuse(T([v]), T([rbar]), T([4.0]))
        err["fused"] += (b.item() - p) ** 2
        err["prior"] += (v - p) ** 2
        err["mean"] += (rbar - p) ** 2
    assert err["fused"] <= min(err["prior"], err["mean"]) * 1.05


def test_v05_advantage_uses_the_fused_baseline():
    # group 0: r = [1, 1, 1, 1], v = 0.8: s2/n = 0.04, (0.2)^2 - 0.04 = 0 -> w = 1, b = 0.8 -> A = 0.2 each
    # group 1: r = [1, 0], v = 0.5: r_bar = v -> b = 0.5 -> A = [0.5, -0.5]
    out = v05(T([1.0, 1, 1, 1, 1, 0]), T([0, 0, 0, 0, 1, 1]), V05Options(), value_prior=T([0.8] * 4 + [0.5] * 2))
    assert out.values.tolist() == pytest.approx([0.2] * 4 + [0.5, -0.5])
    with pytest.raises(ValueError, match="value_prior"):
        v05(T([1.0]), T([0]))


def test_z_test():
    assert z_statistic(1.0, 0.5, 4) == pytest.approx(2.0) and rejects(1.0, 0.5, 4, 0.05)  # |z| 2 > 1.96
    assert not rejects(0.75, 0.5, 4, 0.05)  # z = 1
    assert rejects(0.5, 1.0, 4, 0.05) and not rejects(1.0, 1.0, 4, 0.05)  # degenerate priors
    # the test fires more often as |p - v| grows (simulation, n = 8, v = 0.5)
    rng = random.Random(1)
    rate = []
    for p in (0.5, 0.7, 0.9):
        rate.append(sum(rejects(sum(rng.random() < p for _ in range(8)) / 8, 0.5, 8, 0.05) for _ in range(2000)) / 2000)
    assert rate[0] < rate[1] < rate[2] and rate[0] < 0.1


def _controller(prompts, **opts):
    cfg = load_config(
        overrides=[
            "control.name=v05",
            "advantage.name=v05",
            "control.rollouts_per_prompt=4",
            f"control.prompts_per_step={len(prompts)}",
        ]
    ).control
    return V05(prompts, cfg, Options(**opts), seed=0)


def _g(p, scores):
    return Group(p, tuple(Rollout(p.id, (1,), (2,), (-0.1,), "stop", 0, "", Verdict(s)) for s in scores))


def test_escalation_rounds_respect_cap_and_budget():
    ps = [Prompt(f"p{i}", "t", "x", "1", metadata={"value_prior": 0.5}) for i in range(3)]
    c = _controller(ps, prior="metadata", cap=8, delta_n=4, extra_budget=6)
    st = RunState()
    c.plan(ps, st)
    groups = [_g(ps[0], [1, 1, 1, 1]), _g(ps[1], [0, 0, 0, 0]), _g(ps[2], [1, 0, 1, 0])]  # z = +2, -2, 0
    plan = c.next_round(groups, st)
    assert [(r.prompt.id, r.n) for r in plan.requests] == [("p0", 4), ("p1", 2)]  # budget 6: 4 + 2
    assert c.metrics["control/v05_rejected_frac"] == pytest.approx(2 / 3)
    groups = [_g(ps[0], [1] * 8), _g(ps[1], [0] * 6), groups[2]]
    assert not c.next_round(groups, st)  # cap reached / budget spent
    assert c.metrics["control/v05_extra_rollouts"] == 6.0


def test_expected_extra_budget_with_a_true_prior_is_about_alpha():
    # v = p = 0.5, n = 8: P(|z| > 1.96) = P(k in {0, 1, 7, 8}) = 2 * 9 / 256 = 0.0703 per prompt
    rng = random.Random(2)
    ps = [Prompt(f"p{i}", "t", "x", "1", metadata={"value_prior": 0.5}) for i in range(200)]
    cfg = load_config(
        overrides=[
            "control.name=v05",
            "advantage.name=v05",
            "control.rollouts_per_prompt=8",
            "control.prompts_per_step=200",
        ]
    ).control
    c = V05(ps, cfg, Options(prior="metadata", cap=12, delta_n=4), seed=0)
    c.plan(ps, RunState())
    plan = c.next_round([_g(p, [float(rng.random() < 0.5) for _ in range(8)]) for p in ps], RunState())
    assert plan.total == pytest.approx(0.0703 * 200 * 4, rel=0.5)


def test_history_prior_and_input():
    ps = [Prompt("a", "t", "x", "1"), Prompt("b", "t", "x", "1")]
    c = _controller(ps)
    st = RunState()
    c.plan(ps, st)
    assert c._priors == {"a": 0.5, "b": 0.5}  # no data yet
    c.observe([_g(ps[0], [1, 1, 1, 0]), _g(ps[1], [0, 0, 0, 0])], st)
    # global mean 3/8; a: (3 + 4 * 0.375) / (4 + 4) = 0.5625; b: (0 + 1.5) / 8 = 0.1875
    assert c.history_prior("a") == pytest.approx(0.5625) and c.history_prior("b") == pytest.approx(0.1875)

    c.plan(ps, st)
    rows = list(_g(ps[1], [1.0]).rollouts)
    assert advantage_context(v05, rows, None, c).value_prior.tolist() == pytest.approx([0.1875])


def test_bad_input_named_before_training():
    with pytest.raises(UserError, match="value_prior"):
        _controller([Prompt("a", "t", "x", "1")], prior="metadata")
    with pytest.raises(UserError, match="control.name = 'v05'"):
        load_config(overrides=["advantage.name=v05"])


def test_controller_options_are_validated_at_load():
    for name, extra in [
        ("v05", ["advantage.name=v05"]),
        ("adhint", ["advantage.name=adhint"]),
        ("r3l", []),
        ("scope", []),
    ]:
        assert load_config(overrides=[f"control.name={name}", *extra]).control.name == name
        with pytest.raises(UserError, match="bogus"):
            load_config(overrides=[f"control.name={name}", "control.options.bogus=1", *extra])


def test_priors_are_kept_per_plan_and_survive_a_checkpoint():
    """Plans drawn ahead (train.async.max_staleness >= 1): each step tests and fuses the priors of
    the plan it trains, also after a resume between the two."""
    ps = [Prompt(f"p{i}", "t", "x", "1", metadata={"value_prior": v}) for i, v in enumerate((0.0, 1.0, 0.25, 0.75))]
    c = _controller(ps[:2], prior="metadata")
    st = RunState()
    c.plan(ps[:2], st)  # plan 0, trained at step 0
    c.plan(ps[2:], st)  # plan 1, drawn ahead
    g0 = [_g(ps[0], [1, 0, 0, 0]), _g(ps[1], [1, 1, 1, 1])]
    assert [(r.prompt.id, r.n) for r in c.next_round(g0, st).requests] == [("p0", 4)]  # v = 0 rejected by a success
    c.observe(g0, st)
    assert c.priors(list(g0[0].rollouts) + list(g0[1].rollouts)).tolist() == [0.0] * 4 + [1.0] * 4
    saved = c.state_dict()
    c2 = _controller(ps[:2], prior="metadata")
    c2.load_state_dict(saved)
    for ctrl in (c, c2):
        st1 = RunState(step=1, policy_version=1)
        ctrl.plan(ps[:2], st1)  # plan 2, drawn ahead; step 1 trains plan 1
        assert ctrl.metrics["control/v05_prior_mean"] == pytest.approx(0.5)  # plan 1's (0.25, 0.75)
        g1 = [_g(ps[2], [0, 0, 0, 0]), _g(ps[3], [1, 1, 1, 1])]
        assert not ctrl.next_round(g1, st1)  # |z| = 1.15 and 1.15: neither rejected
        ctrl.observe(g1, st1)
        assert ctrl.priors(list(g1[0].rollouts) + list(g1[1].rollouts)).tolist() == [0.25] * 4 + [0.75] * 4
        with pytest.raises(ValueError, match="no V0.5 prior"):  # plan 0's prompts are not this step's
            ctrl.priors(list(g0[0].rollouts))


def test_dynamic_sampling_is_refused_at_load():
    with pytest.raises(UserError, match="control.dynamic_sampling.enabled"):
        load_config(
            overrides=[
                "control.name=v05",
                "advantage.name=v05",
                "control.dynamic_sampling.enabled=true",
                "filter.names=['zero_variance']",
            ]
        )
