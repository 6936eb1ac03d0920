"""Objectives: hand-worked losses and defining properties (ratio 1 = policy gradient, reductions)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from objtest_utils import make_batch, place
from pydantic import ValidationError

from rollwise.objectives import OBJECTIVES
from rollwise.objectives.common import aggregate, behaviour_weight, kl_penalty

NAMES = ["grpo", "dapo", "gspo", "cispo", "decoupled_ppo", "echo"]
MODES = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]


def opts(name: str, **kw):
    if kw.get("aggregation") == "seq_mean_token_sum_norm":
        kw.setdefault("norm_constant", 4.0)
    return OBJECTIVES.get(name).Options(**kw)


def loss_and_grad(name, batch, new, o, entropy=None):
    new = new.detach().clone().requires_grad_(True)
    out = OBJECTIVES.get(name)(batch, new, o, entropy)
    out.loss.backward()
    return out, new.grad


def two_rows():
    # row 0: prompt 1 + 2 loss tokens, A = +1; row 1: prompt 2 + 1 loss token, A = -1
    return make_batch([1, 2], [2, 1], [1.0, -1.0])


# ---------------------------------------------------------------------------- hand-worked examples


def test_grpo_hand_example():
    # ratios: row 0 [1.5, 0.5] (A=+1), row 1 [1.5] (A=-1); clip to [0.8, 1.2].
    # row 0 t0: max(-1.5, -1.2) = -1.2 (clipped);  t1: max(-0.5, -0.8) = -0.5
    # row 1 t0: max(+1.5, +1.2) = +1.5 (unclipped: pessimistic bound for A < 0)
    # seq_mean_token_mean = ((-1.2 - 0.5)/2 + 1.5) / 2 = 0.325;  token_mean = (-1.2-0.5+1.5)/3
    b = two_rows()
    new = b.old_logprobs + place(b, [[math.log(1.5), math.log(0.5)], [math.log(1.5)]])
    out = OBJECTIVES.get("grpo")(b, new, opts("grpo", aggregation="seq_mean_token_mean"))
    assert math.isclose(out.loss.item(), 0.325, rel_tol=1e-9)
    token_mean = OBJECTIVES.get("grpo")(b, new, opts("grpo"))  # the default: token-level
    assert math.isclose(token_mean.loss.item(), -0.2 / 3, rel_tol=1e-9)
    # Dr. GRPO sum-norm with constant 4: (-1.2 - 0.5 + 1.5) / (2 * 4) = -0.025
    o = opts("grpo", aggregation="seq_mean_token_sum_norm", norm_constant=4.0)
    assert math.isclose(OBJECTIVES.get("grpo")(b, new, o).loss.item(), -0.025, rel_tol=1e-9)
    assert out.metrics["clip_frac_sum"] == 1.0
    assert math.isclose(out.metrics["ratio_sum"], 3.5, rel_tol=1e-9)
    assert out.metrics["token_count"] == 3.0


def test_dapo_hand_example_and_clip_higher():
    # same ratios, clip to [0.8, 1.28]: row 0 t0 -> -1.28, t1 -> -0.5; row 1 -> +1.5
    # token_mean = (-1.28 - 0.5 + 1.5) / 3 = -0.09333
    b = two_rows()
    new = b.old_logprobs + place(b, [[math.log(1.5), math.log(0.5)], [math.log(1.5)]])
    assert math.isclose(OBJECTIVES.get("dapo")(b, new, opts("dapo")).loss.item(), -0.28 / 3, rel_tol=1e-9)
    # ratio 1.25 with A > 0: GRPO clips (zero gradient), DAPO's wider upper bound does not;
    # with A < 0 both keep the gradient (the upper bound only matters for A > 0).
    new = b.old_logprobs + math.log(1.25) * b.loss_mask
    _, g_grpo = loss_and_grad("grpo", b, new, opts("grpo", aggregation="token_mean"))
    _, g_dapo = loss_and_grad("dapo", b, new, opts("dapo"))
    assert g_grpo[0].abs().sum() == 0 and g_dapo[0].abs().sum() > 0
    assert torch.allclose(g_grpo[1], g_dapo[1])


def test_gspo_sequence_ratio_is_geometric_mean():
    # row 0 log-ratios [log 2, log 8] -> s = exp(mean) = sqrt(16) = 4; row 1 [log 0.5] -> s = 0.5
    # ratio_sum counts s once per token: 4 * 2 + 0.5 = 8.5
    b = two_rows()
    new = b.old_logprobs + place(b, [[math.log(2), math.log(8)], [math.log(0.5)]])
    out = OBJECTIVES.get("gspo")(b, new, opts("gspo"))
    assert math.isclose(out.metrics["ratio_sum"], 8.5, rel_tol=1e-9)
    # loss = (1/2)[max(-4, -1.0004) + max(0.5, 0.9997)] = (-1.0004 + 0.9997) / 2
    assert math.isclose(out.loss.item(), (-1.0004 + 0.9997) / 2, rel_tol=1e-9)
    assert out.metrics["clip_frac_sum"] == 3.0


def test_cispo_hand_example():
    # row 0 ratios [1.5, 0.5] -> weights clip to [0, 1.28]: [1.28, 0.5]; row 1 [1.5] -> 1.28.
    # loss = -sum_t w A logp / 3 ; d loss / d logp = -w A / 3 = [-1.28, -0.5, +1.28] / 3
    b = two_rows()
    new = b.old_logprobs + place(b, [[math.log(1.5), math.log(0.5)], [math.log(1.5)]])
    out, g = loss_and_grad("cispo", b, new, opts("cispo", eps_high=0.28))
    expected = place(b, [[-1.28 / 3, -0.5 / 3], [1.28 / 3]])
    assert torch.allclose(g, expected)
    assert out.metrics["clip_frac_sum"] == 2.0
    # default cap 1 + 4.0 = 5 (TRL's recommended epsilon_high = 5.0): ratio 1.5 is not clipped, 0.5 neither
    out, g = loss_and_grad("cispo", b, new, opts("cispo"))
    assert torch.allclose(g, place(b, [[-1.5 / 3, -0.5 / 3], [1.5 / 3]]))
    assert out.metrics["clip_frac_sum"] == 0.0


def test_kl_estimators_hand_values_and_zero_at_ref():
    # new = -1, ref = -2: l = ref - new = -1 -> k1 = 1, k2 = 0.5, k3 = e^-1 - 1 + 1 = 0.36788
    new, ref = torch.tensor([-1.0]), torch.tensor([-2.0])
    assert kl_penalty(new, ref, "k1").item() == 1.0
    assert kl_penalty(new, ref, "k2").item() == 0.5
    assert math.isclose(kl_penalty(new, ref, "k3").item(), math.exp(-1), rel_tol=1e-6)
    # k3 == 0 with zero gradient when new == ref, inside an objective with kl_coef > 0
    b = make_batch([1, 2], [2, 1], [0.0, 0.0])
    b = dataclasses.replace(b, ref_logprobs=b.old_logprobs.clone())
    out, g = loss_and_grad("grpo", b, b.old_logprobs, opts("grpo", kl_coef=0.5))
    assert out.metrics["kl_sum"] == 0.0 and out.loss.item() == 0.0 and g.abs().sum() == 0


def test_kl_and_entropy_terms_enter_the_loss():
    # advantages 0 -> the policy term is 0; loss = token_mean(kl_coef * k1 - entropy_coef * H)
    b = make_batch([0, 0], [2, 1], [0.0, 0.0])
    b = dataclasses.replace(b, ref_logprobs=b.old_logprobs - place(b, [[1.0, 1.0], [1.0]]))  # k1 = 1
    ent = place(b, [[0.3, 0.6], [0.9]])
    o = opts("dapo", kl_coef=0.1, kl_estimator="k1", entropy_coef=0.01)
    out = OBJECTIVES.get("dapo")(b, b.old_logprobs, o, ent)
    assert math.isclose(out.loss.item(), 0.1 - 0.01 * 1.8 / 3, rel_tol=1e-9)
    assert math.isclose(out.metrics["kl_sum"], 3.0) and math.isclose(out.metrics["entropy_sum"], 1.8)


def test_aggregation_modes_weight_tokens_as_documented():
    # per-token loss 1 everywhere; rows of 1 and 3 loss tokens.
    b = make_batch([0, 0], [1, 3], [0.0, 0.0])
    one = torch.ones_like(b.loss_mask, requires_grad=True)
    assert aggregate(one, b.loss_mask, "token_mean", b).item() == 1.0
    assert aggregate(one, b.loss_mask, "seq_mean_token_mean", b).item() == 1.0
    assert aggregate(one, b.loss_mask, "seq_mean_token_sum_norm", b, 2.0).item() == 4 / (2 * 2)
    # token_mean: every token weighs 1/4 (a sequence twice as long has twice the share);
    # seq_mean_token_mean: a token weighs 1/(N |y_i|); sum_norm: 1/(N C), independent of |y_i|.
    g = torch.autograd.grad(aggregate(one, b.loss_mask, "seq_mean_token_mean", b), one)[0]
    assert torch.allclose(g, place(b, [[0.5], [1 / 6] * 3]))
    g = torch.autograd.grad(aggregate(one, b.loss_mask, "seq_mean_token_sum_norm", b, 2.0), one)[0]
    assert torch.allclose(g, place(b, [[0.25], [0.25] * 3]))


# ---------------------------------------------------------------------------- properties


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("mode", MODES)
def test_ratio_one_gradient_is_plain_policy_gradient(name, mode):
    # new == old (== prox): every objective's gradient is that of -A * logp aggregated alike.
    b = make_batch([1, 0, 2, 3], [3, 1, 4, 0], [0.7, -1.3, 0.4, 2.0], seed=3)
    b = dataclasses.replace(b, prox_logprobs=b.old_logprobs.clone())
    o = opts(name, aggregation=mode)
    _, g = loss_and_grad(name, b, b.old_logprobs, o)
    leaf = b.old_logprobs.clone().requires_grad_(True)
    aggregate(-b.advantages[:, None] * leaf, b.loss_mask, mode, b, o.norm_constant).backward()
    assert torch.allclose(g, leaf.grad)
    assert g.abs().sum() > 0


@pytest.mark.parametrize("mode", MODES)
def test_gspo_with_one_token_sequences_equals_grpo(mode):
    b = make_batch([2, 1, 3, 1, 2], [1] * 5, [0.5, -1.0, 2.0, -0.3, 1.1], seed=5)
    new = b.old_logprobs + place(b, [[0.4], [-0.5], [0.1], [0.25], [-0.05]])
    o_gspo = opts("gspo", aggregation=mode, eps_low=0.2, eps_high=0.2)
    out_s, g_s = loss_and_grad("gspo", b, new, o_gspo)
    out_g, g_g = loss_and_grad("grpo", b, new, opts("grpo", aggregation=mode))
    assert torch.allclose(out_s.loss, out_g.loss) and torch.allclose(g_s, g_g)
    assert out_s.metrics["clip_frac_sum"] == out_g.metrics["clip_frac_sum"] == 2.0  # rows 0, 1 clip


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
def test_decoupled_with_behaviour_equal_proximal_is_grpo(level):
    b = make_batch([1, 0, 2], [3, 2, 2], [1.0, -0.5, 0.8], seed=7)
    b = dataclasses.replace(b, prox_logprobs=b.old_logprobs.clone())
    new = b.old_logprobs + 0.3 * torch.randn(b.loss_mask.shape, dtype=b.loss_mask.dtype) * b.loss_mask
    out_d, g_d = loss_and_grad("decoupled_ppo", b, new, opts("decoupled_ppo", tis_level=level))
    out_g, g_g = loss_and_grad("grpo", b, new, opts("grpo", aggregation="token_mean"))
    assert torch.allclose(out_d.loss, out_g.loss) and torch.allclose(g_d, g_g)
    assert out_d.metrics["tis_clip_frac_sum"] == 0.0 and math.isclose(out_d.metrics["tis_weight_sum"], 7.0)


def test_decoupled_weights_by_prox_over_behaviour_and_masks_over_cap():
    # behaviour mu = old, proximal = old + [log 2, log 6 | log 0.5]; theta == prox (u = 1).
    # Weights [2, 6 | 0.5]; 6 > cap 5 is masked (zero gradient, denominator still 3 tokens):
    # grad = -A w / 3 = [-2/3, 0 | +0.5/3]  with A = [1 | -1]
    b = make_batch([0, 1], [2, 1], [1.0, -1.0], seed=1)
    prox = b.old_logprobs + place(b, [[math.log(2), math.log(6)], [math.log(0.5)]])
    b = dataclasses.replace(b, prox_logprobs=prox)
    out, g = loss_and_grad("decoupled_ppo", b, prox, opts("decoupled_ppo"))
    assert torch.allclose(g, place(b, [[-2 / 3, 0.0], [0.5 / 3]]))
    assert out.metrics["tis_clip_frac_sum"] == 1.0
    # truncation instead: weight 6 -> 5
    _, g = loss_and_grad("decoupled_ppo", b, prox, opts("decoupled_ppo", tis_action="truncate"))
    assert torch.allclose(g, place(b, [[-2 / 3, -5 / 3], [0.5 / 3]]))
    with pytest.raises(ValueError, match="prox_logprobs"):
        OBJECTIVES.get("decoupled_ppo")(dataclasses.replace(b, prox_logprobs=None), prox, opts("decoupled_ppo"))


def test_behaviour_weight_levels():
    # log weights row 0: [log 2, log 8]; row 1: [log 0.25]
    b = make_batch([0, 0], [2, 1], [0.0, 0.0])
    prox = b.old_logprobs + place(b, [[math.log(2), math.log(8)], [math.log(0.25)]])
    m = b.loss_mask
    w, _ = behaviour_weight(prox, b.old_logprobs, m, "token")
    assert torch.allclose(w * m, place(b, [[2, 8], [0.25]]))
    w, _ = behaviour_weight(prox, b.old_logprobs, m, "sequence")  # product: 16 | 0.25
    assert torch.allclose(w * m, place(b, [[16, 16], [0.25]]))
    w, _ = behaviour_weight(prox, b.old_logprobs, m, "geometric")  # geometric mean: 4 | 0.25
    assert torch.allclose(w * m, place(b, [[4, 4], [0.25]]))
    w, out = behaviour_weight(prox, b.old_logprobs, m, "token", low=0.5, cap=2.0)  # TIS: <= cap
    assert torch.allclose(w * m, place(b, [[2, 2], [0.5]])) and (w <= 2.0).all()
    assert (out * m).sum() == 2
    w, _ = behaviour_weight(prox, b.old_logprobs, m, "token", low=0.5, cap=2.0, action="mask")  # MIS
    assert torch.allclose(w * m, place(b, [[2, 0], [0]]))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
def test_tis_with_matching_sampler_is_uncorrected(name, level):
    b = make_batch([1, 2], [3, 2], [0.9, -0.4], seed=11)
    b = dataclasses.replace(b, prox_logprobs=b.old_logprobs.clone())
    new = b.old_logprobs + 0.2 * b.loss_mask
    base = {"aggregation": "token_mean"}
    out_t, g_t = loss_and_grad(name, b, new, opts(name, **base, tis_level=level))
    plain = opts(name, **base) if name != "decoupled_ppo" else opts("grpo", **base)
    out_p, g_p = loss_and_grad(name if name != "decoupled_ppo" else "grpo", b, new, plain)
    assert torch.allclose(out_t.loss, out_p.loss) and torch.allclose(g_t, g_p)


def test_errors_are_loud():
    b = two_rows()
    with pytest.raises(ValidationError, match="norm_constant"):
        OBJECTIVES.get("grpo").Options(aggregation="seq_mean_token_sum_norm")
    with pytest.raises(ValidationError):
        OBJECTIVES.get("dapo").Options(clip_eps=0.2)  # dapo has eps_low / eps_high
    with pytest.raises(ValueError, match="ref_logprobs"):
        OBJECTIVES.get("grpo")(b, b.old_logprobs, opts("grpo", kl_coef=0.1))
    with pytest.raises(ValueError, match="prox_logprobs"):
        OBJECTIVES.get("grpo")(b, b.old_logprobs, opts("grpo", tis_level="token"))
    with pytest.raises(ValueError, match="entropy"):
        OBJECTIVES.get("grpo")(b, b.old_logprobs, opts("grpo", entropy_coef=0.1))
    with pytest.raises(ValueError, match="shape"):
        OBJECTIVES.get("grpo")(b, b.old_logprobs[:, :-1], opts("grpo"))


def test_padding_garbage_does_not_leak():
    # off-mask new_logprobs of -inf / huge values must not change loss or produce NaN gradients
    b = make_batch([2, 0], [1, 2], [1.0, -1.0], seed=2)
    new = b.old_logprobs + 0.1 * b.loss_mask
    junk = torch.where(b.loss_mask == 0, torch.full_like(new, -1e4), new)
    for name in NAMES:
        bb = dataclasses.replace(b, prox_logprobs=b.old_logprobs.clone())
        out_a, g_a = loss_and_grad(name, bb, new, opts(name))
        out_b, g_b = loss_and_grad(name, bb, junk, opts(name))
        assert torch.allclose(out_a.loss, out_b.loss) and torch.allclose(g_a, g_b), name


def test_every_option_field_has_a_description():
    for name in NAMES:
        for field, info in OBJECTIVES.get(name).Options.model_fields.items():
            assert info.description, (name, field)


def test_registry_names_resolve_and_validate_options():
    from rollwise.objectives import ADVANTAGES
    from rollwise.registry import UserError, validate_options

    assert OBJECTIVES.names() == sorted(NAMES + ["minpro", "opmd", "aepo"])
    assert ADVANTAGES.names() == sorted(
        [
            "grpo",
            "dr_grpo",
            "rloo",
            "reinforce_pp_baseline",
            "median",
            "novelty",
            "tree",
            "gdpo",
            "grpo_sum",
            "mssr",
            "ettrl",
            "echo",
            "ace",
            "uniqueness",
            "r3l",
            "adhint",
            "v05",
            "poise",
            "turn_return",
            "gigpo",
            "hgpo",
            "salt",
            "opob",
            "portool",
            "ui_s1",
            "cog_rethinker",
        ]
    )
    o = validate_options(
        "objective", "dapo", OBJECTIVES.get("dapo"), {"eps_high": 0.3, "aggregation": "seq_mean_token_mean"}
    )
    assert o.eps_high == 0.3 and o.eps_low == 0.2
    with pytest.raises(UserError, match="clip_epsilon"):
        validate_options("objective", "grpo", OBJECTIVES.get("grpo"), {"clip_epsilon": 0.3})
    with pytest.raises(UserError, match="scale"):
        validate_options("advantage", "median", ADVANTAGES.get("median"), {"scale": "std"})
