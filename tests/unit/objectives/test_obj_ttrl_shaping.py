"""ETTRL's entropy-based advantage reshaping and ECHO's hybrid advantage and CA-Clip
(docs/specs/guidance.md §5.2.4, §5.3.8) with the spec's numbers."""

import math

import pytest
import torch

from rollwise.objectives import echo
from rollwise.objectives.echo import EchoAdvantageOptions, ca_clip_eps, echo_advantage, tail_confidence
from rollwise.objectives.ettrl import EttrlOptions, entropy_scale, ettrl
from rollwise.objectives.signals import token_entropy


def t(*x):
    return torch.tensor(x, dtype=torch.float32)


G3 = torch.tensor([0, 0, 0])


# ---------------------------------------------------------------- ETTRL
def test_adv_res_scales_by_relative_entropy():
    assert torch.allclose(entropy_scale(t(0.5, 1.0, 1.5), G3), t(1.5, 1.0, 0.5))
    assert torch.allclose(
        entropy_scale(t(0.2, 0.2, 2.6), G3, clamp=False), t(1.8, 1.8, -0.6), atol=1e-6
    )  # sign flip as written
    assert torch.allclose(entropy_scale(t(0.2, 0.2, 2.6), G3), t(1.8, 1.8, 0.0), atol=1e-6)  # clamped
    assert torch.allclose(entropy_scale(t(0.5, 1.0, 1.5), G3).mean(), t(1.0))  # mean Y = 1
    assert torch.equal(entropy_scale(t(0.0, 0.0), torch.tensor([0, 0])), t(1.0, 1.0))  # H_bar = 0 -> Y = 1


def test_ettrl_res_on_a_group_from_sampler_entropies():
    # r = (1, 0, 1): A = (0.5774, -1.1547, 0.5774); mean entropies (0.5, 1.0, 1.5) -> Y = (1.5, 1, 0.5)
    lps = [(-0.1, -0.1), (-0.2,), (-0.3, -0.3, -0.3)]
    ents = [(0.4, 0.6), (1.0,), (1.5, 1.5, 1.5)]
    a = ettrl(t(1, 0, 1), G3, EttrlOptions(), completion_logprobs=lps, completion_entropies=ents).values
    assert torch.allclose(a, t(0.57735 * 1.5, -1.15470, 0.57735 * 0.5), atol=1e-4)


def test_ettrl_signs_never_flip_with_clamp_and_clip_bounds():
    lps = [(-0.1,), (-0.1,), (-5.0,)]  # surprisal 0.1, 0.1, 5.0: H_bar = 1.733 -> Y_3 < 0 as written
    out = ettrl(t(1, 0, 0), G3, EttrlOptions(entropy="surprisal"), completion_logprobs=lps).values
    base = ettrl(t(1, 0, 0), G3, EttrlOptions(mode="clip", beta=100.0)).values
    assert bool(((out * base) >= 0).all()) and out[2] == 0
    clipped = ettrl(
        t(1, 0, 0, 0, 0, 0, 0, 0, 0, 0), torch.zeros(10, dtype=torch.long), EttrlOptions(mode="clip")
    ).values
    assert float(clipped.abs().max()) == 2.0  # the lone success has A = 2.846 before the clip


def test_sampler_flavour_refuses_missing_entropies():
    with pytest.raises(ValueError, match="row 1"):
        token_entropy("sampler", [(-0.1,), (-0.2,)], [(0.3,), None])


# ---------------------------------------------------------------- ECHO CA-Clip
@pytest.mark.parametrize("c, eps", [(1.0, 0.125), (0.9, 0.1398), (0.5, 0.1821), (0.2, 0.1941), (0.0, 0.1973)])
def test_ca_clip_eps_worked_numbers(c, eps):
    assert abs(float(ca_clip_eps(t(c), 0.05, 0.2, 4.0)) - eps) < 1e-4


def test_tail_confidence_reads_the_last_tokens_of_the_loss_mask():
    conf = t(0.9, 0.1, 0.5, 0.7, 0.0)[None, :]
    mask = t(0, 1, 1, 1, 0)[None, :]  # loss tokens at 1..3; position 4 is padding
    assert torch.allclose(tail_confidence(conf, mask, 2), t(0.6))  # (0.5 + 0.7) / 2
    assert torch.allclose(tail_confidence(conf, mask, 16), t(1.3 / 3))


def test_ca_clip_objective_clips_each_row_at_its_own_eps():
    from rollwise.types import Batch

    # two rows, one loss token each; the old prob of row 0 is 1 (eps 0.125), of row 1 is e^-20 ~ 0 (eps 0.1973)
    old = torch.tensor([[0.0, 0.0], [0.0, -20.0]])
    mask = torch.tensor([[0.0, 1.0], [0.0, 1.0]])
    b = Batch(
        torch.zeros(2, 2, dtype=torch.long),
        torch.ones(2, 2, dtype=torch.bool),
        mask,
        old,
        t(1, 1),
        t(1, 1),
        torch.tensor([0, 1]),
        torch.zeros(2, 2, dtype=torch.long),
        num_loss_tokens=2,
        num_sequences=2,
    )
    new = old + torch.tensor([[0.0, math.log(1.5)], [0.0, math.log(1.5)]])  # ratio 1.5 on both loss tokens
    out = echo.loss(b, new, echo.Options())
    # A = 1, ratio 1.5 clipped to 1 + eps_i: loss = -(1.125 + 1.1973) / 2
    assert abs(float(out.loss) + (1.125 + 1.19732) / 2) < 1e-4
    assert out.metrics["clip_frac_sum"] == 2.0


# ---------------------------------------------------------------- ECHO hybrid advantage
def test_hybrid_multiplier_bounds_and_sign():
    lps = [(-0.1, -2.0, -0.5), (-3.0, -0.01), (-1.0,)]
    ents = [(0.1, 2.0, 0.5), (3.0, 0.0), (1.0,)]
    adv = echo_advantage(t(1, 0, 1), G3, EchoAdvantageOptions(), completion_logprobs=lps, completion_entropies=ents)
    base = adv.values
    tv = adv.token_values
    for i, n in enumerate((3, 2, 1)):
        ratio = tv[i, :n] / base[i]
        assert bool(((ratio >= 0.8 - 1e-6) & (ratio <= 1.2 + 1e-6)).all())  # 1 + a S in [1 - 2a, 1 + 2a]
        assert bool((tv[i, :n] * base[i] > 0).all())  # never flips
        assert bool((tv[i, n:] == 0).all())  # padding
    zero = echo_advantage(t(1, 1, 1), G3, EchoAdvantageOptions(), completion_logprobs=lps, completion_entropies=ents)
    assert torch.equal(zero.token_values, torch.zeros_like(zero.token_values))  # A_grp = 0 -> 0


def test_hybrid_options_refuse_a_sign_flipping_coefficient():
    with pytest.raises(ValueError, match="a \\* s_max"):
        EchoAdvantageOptions(a=0.6)


def test_zscore_over_valid_tokens_only():
    from rollwise.objectives.echo import zscore

    x = torch.tensor([[1.0, 3.0, 99.0]])
    mask = torch.tensor([[True, True, False]])
    # mean 2, unbiased std sqrt(2) over the two valid tokens -> (-0.7071, 0.7071); padding stays 0
    assert torch.allclose(zscore(x, mask), torch.tensor([[-0.70711, 0.70711, 0.0]]), atol=1e-5)
    assert torch.equal(zscore(torch.ones(1, 3), torch.ones(1, 3, dtype=torch.bool)), torch.zeros(1, 3))
