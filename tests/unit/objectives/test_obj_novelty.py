"""XRPO novelty-aware advantage sharpening (objectives/novelty.py, allocation.md §2.3, §2.6)."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from rollwise.objectives import ADVANTAGES
from rollwise.objectives.advantages import grpo
from rollwise.objectives.novelty import NoveltyOptions, advantage_inputs, novelty, sequence_logprob
from rollwise.types import Rollout, Verdict


def run(rewards, groups, s, **opts):
    return novelty(
        torch.tensor(rewards, dtype=torch.float32),
        torch.tensor(groups),
        NoveltyOptions(**opts),
        seq_logprob=torch.tensor(s, dtype=torch.float32),
    )


def test_hand_worked_example():
    # r = [1, 1, 0, 0]: GRPO (unbiased std sqrt(1/3)) A = [0.866, 0.866, -0.866, -0.866]
    # s = [-1.0, -0.5, -0.5, -0.5]: s_bar = -0.625
    # row 0: eta = exp(-0.375) = 0.68729, lam (1 - eta) = 0.31271 < kappa A = 0.5 * 0.866 = 0.433
    #        -> A+ = 0.866 + 0.3127 = 1.1787
    # row 1: eta = exp(0.125) > 1 -> bonus clamped to 0; rows 2, 3 are wrong -> unchanged
    a = run([1, 1, 0, 0], [0, 0, 0, 0], [-1.0, -0.5, -0.5, -0.5])
    expected = [0.8660 + 1 - math.exp(-0.375), 0.8660, -0.8660, -0.8660]
    assert torch.allclose(a.values, torch.tensor(expected), atol=1e-4)
    assert a.values[0].item() == pytest.approx(1.1787, abs=1e-4)
    assert a.include.all()


def test_bonus_is_capped_at_kappa_times_a():
    # row 0 far below the mean: s = [-5, 0, 0, 0] -> s_bar = -1.25, eta_0 = exp(-3.75) = 0.0235,
    # lam (1 - eta) = 0.9765 > kappa A = 0.433 -> A+ = 1.5 A = 1.299
    a = run([1, 1, 0, 0], [0, 0, 0, 0], [-5.0, 0.0, 0.0, 0.0])
    assert a.values[0].item() == pytest.approx(1.5 * 0.8660, abs=1e-4)
    # kappa = 1: cap = A = 0.866 < 0.9765 -> A+ = 2 A
    b = run([1, 1, 0, 0], [0, 0, 0, 0], [-5.0, 0.0, 0.0, 0.0], kappa=1.0)
    assert b.values[0].item() == pytest.approx(2 * 0.8660, abs=1e-4)


@pytest.mark.parametrize("seed", range(5))
def test_properties_on_random_groups(seed):
    """§2.6: correct with s < s_bar -> A+ in (A, (1+kappa) A]; correct with s >= s_bar, and every
    wrong row, unchanged."""
    g = torch.Generator().manual_seed(seed)
    rewards = (torch.rand(24, generator=g) < 0.5).float()
    groups = torch.randint(0, 4, (24,), generator=g)
    s = -torch.rand(24, generator=g) * 3
    kappa = 0.5
    out = novelty(rewards, groups, NoveltyOptions(kappa=kappa), seq_logprob=s).values
    base = grpo(rewards, groups).values
    for i in range(24):
        same = groups == groups[i]
        s_bar = s[same].mean()
        if base[i] > 0 and s[i] < s_bar:
            assert base[i] < out[i] <= (1 + kappa) * base[i] + 1e-6
        else:
            assert out[i] == base[i]


def test_equal_likelihoods_and_degenerate_groups_change_nothing():
    a = run([1, 0, 1, 0, 1, 1], [0, 0, 0, 0, 1, 1], [-0.7] * 6)
    assert torch.equal(a.values, grpo(torch.tensor([1.0, 0, 1, 0, 1, 1]), torch.tensor([0, 0, 0, 0, 1, 1])).values)
    assert (a.values[4:] == 0).all()  # all-correct group stays at 0 whatever s is
    b = run([1, 1], [0, 0], [-3.0, 0.0])
    assert (b.values == 0).all()


def test_mean_over_correct_rows():
    # r = [1, 1, 0]: A = [0.5774, 0.5774, -1.1547]; s = [-1, -0.5, -3]
    # 'all': s_bar = -1.5 -> no correct row is below it -> unchanged
    # 'correct': s_bar = -0.75 -> row 0: eta = exp(-0.25) = 0.7788, bonus 0.2212 < 0.5 * 0.5774 = 0.2887
    a = run([1, 1, 0], [0, 0, 0], [-1.0, -0.5, -3.0])
    assert torch.allclose(a.values, torch.tensor([0.5774, 0.5774, -1.1547]), atol=1e-4)
    c = run([1, 1, 0], [0, 0, 0], [-1.0, -0.5, -3.0], mean_over="correct")
    assert torch.allclose(c.values, torch.tensor([0.5774 + 1 - math.exp(-0.25), 0.5774, -1.1547]), atol=1e-4)


def test_inputs_and_registration():
    rows = [
        Rollout("p", (1,), (2, 3), (-1.0, -2.0), "stop", 0, "", Verdict(1.0)),
        Rollout("p", (1,), (), (), "stop", 0, "", Verdict(0.0)),
    ]
    assert torch.allclose(sequence_logprob(rows), torch.tensor([-1.5, 0.0]))
    assert set(advantage_inputs(novelty, rows)) == {"seq_logprob"}
    assert advantage_inputs(grpo, rows) == {}
    fn = ADVANTAGES.get("novelty")
    assert fn is novelty and fn.Options is NoveltyOptions
    out = fn(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), fn.Options(), **advantage_inputs(fn, rows))
    assert out.values.shape == (2,)
    with pytest.raises(ValueError, match="seq_logprob"):
        fn(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), fn.Options())
    with pytest.raises(ValueError, match="seq_logprob"):
        fn(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), fn.Options(), seq_logprob=torch.zeros(3))
    with pytest.raises(ValidationError):
        NoveltyOptions(kappa=-1)
    with pytest.raises(ValidationError):
        NoveltyOptions(nope=1)
    for name, info in NoveltyOptions.model_fields.items():
        assert info.description, name
