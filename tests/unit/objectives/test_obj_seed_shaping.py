"""ACE, uniqueness-aware reweighting and R3L positive amplification (allocation.md §12a, §12b;
guidance.md §7a), with the specs' numbers worked by hand in the comments."""

from __future__ import annotations

import math

import pytest
import torch

from rollwise.objectives import ADVANTAGES
from rollwise.objectives.ace import AceOptions, ace, amplify
from rollwise.objectives.inputs import advantage_inputs
from rollwise.objectives.r3l import R3lOptions, r3l
from rollwise.objectives.uniqueness import UniquenessOptions, shape_clusters, text_clusters, uniqueness, weights
from rollwise.registry import UserError
from rollwise.types import Rollout, Verdict

T = torch.tensor


# ----------------------------------------------------------------------------- ACE


def test_ace_amplifies_only_wrong_rows_by_softplus_of_the_shift():
    # one group r = [1, 0, 0, 1]: GRPO A = [0.866, -0.866, -0.866, 0.866] (unbiased std sqrt(1/3))
    # c = [5, 0, 1, -3]; wrong rows: -0.866 * (1 + softplus(0) = 1 + ln 2) = -1.4665
    #                                -0.866 * (1 + softplus(1) = 1 + 1.31326) = -2.0033
    r, g = T([1.0, 0, 0, 1]), T([0, 0, 0, 0])
    out = ace(r, g, AceOptions(), confidence_shift=T([5.0, 0.0, 1.0, -3.0]))
    a = 0.5 / math.sqrt(1 / 3)
    assert out.values.tolist() == pytest.approx([a, -a * (1 + math.log(2)), -a * (1 + math.log1p(math.e)), a], abs=1e-5)


def test_ace_magnitude_grows_with_confidence_and_never_below_grpo():
    a = T([-1.0, -1.0, -1.0, -1.0, 0.5])
    c = T([-5.0, -1.0, 0.0, 3.0, 10.0])
    for center in (False, True):
        out = amplify(a, c, alpha=1.0, center=center)
        mags = out[:4].abs()
        assert (mags >= 1.0).all()  # |A'| >= |A|
        assert (mags[1:] >= mags[:-1]).all()  # non-decreasing in c
        assert out[4] == 0.5  # positive unchanged
    # centred: a neutral error (c = 0) is not amplified
    assert amplify(T([-1.0]), T([0.0]), 1.0, center=True).item() == pytest.approx(-1.0)


def test_ace_leaves_zero_advantage_groups_at_zero():
    out = ace(T([0.0, 0, 0]), T([1, 1, 1]), AceOptions(alpha=5.0), confidence_shift=T([9.0, 9.0, 9.0]))
    assert out.values.tolist() == [0.0, 0.0, 0.0]


def test_ace_needs_its_input_and_a_reference():
    with pytest.raises(ValueError, match="confidence_shift"):
        ace(T([1.0, 0]), T([0, 0]))
    assert ADVANTAGES.get("ace").needs_reference is True
    with pytest.raises(ValueError, match="needs the run"):
        advantage_inputs(ADVANTAGES.get("ace"), [])


def test_ace_length_normalise_divides_by_completion_length():
    # r = [1, 0]: A = [0.7071, -0.7071]; c = 4 over 4 tokens -> 1 -> -0.7071 * (1 + softplus(1))
    out = ace(
        T([1.0, 0]),
        T([0, 0]),
        AceOptions(length_normalise=True),
        confidence_shift=T([0.0, 4.0]),
        completion_lengths=T([2.0, 4.0]),
    )
    a = 1 / math.sqrt(2)
    assert out.values[1].item() == pytest.approx(-a * (1 + math.log1p(math.e)), abs=1e-5)


# ----------------------------------------------------------------------------- uniqueness


def test_uniqueness_weights_spec_example():
    # correct rows with labels [a, a, b]: sizes [2, 2, 1] -> u = [0.5, 0.5, 1] -> / (2/3) = [0.75, 0.75, 1.5]
    w = weights(T([0, 0, 1]), T([True, True, True]), gamma=1.0)
    assert w.tolist() == pytest.approx([0.75, 0.75, 1.5])
    assert w.mean().item() == pytest.approx(1.0)


def test_uniqueness_reweights_correct_rows_only():
    # r = [1, 1, 1, 0]: mean 0.75, unbiased std 0.5 -> A = [0.5, 0.5, 0.5, -1.5]
    # correct texts "3+4=7" x2 and "7" (another shape) -> weights [0.75, 0.75, 1.5]
    texts = ["3+4=7", "3+4=7", "7", "8"]
    out = uniqueness(T([1.0, 1, 1, 0]), T([0, 0, 0, 0]), UniquenessOptions(), completion_texts=texts)
    assert out.values.tolist() == pytest.approx([0.375, 0.375, 0.75, -1.5], rel=1e-5)  # eps = 1e-6 in the std


def test_uniqueness_one_cluster_recovers_grpo_and_singleton_gets_most():
    grpo = ADVANTAGES.get("grpo")
    r, g = T([1.0, 1, 0, 1, 0, 0]), T([0, 0, 0, 1, 1, 1])
    same = ["12", "12", "x", "5", "y", "z"]
    out = uniqueness(r, g, UniquenessOptions(clusterer="text"), completion_texts=same)
    assert torch.allclose(out.values, grpo(r, g).values)
    out2 = uniqueness(
        T([1.0, 1, 1, 1, 0]),
        T([0] * 5),
        UniquenessOptions(clusterer="text"),
        completion_texts=["a", "a", "a", "b", "c"],
    )
    assert int(out2.values.argmax()) == 3  # the singleton cluster
    # sizes [3, 3, 3, 1] -> u = [1/3 x 3, 1] -> mean 0.5 -> weights [2/3 x 3, 2]
    base = grpo(T([1.0, 1, 1, 1, 0]), T([0] * 5)).values
    assert out2.values.tolist() == pytest.approx((base * T([2 / 3, 2 / 3, 2 / 3, 2.0, 1.0])).tolist())


def test_uniqueness_gamma_zero_is_grpo_and_bad_clusterer_named():
    grpo = ADVANTAGES.get("grpo")
    r, g = T([1.0, 1, 1, 0]), T([0, 0, 0, 0])
    out = uniqueness(r, g, UniquenessOptions(gamma=0.0), completion_texts=["a", "a", "b", "c"])
    assert torch.allclose(out.values, grpo(r, g).values)
    with pytest.raises(UserError, match="known: shape, text"):
        UniquenessOptions(clusterer="judge")


def test_uniqueness_clusterer_failure_keeps_grpo(monkeypatch):
    from rollwise.objectives import uniqueness as mod

    monkeypatch.setitem(mod.CLUSTERERS._entries, "text", lambda texts: None)
    r, g = T([1.0, 1, 1, 0]), T([0, 0, 0, 0])
    out = uniqueness(r, g, UniquenessOptions(clusterer="text"), completion_texts=["a", "a", "b", "c"])
    assert torch.allclose(out.values, ADVANTAGES.get("grpo")(r, g).values)


def test_simple_clusterers():
    assert text_clusters(["12", " 12 ", "13"]) == [0, 0, 1]
    assert shape_clusters(["7+5=12,=12", "1+1=2,=2", "=12"]) == [0, 0, 1]


def test_uniqueness_input_from_rows():
    rows = [Rollout("p", (1,), (2,), (-0.1,), "stop", 0, text="7", verdict=Verdict(1.0))]
    assert advantage_inputs(ADVANTAGES.get("uniqueness"), rows) == {"completion_texts": ["7"]}


# ----------------------------------------------------------------------------- R3L


def test_r3l_positive_amplification_spec_numbers():
    # (1, 1, 0 x 6): mean 0.25 -> maximal rows A = 1, the others 0 - 0.25
    out = r3l(T([1.0, 1, 0, 0, 0, 0, 0, 0]), T([0] * 8))
    assert out.values.tolist() == pytest.approx([1, 1] + [-0.25] * 6)
    # partial reward 0.5 with mean 0.25 -> 3 * 0.25 = 0.75
    out = r3l(T([0.5, 0, 0, 0.5]), T([0, 0, 0, 0]))
    assert out.values.tolist() == pytest.approx([0.75, -0.25, -0.25, 0.75])
    # singleton with r = 1 -> A = 1; singleton r = 0 -> 0
    assert r3l(T([1.0, 0.0]), T([0, 1])).values.tolist() == [1.0, 0.0]


def test_r3l_binary_group_sum_is_g_p_squared():
    # G = 8, p = 2/8: sum A = 2 * 1 + 6 * (-0.25) = 0.5 = G p^2
    out = r3l(T([1.0, 1, 0, 0, 0, 0, 0, 0]), T([0] * 8))
    assert out.values.sum().item() == pytest.approx(8 * 0.25**2)


def test_r3l_paper_rule_sets_maximal_rows_to_alpha():
    out = r3l(T([1.0, 0, 0, 0]), T([0, 0, 0, 0]), R3lOptions(rule="paper"))
    assert out.values.tolist() == pytest.approx([3.0, -0.25, -0.25, -0.25])
