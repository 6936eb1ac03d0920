"""Multi-Adversary GDRO (control/gdro.py) with the spec's worked numbers (guidance.md §1.8)."""

import math
from types import SimpleNamespace

import pytest
import torch

from rollwise.batches import apply_row_weights
from rollwise.control.gdro import (
    GDRO,
    GdroOptions,
    classify,
    code_row_weights,
    ema_update,
    exact_dp,
    exp_weights,
    paper_row_weights,
    raw_bin,
    response_loss,
    sqrt_rule,
)
from rollwise.objectives.advantages import grpo
from rollwise.types import AdvantageInputs, Advantages, Group, Prompt, Rollout, RunState, Services, Verdict

EDGES = [0.1, 0.2, 0.4, 0.6, 0.8, 0.9]


# ---------------------------------------------------------------- classifier
def test_bins_of_the_seven_class_edges():
    assert raw_bin(0.5, EDGES) == 3 and raw_bin(0.95, EDGES) == 6 and raw_bin(0.0, EDGES) == 0


def test_hysteresis_worked_numbers():
    assert classify(0.41, 2, EDGES, 0.03) == 2  # raw 3, but 0.41 < 0.40 + 0.03
    assert classify(0.44, 2, EDGES, 0.03) == 3
    assert classify(0.385, 3, EDGES, 0.03) == 3  # raw 2, but 0.385 > 0.40 - 0.03
    assert classify(0.36, 3, EDGES, 0.03) == 2
    assert classify(0.41, 2, EDGES, 0.0) == 3  # no hysteresis


def cfg(n=4, b=4):
    return SimpleNamespace(
        prompts_per_step=b, rollouts_per_prompt=n, budget_rollouts=None, budget_tokens=None, _max_new_tokens=8
    )


PROMPTS = [Prompt(f"p{i}", "t", str(i), "1") for i in range(8)]


def group(pid, *scores):
    return Group(
        Prompt(pid, "t", pid, "1"), tuple(Rollout(pid, (1,), (2,), (0.0,), "stop", 0, "", Verdict(s)) for s in scores)
    )


def test_window_estimate_and_unseen_prompts():
    c = GDRO(PROMPTS, cfg(), GdroOptions(edges=EDGES, window=50), 0)
    assert c.p_hat("p0") == 0.0 and c.bin_of("p0") == 0  # unseen -> accuracy 0 -> bin 0
    for step, s in enumerate([0.0, 0.0, 1.0, 1.0]):  # indicators [0, 0, 1, 1] -> 0.5
        c.observe([group("p1", s, 0.0)], RunState(step=step))
    assert c.p_hat("p1") == 0.5 and c.bin_of("p1") == 3
    w = GDRO(PROMPTS, cfg(), GdroOptions(edges=EDGES, window=2), 0)
    w.history = c.history
    assert w.p_hat("p1") == 1.0  # the last two indicators only
    x = GDRO(PROMPTS, cfg(), GdroOptions(edges=EDGES, exclude_extremes=True), 0)
    assert x.bin_of("p0") == len(EDGES) + 1  # unseen = p_hat 0 -> the excluded class


# ---------------------------------------------------------------- Prompt-GDRO weights
def test_exp3p_weights_worked_numbers():
    soft = exp_weights([0.5, 0.0, -0.5], 0.65, 0.0)
    assert soft == pytest.approx([0.4455, 0.3219, 0.2326], abs=1e-4)
    q = exp_weights([0.5, 0.0, -0.5], 0.65, 0.01)
    assert q == pytest.approx([0.4444, 0.3220, 0.2336], abs=1e-4) and sum(q) == pytest.approx(1) and min(q) >= 0.01 / 3
    w = code_row_weights([0, 0, 1, 2], {0: 0.5, 1: 0.0, 2: -0.5}, 0.65, 0.01, 15.0)
    assert w == pytest.approx([1.2307, 1.2307, 0.8918, 0.6469], abs=1e-3) and sum(w) / 4 == pytest.approx(1)
    assert paper_row_weights([0, 1, 2], {0: 0.5, 1: 0.0, 2: -0.5}, 0.65, 3.0, 15.0) == pytest.approx(
        [1.384, 1.0, 0.7225], abs=1e-3
    )


def test_equal_scores_or_full_exploration_recover_grpo():
    assert code_row_weights([0, 1, 1, 2], {0: 0.3, 1: 0.3, 2: 0.3}, 0.65, 0.01, 15.0) == pytest.approx([1.0] * 4)
    assert code_row_weights([0, 1, 1, 2], {0: 2.0, 1: 0.0, 2: -1.0}, 0.65, 1.0, 15.0) == pytest.approx([1.0] * 4)


def test_weights_are_capped():
    w = code_row_weights([0] + [1] * 99, {0: 10.0, 1: 0.0}, 0.65, 0.0, 15.0)
    assert max(w) == 15.0


def test_ema_update_worked_numbers():
    assert ema_update(0.0, 0.03 / 0.1, 0.12) == pytest.approx(0.036)  # l 0.03, share 0.1 -> l~ 0.3 -> S 0.036
    assert ema_update(None, 0.3, 0.12) == 0.3  # first observation


def test_score_update_leaves_absent_bins_alone():
    c = GDRO(PROMPTS, cfg(), GdroOptions(), 0)
    c.scores = {0: 0.0, 5: 1.0}
    c.update_scores({0: 0.03}, {0: 0.1})
    assert c.scores == pytest.approx({0: 0.036, 5: 1.0})
    c.update_scores({7: 0.02}, {7: 0.5})
    assert c.scores[7] == pytest.approx(0.04)  # first observation of bin 7: S = 0.02 / 0.5


def test_weigh_advantages_multiplies_rows_and_tokens():
    c = GDRO(PROMPTS, cfg(), GdroOptions(edges=EDGES), 0)
    c.scores = {0: 0.5, 1: 0.0, 2: -0.5}
    c.ctx["bins"] = {"a": 0, "b": 1, "c": 2}
    rows = [group(p, 1.0).rollouts[0] for p in "aabc"]
    advs = Advantages(torch.ones(4), torch.ones(4, dtype=torch.bool), token_values=torch.ones(4, 2))
    out = apply_row_weights(advs, c.advantage_inputs(rows).weights)
    assert out.values.tolist() == pytest.approx([1.2307, 1.2307, 0.8918, 0.6469], abs=1e-3)
    assert torch.allclose(out.token_values[:, 1], out.values)
    off = GDRO(PROMPTS, cfg(), GdroOptions(prompt_gdro=False, rollout_gdro=True), 0)
    assert off.advantage_inputs(rows) == AdvantageInputs()


# ---------------------------------------------------------------- loss identity
def test_on_policy_surrogate_loss_is_zero_per_group_and_positive_when_winners_lose_mass():
    rewards, g = torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.zeros(4, dtype=torch.long)
    adv = grpo(rewards, g).values
    old = torch.full((4, 3), -1.0)
    mask = torch.tensor([[1.0, 1.0, 0.0]] * 4)
    on_policy = response_loss(old.clone(), old, adv, mask, 0.2, 0.28)
    assert torch.allclose(on_policy, -adv) and abs(float(on_policy.sum())) < 1e-6
    new = old.clone()
    new[[0, 3]] -= 0.1  # the positive-advantage responses got less likely: ratio 0.905 (inside the clip)
    assert float(response_loss(new, old, adv, mask, 0.2, 0.28).sum()) > 0
    ref = old - 0.5  # the KL term adds a positive amount
    assert float(response_loss(old, old, adv, mask, 0.2, 0.28, ref, 0.001).sum()) > 0


# ---------------------------------------------------------------- square-root law
def test_square_root_law_worked_numbers():
    q, v = [0.5, 0.3, 0.2], [0.01, 0.25, 0.16]
    n = sqrt_rule(q, v, 4)
    assert n == pytest.approx([1.4286, 7.1429, 5.7143], abs=1e-4) and sum(a * b for a, b in zip(q, n)) == pytest.approx(
        4
    )
    uniform = sum(a * b / 4 for a, b in zip(q, v))
    optimal = sum(a * b / m for a, b, m in zip(q, v, n))
    assert uniform == pytest.approx(0.028) and optimal == pytest.approx(0.0196)
    mu = (sum(a * math.sqrt(b) for a, b in zip(q, v)) / 4) ** 2
    assert mu == pytest.approx(0.0049) and [math.sqrt(b / mu) for b in v] == pytest.approx(n, abs=1e-4)
    assert sqrt_rule(q, [0.2] * 3, 4) == pytest.approx([4, 4, 4])


# ---------------------------------------------------------------- budget
def test_exact_dp_meets_the_budget():
    arms = list(range(2, 13))
    lp = [[math.log(1 / 11)] * 11] * 3
    a = exact_dp([2, 1, 1], lp, arms, 16)  # counts {A: 2, B: 1, C: 1}, n_bar 4
    assert 2 * a[0] + a[1] + a[2] == 16
    peaked = [[0.0 if x == 6 else -5.0 for x in arms], [0.0 if x == 2 else -5.0 for x in arms], [-1.0] * 11]
    a = exact_dp([2, 1, 1], peaked, arms, 16)
    assert a[0] == 6 and a[1] == 2 and 2 * a[0] + a[1] + a[2] == 16


@pytest.mark.parametrize("allocation", ["exact", "sqrt"])
def test_allocations_keep_the_mean_budget_and_bounds(allocation):
    c = GDRO(
        PROMPTS, cfg(n=4, b=8), GdroOptions(edges=EDGES, rollout_gdro=True, allocation=allocation, hysteresis=0.0), 0
    )
    for step in range(3):  # give prompts different accuracies
        c.observe([group(f"p{i}", float(i % 3 == 0 or step < i % 4), 0.0) for i in range(8)], RunState(step=step))
    c.arm_scores = {b: [0.3 * j * (-1) ** b for j in range(11)] for b in range(7)}
    plan = c.plan(PROMPTS, RunState())
    sizes = [r.n for r in plan.requests]
    assert sum(sizes) == 8 * 4 and all(2 <= k <= 12 for k in sizes)


def test_dual_step_exact_keeps_mu_and_soft_moves_it():
    exact = GDRO(PROMPTS, cfg(n=4, b=4), GdroOptions(rollout_gdro=True), 0)
    exact.plan(PROMPTS[:4], RunState())
    exact.update_arms({b: 0.1 for b in exact.ctx["arms"]})
    assert exact.mu == 0.0  # realised mean = n_bar exactly
    soft = GDRO(PROMPTS, cfg(n=4, b=4), GdroOptions(rollout_gdro=True, allocation="soft"), 0)
    soft.ctx = {"bins": {}, "arms": {0: 10}, "n": {p.id: 10 for p in PROMPTS[:4]}}
    soft.update_arms({0: 0.1})
    assert soft.mu == pytest.approx(0.05 * 6)  # realised 10 > 4: mu rises
    soft.ctx["n"] = {p.id: 2 for p in PROMPTS[:4]}
    for _ in range(20):
        soft.update_arms({0: 0.1})
    assert soft.mu == 0.0  # never negative


def test_arm_scores_change_after_a_step():
    # the released code's dead update (§1.4.5 defect 1) would leave them at 0
    for rule in ("paper", "code"):
        c = GDRO(PROMPTS, cfg(n=4, b=4), GdroOptions(rollout_gdro=True, arm_update=rule), 0)
        c.plan(PROMPTS[:4], RunState())
        c.update_arms({b: 0.2 for b in c.ctx["arms"]})
        assert any(x != 0 for s in c.arm_scores.values() for x in s)
    paper = GDRO(PROMPTS, cfg(n=4, b=4), GdroOptions(rollout_gdro=True), 0)
    paper.ctx = {"bins": {}, "arms": {0: 4}, "n": {"p0": 4}}
    paper.update_arms({0: 0.2})  # L = 0.2 + mu 4 = 0.2; p(4) = 1/11 -> s(4) = -2.2
    assert paper.arm_scores[0][2] == pytest.approx(-0.2 * 11)
    code = GDRO(PROMPTS, cfg(n=4, b=4), GdroOptions(rollout_gdro=True, arm_update="code"), 0)
    code.ctx = {"bins": {}, "arms": {0: 4}, "n": {"p0": 4}}
    code.update_arms({0: 0.2})  # s += loss - mu (n - n_bar) = 0.2
    assert code.arm_scores[0][2] == pytest.approx(0.2)


def test_rollouts_per_prompt_must_be_an_arm():
    from rollwise.registry import UserError

    with pytest.raises(UserError, match="n_min, n_max"):
        GDRO(PROMPTS, cfg(n=20), GdroOptions(rollout_gdro=True), 0)
    with pytest.raises(ValueError, match="at least one"):
        GdroOptions(prompt_gdro=False)


def test_state_round_trip():
    o = GdroOptions(edges=EDGES, rollout_gdro=True, allocation="soft")
    c = GDRO(PROMPTS, cfg(), o, 0)
    for step in range(2):
        c.plan(c.select(RunState(step=step)), RunState(step=step))
        c.observe([group(f"p{i}", float(i % 2), 1.0) for i in range(4)], RunState(step=step))
        c.update_scores({0: 0.1, 3: -0.05}, {0: 0.5, 3: 0.5})
        c.update_arms({b: 0.1 for b in c.ctx["arms"]})
    d = GDRO(PROMPTS, cfg(), o, 0)
    d.load_state_dict(c.state_dict())
    for x in (c, d):
        ps = x.select(RunState(step=2))
        x.plan(ps, RunState(step=2))
    assert d.ctx == c.ctx and d.scores == c.scores and d.arm_scores == c.arm_scores and d.mu == c.mu
    assert d.prev_bin == c.prev_bin


def test_after_update_scores_bins_from_per_response_losses():
    """A fake uniform policy over V = 4 tokens equals the sampler (old log-prob -log 4), so the ratio
    is 1 and l_i = -A_i (unweighted). Rows: bin 0 with A = (1, -1), bin 1 with A = 0.5, and an
    excluded row without loss tokens. Bin means 0 and -0.5, shares 2/3 and 1/3 -> S = (0, -1.5)."""
    from rollwise.types import Batch

    class Uniform(torch.nn.Module):
        def forward(self, input_ids, attention_mask):
            return SimpleNamespace(logits=torch.zeros(*input_ids.shape, 4))

    b, t = 4, 3
    mask = torch.tensor([[0.0, 1.0, 1.0]] * 3 + [[0.0, 0.0, 0.0]])
    batch = Batch(
        torch.zeros(b, t, dtype=torch.long),
        torch.ones(b, t, dtype=torch.bool),
        mask,
        -math.log(4) * mask,
        torch.tensor([1.0, -1.0, 0.5, 9.0]),
        torch.zeros(b),
        torch.arange(b),
        torch.zeros(b, t, dtype=torch.long),
        num_loss_tokens=6,
        num_sequences=3,
    )
    trainer = SimpleNamespace(
        model=Uniform(), temperature=1.0, ref_model=None, micro_batches=lambda bt: [(slice(0, b), bt)]
    )
    c = GDRO(PROMPTS, cfg(), GdroOptions(edges=EDGES), 0)
    c.ctx["bins"] = {"a": 0, "b": 1, "x": 2}
    rows = [group(p, 1.0).rollouts[0] for p in "aabx"]
    c.bind(Services(trainer=trainer))
    c.after_update(batch, rows, {}, Advantages(batch.advantages.clone(), torch.ones(b, dtype=torch.bool)))
    assert torch.equal(c.raw_adv, batch.advantages)  # the loss signal uses the unweighted advantages
    assert c.scores == pytest.approx({0: 0.0, 1: -1.5})  # bin 2's row had no loss tokens: not scored
    assert c.metrics["control/gdro_loss_mean"] == pytest.approx(-0.5 / 3)
