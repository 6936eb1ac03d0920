"""GDPO and its GRPO-on-the-sum baseline (docs/specs/guidance.md §3.6), with the spec's numbers."""

import pytest
import torch

from rollwise.objectives.gdpo import Condition, GdpoOptions, batch_normalise, condition, gdpo, grpo_sum

S = 0.5**0.5  # 0.7071: (1 - 0.5) / unbiased std of (0, 1) = 0.5 / 0.7071


def t(*x):
    return torch.tensor(x, dtype=torch.float32)


def run(fn, named, gidx, **opts):
    n = len(gidx)
    return fn(
        torch.zeros(n), torch.tensor(gidx), GdpoOptions(**opts), named_rewards={k: t(*v) for k, v in named.items()}
    ).values


def test_grpo_on_sums_collapses_distinct_combinations():
    # totals (0, 1): r1 = (0, 1), r2 = (0, 0); totals (0, 2): r1 = r2 = (0, 1) -> both -> (-0.7071, 0.7071)
    a = run(grpo_sum, {"a": [0, 1], "b": [0, 0]}, [0, 0])
    b = run(grpo_sum, {"a": [0, 1], "b": [0, 1]}, [0, 0])
    assert torch.allclose(a, t(-S, S), atol=1e-5) and torch.allclose(b, t(-S, S), atol=1e-5)


def test_gdpo_keeps_them_apart_before_batch_norm():
    a = run(gdpo, {"a": [0, 1], "b": [0, 0]}, [0, 0], batch_norm=False)
    b = run(gdpo, {"a": [0, 1], "b": [0, 1]}, [0, 0], batch_norm=False)
    assert torch.allclose(a, t(-S, S), atol=1e-5)
    assert torch.allclose(b, t(-2 * S, 2 * S), atol=1e-5)  # (-1.4142, 1.4142)


def test_complementary_rewards_cancel_with_equal_weights_only():
    # spec [DERIVED]: r1 = (1, 1, 0), r2 = (0, 0, 1): totals (1, 1, 1) -> GDPO sum exactly 0 with w = 1
    named = {"a": [1, 1, 0], "b": [0, 0, 1]}
    assert torch.allclose(run(gdpo, named, [0, 0, 0], batch_norm=False), torch.zeros(3), atol=1e-6)
    assert torch.equal(run(gdpo, named, [0, 0, 0]), torch.zeros(3))  # batch norm does not blow up the fp32 residue
    # w_a = 2: A_a = (0.5774, 0.5774, -1.1547) (mean 2/3, unbiased std 0.5774) -> sum = A_a (2 - 1)
    out = run(gdpo, named, [0, 0, 0], batch_norm=False, weights={"a": 2.0})
    assert torch.allclose(out, t(0.57735, 0.57735, -1.15470), atol=1e-4)


def test_constant_component_contributes_exactly_zero():
    # seven copies of 0.7 would leave a float residue / (0 + eps) without the exact-zero rule
    named = {"a": [0.7] * 7 + [1, 0], "b": [0.7] * 7 + [1, 1]}
    out = run(gdpo, named, [0] * 7 + [1, 1], batch_norm=False)
    assert torch.equal(out[:7], torch.zeros(7))
    assert torch.allclose(out[7:], t(S, -S), atol=1e-5)  # only 'a' varies in group 1; 'b' is constant there


def test_single_reward_is_grpo_up_to_a_positive_scale():
    r = [1, 0, 0, 1, 1, 0]
    g = [0, 0, 0, 1, 1, 1]
    base = run(grpo_sum, {"c": r}, g)
    out = run(gdpo, {"c": r}, g)
    ratio = out / base
    assert torch.allclose(ratio, ratio[0].expand(6), atol=1e-5) and ratio[0] > 0


def test_batch_normalised_mean_zero_std_one():
    out = run(gdpo, {"a": [1, 0, 0, 1, 1, 0], "b": [1, 1, 0, 0, 0, 0]}, [0, 0, 0, 1, 1, 1])
    assert abs(float(out.mean())) < 1e-6 and abs(float(out.std()) - 1) < 1e-4


def test_doubling_a_weight_doubles_its_contribution():
    named = {"a": [0, 1, 1], "b": [1, 0, 0]}
    # b = -a exactly here, so sum = (w_a - w_b) A_a: w_a = 1 -> 0; w_a = 2 -> A_a; w_a = 3 -> 2 A_a
    a1 = run(gdpo, named, [0, 0, 0], batch_norm=False, weights={"a": 2.0})
    a2 = run(gdpo, named, [0, 0, 0], batch_norm=False, weights={"a": 3.0})
    assert torch.allclose(a2, 2 * a1, atol=1e-5) and not torch.equal(a1, torch.zeros(3))


def test_conditioned_reward_is_zero_when_not_correct():
    got = condition({"correct": t(1, 0, 1), "length": t(1, 1, 0)}, {"length": Condition(on="correct")})
    assert torch.equal(got["length"], t(1, 0, 0)) and torch.equal(got["correct"], t(1, 0, 1))
    out = run(
        gdpo, {"correct": [0, 0], "length": [1, 0]}, [0, 0], batch_norm=False, conditions={"length": {"on": "correct"}}
    )
    assert torch.equal(out, torch.zeros(2))  # conditioned length is 0 on both rows: no signal left


def test_all_zero_groups_give_zero_without_nan():
    out = run(gdpo, {"a": [0, 0, 0, 0], "b": [0, 0, 0, 0]}, [0, 0, 1, 1])
    assert torch.equal(out, torch.zeros(4))
    assert torch.equal(batch_normalise(t(3.0), 1e-6), t(0.0))


def test_bad_input_names_the_problem():
    with pytest.raises(ValueError, match="named rewards"):
        gdpo(torch.zeros(2), torch.tensor([0, 0]), GdpoOptions(), named_rewards=None)
    with pytest.raises(ValueError, match="'nope'"):
        run(gdpo, {"a": [0, 1]}, [0, 0], weights={"nope": 1.0})
    with pytest.raises(ValueError, match="'correct'"):
        run(gdpo, {"a": [0, 1]}, [0, 0], conditions={"a": {"on": "correct"}})
