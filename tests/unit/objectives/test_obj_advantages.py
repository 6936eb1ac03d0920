"""Advantage estimators: hand-worked examples and defining properties."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from rollwise.objectives import ADVANTAGES
from rollwise.objectives.advantages import dr_grpo, grpo, median, reinforce_pp_baseline, rloo
from rollwise.objectives.groups import Groups

ALL = ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline", "median"]
PER_GROUP = ["grpo", "dr_grpo", "rloo", "median"]  # reinforce_pp_baseline whitens over the batch


def run(name: str, rewards, groups, **opts):
    fn = ADVANTAGES.get(name)
    return fn(torch.tensor(rewards, dtype=torch.float32), torch.tensor(groups), fn.Options(**opts))


def close(x: torch.Tensor, expected: list[float], tol: float = 1e-4) -> bool:
    return torch.allclose(x, torch.tensor(expected, dtype=x.dtype), atol=tol, rtol=tol)


# ---------------------------------------------------------------------------- hand-worked examples


def test_grpo_example_unbiased_and_population():
    # r = [1, 0, 0, 1]: mean 0.5; unbiased var = (4 * 0.25) / 3 = 1/3, std 0.57735
    # -> A = +-0.5 / 0.57735 = +-0.8660. Population var = 1/4, std 0.5 -> A = +-1.
    a = run("grpo", [1, 0, 0, 1], [0, 0, 0, 0])
    assert close(a.values, [0.8660, -0.8660, -0.8660, 0.8660])
    assert a.include.all()
    a = run("grpo", [1, 0, 0, 1], [0, 0, 0, 0], std="population")
    assert close(a.values, [1, -1, -1, 1])


def test_grpo_singleton_group_gets_zero():
    # group 4 has one rollout: no baseline from others -> 0 (unbiased std would be NaN).
    a = run("grpo", [1, 0, 1], [3, 3, 4])
    assert close(a.values, [0.7071, -0.7071, 0.0])  # [1,0]: mean .5, std .7071 -> +-.7071
    assert not torch.isnan(a.values).any()


def test_dr_grpo_example():
    # r = [1, 0, 0, 1] -> mean 0.5 -> A = r - 0.5; binary identity: correct 1 - p, wrong -p.
    assert close(run("dr_grpo", [1, 0, 0, 1], [0] * 4).values, [0.5, -0.5, -0.5, 0.5])
    # p = 1/4: correct gets 0.75, wrong -0.25; sum |A| = 2 G p (1-p) = 2*4*3/16 = 1.5
    a = run("dr_grpo", [1, 0, 0, 0], [0] * 4).values
    assert close(a, [0.75, -0.25, -0.25, -0.25]) and math.isclose(a.abs().sum().item(), 1.5, rel_tol=1e-6)


def test_rloo_example():
    # r = [1, 0, 0]: leave-one-out baselines [0, 0.5, 0.5] -> A = [1, -0.5, -0.5]
    assert close(run("rloo", [1, 0, 0], [0, 0, 0]).values, [1, -0.5, -0.5])
    # a singleton group has no other rollout -> 0
    assert close(run("rloo", [1, 0, 5], [0, 0, 1]).values, [1, -1, 0])


def test_reinforce_pp_baseline_example():
    # groups {[1,0]}, {[1,1]} -> centred [0.5, -0.5, 0, 0]; batch mean 0,
    # unbiased batch var = 0.5 / 3 = 1/6 -> A = centred / 0.40825 = [1.2247, -1.2247, 0, 0]
    assert close(run("reinforce_pp_baseline", [1, 0, 1, 1], [0, 0, 1, 1]).values, [1.2247, -1.2247, 0, 0])


def test_median_binary_example():
    # [1, 1, 0]: median 1, |r - m| = [0, 0, 1], MAD = median = 0 -> scale 1/1e-3:
    # A = [0, 0, -1000]; only the wrong rollout is non-zero; pivot = row 0 (first r == m).
    a = run("median", [1, 1, 0], [0, 0, 0])
    assert close(a.values, [0, 0, -1000], tol=1e-3)
    assert a.include.tolist() == [False, True, True]
    a = run("median", [1, 1, 0], [0, 0, 0], scale="none")
    assert close(a.values, [0, 0, -1])


def test_median_vs_mean_three_valued():
    # [2, 1.5, 1.5, 0, 1.5]: mean 1.3 would give the 1.5s +0.2; median 1.5 gives them 0.
    # |r - m| = [.5, 0, 0, 1.5, 0] -> MAD 0 -> A = [.5, 0, 0, -1.5, 0] / 1e-3; pivot row 1.
    a = run("median", [2, 1.5, 1.5, 0, 1.5], [0] * 5)
    assert close(a.values, [500, 0, 0, -1500, 0], tol=1e-3)
    assert a.include.tolist() == [True, False, True, True, True]
    assert (run("dr_grpo", [2, 1.5, 1.5, 0, 1.5], [0] * 5).values[[1, 2, 4]] > 0).all()


def test_median_outlier_and_mad_scale():
    # [1, 1, 1, 1, 100]: mean 20.8 flips the four 1s negative; median 1 leaves them at 0.
    a = run("median", [1, 1, 1, 1, 100], [0] * 5, scale="none")
    assert close(a.values, [0, 0, 0, 0, 99])
    # [0, 1, 3]: median 1, |r - m| = [1, 0, 2], MAD 1 -> A = [-1, 0, 2] / 1.001
    a = run("median", [0, 1, 3], [0] * 3)
    assert close(a.values, [-1 / 1.001, 0, 2 / 1.001])
    # even size: lower median of [0, 1, 2, 3] is 1 (torch.median's convention)
    assert close(run("median", [3, 0, 2, 1], [0] * 4, scale="none").values, [2, -1, 1, 0])


# ---------------------------------------------------------------------------- properties


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("value", [0.0, 1.0, 0.7, -2.3])
def test_all_equal_rewards_give_zero(name, value):
    # 0.7 * 3 / 3 != 0.7 in float32; estimators must still return exactly 0, not round-off / eps.
    a = run(name, [value] * 3 + [0.1] * 5, [2, 2, 2, 8, 8, 8, 8, 8])
    assert torch.equal(a.values, torch.zeros(8))


def test_median_one_pivot_per_group_with_zero_advantage_and_sign():
    r = torch.tensor([0.0, 2.0, 1.0, 5.0, 5.0, 3.0, 1.0, 0.5, 4.0])
    g = torch.tensor([9, 2, 9, 2, 7, 9, 2, 7, 7])
    a = median(r, g, median.Options())
    pivots = g[~a.include]
    assert sorted(pivots.tolist()) == [2, 7, 9]  # exactly one per group
    assert (a.values[~a.include] == 0).all()
    m = Groups.of(g).lower_median(r)
    assert torch.equal(torch.sign(a.values), torch.sign(r - m))


@pytest.mark.parametrize("name", PER_GROUP)
def test_ragged_unsorted_groups_match_each_group_alone(name):
    # groups of sizes 3, 1, 4, 2 with ids that are neither contiguous nor sorted
    r = [1.0, 0.0, 0.5, 1.0, 2.0, 0.0, 1.0, 0.0, 1.0, 0.25]
    g = [40, 7, 40, 3, 7, 40, 7, 7, 11, 11]
    full = run(name, r, g)
    for gid in set(g):
        rows = [i for i, x in enumerate(g) if x == gid]
        alone = run(name, [r[i] for i in rows], [0] * len(rows))
        assert torch.allclose(full.values[rows], alone.values, atol=1e-5)
        assert torch.equal(full.include[rows], alone.include)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.sampled_from([0.0, 0.5, 1.0, 2.0])), min_size=1, max_size=16), st.randoms()
)
def test_estimators_are_permutation_equivariant(rows, rnd):
    g = [x for x, _ in rows]
    r = [x for _, x in rows]
    perm = list(range(len(rows)))
    rnd.shuffle(perm)
    for name in ALL:
        a = run(name, r, g)
        b = run(name, [r[i] for i in perm], [g[i] for i in perm])
        assert torch.isfinite(a.values).all()
        assert torch.allclose(a.values[perm], b.values, atol=1e-4)
        if name != "median":  # pivot choice is by row order among ties, not permutation-equivariant
            assert torch.equal(a.include[perm], b.include)
        else:
            assert (~a.include).sum() == (~b.include).sum() == len(set(g))


def test_options_are_strict_and_inputs_checked():
    with pytest.raises(ValidationError):
        grpo.Options(epsilon=1.0)
    with pytest.raises(ValidationError):
        grpo.Options(std="sample")
    with pytest.raises(ValueError, match="NaN"):
        dr_grpo(torch.tensor([1.0, float("nan")]), torch.tensor([0, 0]), dr_grpo.Options())
    with pytest.raises(ValueError, match=r"\(B,\)"):
        rloo(torch.zeros(2, 2), torch.zeros(2, 2, dtype=torch.long), rloo.Options())
    # the default options may be omitted
    assert torch.equal(reinforce_pp_baseline(torch.ones(3), torch.zeros(3, dtype=torch.long)).values, torch.zeros(3))


def test_every_option_field_has_a_description():
    for name in ALL:
        for field, info in ADVANTAGES.get(name).Options.model_fields.items():
            assert info.description, (name, field)
