"""POISE's advantage (rollwise.objectives.poise): the cross-rollout baseline by hand, and the
defining property: the policy gradient estimate is unbiased on a bandit whose true gradient is known,
with groups of 4 and of 1, while a baseline taken from the rollout's own states is biased."""

import pytest
import torch

from rollwise.objectives.poise import cross_rollout, poise


def test_advantage_and_cross_rollout_by_hand():
    a = poise(torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0, 0, 1]), value_baseline=torch.tensor([0.25, 0.5, 0.75]))
    assert a.values.tolist() == [0.75, -0.5, 0.25] and a.include.all()
    b = cross_rollout(
        torch.tensor([0.1, 0.2, 0.3, 0.9]), torch.tensor([7, 7, 7, 8]), torch.tensor([0.0, 0.0, 0.0, 0.4])
    )
    assert b.tolist() == pytest.approx([0.2, 0.3, 0.1, 0.4])
    # interleaved groups: 7 = rows 0, 2, 3; 8 = rows 1, 5; 9 = row 4 alone (its state-zero value)
    b = cross_rollout(
        torch.tensor([0.1, 0.2, 0.3, 0.9, 0.5, 0.6]), torch.tensor([7, 8, 7, 7, 9, 8]), torch.full((6,), 0.4)
    )
    assert b.tolist() == pytest.approx([0.3, 0.6, 0.9, 0.1, 0.4, 0.2])
    with pytest.raises(ValueError, match="value_baseline"):
        poise(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), value_baseline=torch.tensor([0.5]))


# A 3-armed bandit, softmax policy with logits theta: J = sum_a pi_a p_a, grad J = pi * (p - J).
THETA = torch.tensor([0.3, -0.2, 0.5])
P = torch.tensor([0.9, 0.2, 0.6])  # success probability of each arm


def grad_estimate(n: int, rounds: int, own: bool, seed: int) -> torch.Tensor:
    """Mean over ``rounds`` groups of n of (1/n) sum_i A_i grad log pi(a_i), with A from poise and the
    value of a rollout = its own reward plus noise (a trajectory probe that has learned the outcome)."""
    g = torch.Generator().manual_seed(seed)
    pi = torch.softmax(THETA, 0)
    arms = torch.multinomial(pi, n * rounds, replacement=True, generator=g)
    rewards = torch.bernoulli(P[arms], generator=g)
    values = rewards + 0.1 * torch.randn(n * rounds, generator=g)  # v(x, tau): depends on the rollout
    groups = torch.arange(rounds).repeat_interleave(n)
    state_zero = torch.full((n * rounds,), 0.55)  # v(x): a fixed prediction, independent of the action
    base = values if own else cross_rollout(values, groups, state_zero)
    adv = poise(rewards, groups, value_baseline=base).values
    score = torch.nn.functional.one_hot(arms, 3).double() - pi.double()  # grad log pi(a) = e_a - pi
    return (adv.double()[:, None] * score).mean(0)


def test_unbiased_on_a_bandit_with_the_cross_rollout_baseline():
    pi = torch.softmax(THETA, 0).double()
    true = pi * (P.double() - (pi * P.double()).sum())
    for n in (4, 1):
        est = grad_estimate(n, rounds=200_000 // n, own=False, seed=n)
        assert torch.allclose(est, true, atol=0.004), (n, est, true)
    leaky = grad_estimate(4, rounds=50_000, own=True, seed=9)  # baseline from the rollout's own states
    assert (leaky - true).abs().max() > 0.03  # the gradient mostly vanishes: biased
