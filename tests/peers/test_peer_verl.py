"""rollwise against verl 0.9.1's own functions (``verl/trainer/ppo/core_algos.py``), on random
ragged batches (ragged groups, ragged lengths, fixed seeds, float64).

Test names say what each comparison is: ``test_exact_*`` -- rollwise (with the options named in the
test) equals verl within ``peerutil.RTOL/ATOL``; ``test_convention_*`` -- rollwise's default
differs from verl's by a named convention (asserted), and the named rollwise option makes it
exact (asserted). How verl is loaded without Ray: tests/peers/peerfixtures.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from peerfixtures import verl_actor_config, verl_core, verl_rollout_corr  # noqa: F401 (pytest fixtures)
from peerutil import SEEDS, close, leaf, ragged

from rollwise.objectives import advantages as adv
from rollwise.objectives import cispo, dapo, grpo, gspo
from rollwise.objectives.common import aggregate, kl_penalty

MODES = {
    "token_mean": "token-mean",
    "seq_mean_token_mean": "seq-mean-token-mean",
    "seq_mean_token_sum_norm": "seq-mean-token-sum-norm",
}
NORM = 16.0  # norm_constant / verl's loss_scale_factor for the *_norm mode


def _token_rewards(r) -> torch.Tensor:
    """Outcome reward on each row's last loss token (verl sums token_level_rewards per row)."""
    last = (r.mask.sum(dim=1).long() - 1).clamp(min=0)
    out = torch.zeros_like(r.mask)
    out[torch.arange(len(last)), last] = r.rewards
    return out


def _rows(per_token: torch.Tensor) -> torch.Tensor:
    return per_token[:, 0]  # every row has >= 1 loss token in these batches; token 0 carries the row value


def _batch_info(r, mode):
    b = r.batch()
    return {
        "dp_size": 1,
        "batch_num_tokens": b.num_loss_tokens,
        "global_batch_size": b.num_sequences,
        "loss_scale_factor": NORM if mode == "seq_mean_token_sum_norm" else None,
    }


# ---------------------------------------------------------------------------- advantages


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_exact_grpo_and_dr_grpo_advantage(verl_core, seed, norm_by_std):
    r = ragged(seed)
    ours = (adv.grpo(r.rewards, r.groups) if norm_by_std else adv.dr_grpo(r.rewards, r.groups)).values
    theirs, _ = verl_core.compute_grpo_outcome_advantage(
        _token_rewards(r), r.mask, np.array(r.groups.tolist()), epsilon=1e-6, norm_adv_by_std_in_grpo=norm_by_std
    )
    assert close(ours, _rows(theirs))


@pytest.mark.parametrize("seed", SEEDS)
def test_exact_grpo_advantage_binary_rewards(verl_core, seed):
    # Binary rewards give all-equal groups: rollwise forces 0, verl gets (r - mean) / (0 + eps) = 0 exactly.
    r = ragged(seed, binary=True)
    theirs, _ = verl_core.compute_grpo_outcome_advantage(_token_rewards(r), r.mask, np.array(r.groups.tolist()))
    assert close(adv.grpo(r.rewards, r.groups).values, _rows(theirs))


@pytest.mark.parametrize("seed", SEEDS)
def test_exact_rloo_advantage(verl_core, seed):
    r = ragged(seed)
    theirs, _ = verl_core.compute_rloo_outcome_advantage(_token_rewards(r), r.mask, np.array(r.groups.tolist()))
    assert close(adv.rloo(r.rewards, r.groups).values, _rows(theirs))


@pytest.mark.parametrize("seed", SEEDS)
def test_convention_reinforce_pp_token_whitening(verl_core, seed):
    # verl whitens over tokens (masked_whiten): a row weighs by its length. rollwise: whiten="token".
    r = ragged(seed)
    theirs, _ = verl_core.compute_reinforce_plus_plus_baseline_outcome_advantage(
        _token_rewards(r), r.mask, np.array(r.groups.tolist())
    )
    lengths = r.mask.sum(dim=1)
    default = adv.reinforce_pp_baseline(r.rewards, r.groups).values
    assert not close(default, _rows(theirs))
    opts = adv.reinforce_pp_baseline.Options(whiten="token")
    assert close(adv.reinforce_pp_baseline(r.rewards, r.groups, opts, completion_lengths=lengths).values, _rows(theirs))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"])
def test_convention_one_row_groups(verl_core, seed, name):
    # verl gives a one-row group baseline 0 (and std 1): its advantage is the reward; rollwise 0.
    # rollwise singleton="reward" reproduces it.
    r = ragged(seed, singletons=True)
    index = np.array(r.groups.tolist())
    tok = _token_rewards(r)
    lengths = r.mask.sum(dim=1)
    if name == "grpo":
        theirs = verl_core.compute_grpo_outcome_advantage(tok, r.mask, index)[0]
    elif name == "dr_grpo":
        theirs = verl_core.compute_grpo_outcome_advantage(tok, r.mask, index, norm_adv_by_std_in_grpo=False)[0]
    elif name == "rloo":
        theirs = verl_core.compute_rloo_outcome_advantage(tok, r.mask, index)[0]
    else:
        theirs = verl_core.compute_reinforce_plus_plus_baseline_outcome_advantage(tok, r.mask, index)[0]
    fn = getattr(adv, name)
    extra = {"whiten": "token"} if name == "reinforce_pp_baseline" else {}
    kw = {"completion_lengths": lengths} if name == "reinforce_pp_baseline" else {}
    default = fn(r.rewards, r.groups, fn.Options(**extra), **kw).values
    assert not close(default, _rows(theirs))
    matched = fn(r.rewards, r.groups, fn.Options(singleton="reward", **extra), **kw).values
    assert close(matched, _rows(theirs))


# ---------------------------------------------------------------------------- aggregation


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", list(MODES))
def test_exact_agg_loss_and_micro_batch_sums(verl_core, seed, mode):
    # Rows without loss tokens included (min_len=0): both exclude them from the sequence count.
    r = ragged(seed, min_len=0)
    gen = torch.Generator().manual_seed(100 + seed)
    loss_mat = torch.randn(r.mask.shape, generator=gen, dtype=torch.float64)
    b = r.batch()
    ours = aggregate(loss_mat, r.mask, mode, b, NORM)
    info = _batch_info(r, mode)
    theirs = verl_core.agg_loss(loss_mat, r.mask, MODES[mode], **info)
    assert close(ours, theirs)
    # two micro-batches with the global counts: both sums equal the full-batch loss
    half = r.mask.shape[0] // 2
    parts = [slice(0, half), slice(half, None)]
    ours_mb = sum(aggregate(loss_mat[s], r.mask[s], mode, b.rows(s), NORM) for s in parts)
    theirs_mb = sum(verl_core.agg_loss(loss_mat[s], r.mask[s], MODES[mode], **info) for s in parts)
    assert close(ours_mb, theirs) and close(theirs_mb, theirs)


# ---------------------------------------------------------------------------- policy losses


def _ours(module, r, opts):
    new = leaf(r.new)
    loss = module.loss(r.batch(), new, opts).loss
    loss.backward()
    return loss, new.grad


def _verl(fn, r, config, mode):
    new = leaf(r.new)
    loss, _ = fn(r.old, new, r.adv[:, None] * r.mask, r.mask, loss_agg_mode=MODES[mode], config=config)
    loss.backward()
    return loss, new.grad


def _norm(mode):
    return {"norm_constant": NORM} if mode == "seq_mean_token_sum_norm" else {}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", ["grpo", "dapo"])
def test_exact_clipped_ppo_loss_and_gradient(verl_core, verl_actor_config, seed, mode, name):
    # verl's vanilla loss with its default dual clip (clip_ratio_c = 3) = rollwise with dual_clip=3.
    r = ragged(seed, drift=0.6)
    if name == "grpo":
        ours = _ours(grpo, r, grpo.Options(aggregation=mode, dual_clip=3.0, **_norm(mode)))
        cfg = verl_actor_config(_batch_info(r, mode), clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.2)
    else:
        ours = _ours(dapo, r, dapo.Options(aggregation=mode, dual_clip=3.0, **_norm(mode)))
        cfg = verl_actor_config(_batch_info(r, mode), clip_ratio_low=0.2, clip_ratio_high=0.28)
    assert cfg.clip_ratio_c == 3.0  # verl's default
    theirs = _verl(verl_core.compute_policy_loss_vanilla, r, cfg, mode)
    assert close(ours[0], theirs[0]) and close(ours[1], theirs[1])


@pytest.mark.parametrize("seed", SEEDS)
def test_convention_dual_clip(verl_core, verl_actor_config, seed):
    # Large drift: ratios above 3 on negative-advantage tokens. rollwise's default has no dual clip.
    r = ragged(seed, drift=1.5)
    cfg = verl_actor_config(_batch_info(r, "token_mean"))
    theirs = _verl(verl_core.compute_policy_loss_vanilla, r, cfg, "token_mean")
    default = _ours(grpo, r, grpo.Options())
    assert not close(default[1], theirs[1])
    matched = _ours(grpo, r, grpo.Options(dual_clip=3.0))
    assert close(matched[0], theirs[0]) and close(matched[1], theirs[1])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", list(MODES))
def test_exact_gspo_loss_and_gradient(verl_core, verl_actor_config, seed, mode):
    # verl's GSPO-token form (sg[s_i] * pi / sg[pi]) has the same value and, aggregated, the same
    # gradient as rollwise's sequence ratio. Small drift so some sequence ratios sit inside the
    # 3e-4 / 4e-4 clip band and some outside.
    r = ragged(seed, drift=0.002)
    cfg = verl_actor_config(_batch_info(r, mode), clip_ratio_low=3e-4, clip_ratio_high=4e-4)
    theirs = _verl(verl_core.compute_policy_loss_gspo, r, cfg, mode)
    ours = _ours(gspo, r, gspo.Options(aggregation=mode, **_norm(mode)))
    assert close(ours[0], theirs[0]) and close(ours[1], theirs[1])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", list(MODES))
def test_convention_cispo_bounds(verl_core, verl_actor_config, seed, mode):
    # verl's cispo clamps the weight to [1 - clip_ratio_low, 1 + clip_ratio_high], ActorConfig
    # default 0.2 / 0.2; rollwise's defaults are 1.0 / 4.0 (no lower bound, cap 5). Same bounds: exact.
    r = ragged(seed, drift=0.6)
    cfg = verl_actor_config(_batch_info(r, mode))
    theirs = _verl(verl_core.compute_policy_loss_cispo, r, cfg, mode)
    default = _ours(cispo, r, cispo.Options(aggregation=mode, **_norm(mode)))
    assert not close(default[1], theirs[1])
    matched = _ours(cispo, r, cispo.Options(aggregation=mode, eps_low=0.2, eps_high=0.2, **_norm(mode)))
    assert close(matched[0], theirs[0]) and close(matched[1], theirs[1])


# ---------------------------------------------------------------------------- KL


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("ours_name, theirs_name", [("k1", "k1"), ("k2", "k2")])
def test_exact_kl_k1_k2(verl_core, seed, ours_name, theirs_name):
    r = ragged(seed, drift=2.0)
    new = leaf(r.new)
    theirs_new = leaf(r.new)
    ours = kl_penalty(new, r.ref, ours_name)
    theirs = verl_core.kl_penalty(theirs_new, r.ref, theirs_name)
    ours.sum().backward()
    theirs.sum().backward()
    assert close(ours, theirs) and close(new.grad, theirs_new.grad)


@pytest.mark.parametrize("seed", SEEDS)
def test_convention_low_var_kl_cap(verl_core, seed):
    # verl's low_var_kl (k3) clamps the value to [-10, 10]; rollwise's k3 is uncapped: kl_cap=10.
    # Drift 8: many tokens have k3 > 10 and some log-ratios beyond verl's +-20 guard.
    r = ragged(seed, drift=8.0)
    theirs_new = leaf(r.new)
    theirs = verl_core.kl_penalty(theirs_new, r.ref, "low_var_kl")
    theirs.sum().backward()
    assert not close(kl_penalty(r.new, r.ref, "k3"), theirs)
    new = leaf(r.new)
    ours = kl_penalty(new, r.ref, "k3", cap=10.0)
    ours.sum().backward()
    assert close(ours, theirs) and close(new.grad, theirs_new.grad)
    # and inside the cap (small drift) the plain k3 is exact
    small = ragged(seed, drift=0.3)
    assert close(kl_penalty(small.new, small.ref, "k3"), verl_core.kl_penalty(small.new, small.ref, "low_var_kl"))


@pytest.mark.parametrize("seed", SEEDS)
def test_exact_kl_in_reward(verl_core, seed):
    # verl's use_kl_in_reward: token rewards = scores - beta * (old - ref) (compute_rewards, k1);
    # GRPO sums them per row. rollwise reward.sequence_kl(..., "k1") is that sum (float32 inside).
    from rollwise.reward import sequence_kl

    r = ragged(seed, drift=0.6)
    beta = 0.05
    theirs = (verl_core.compute_rewards(torch.zeros_like(r.mask), r.new, r.ref, beta) * r.mask).sum(dim=1)
    ours = -beta * sequence_kl(r.new, r.ref, r.mask, "k1").double()
    assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-6)  # float32 in sequence_kl


@pytest.mark.parametrize("seed", SEEDS)
def test_documented_gspo_log_ratio_clamp(verl_core, verl_actor_config, seed):
    # verl clamps GSPO's log s_i only from above, at 10 (rollwise: [-20, 20] like every ratio).
    # Documented difference without an option: it needs s_i > e^10 = 22026. Row 0's log-ratio is
    # set to 12 with A < 0: rollwise's loss grows with s_i (gradient > 0 on its tokens); verl's
    # clamp freezes it (value |A| e^10, gradient 0). Every other row is exact.
    r = ragged(seed, drift=0.002)
    new = r.new.clone()
    new[0] = (r.old[0] + 12.0) * r.mask[0]
    adv_ = r.adv.clone()
    adv_[0] = -1.0
    r = dataclasses.replace(r, new=new, adv=adv_)
    cfg = verl_actor_config(_batch_info(r, "seq_mean_token_mean"), clip_ratio_low=3e-4, clip_ratio_high=4e-4)
    theirs = _verl(verl_core.compute_policy_loss_gspo, r, cfg, "seq_mean_token_mean")
    ours = _ours(gspo, r, gspo.Options())
    assert (theirs[1][0] == 0).all() and (ours[1][0][r.mask[0] > 0] > 0).all()
    assert close(ours[1][1:], theirs[1][1:])
    B = r.mask.shape[0]
    assert close(ours[0] - theirs[0], (torch.tensor(12.0).exp() - torch.tensor(10.0).exp()) / B)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("threshold, action", [(2.0, "truncate"), ("0.5_2.0", "mask")])
def test_exact_rollout_correction_weights(verl_rollout_corr, seed, level, threshold, action):
    # verl's rollout correction: w = pi_old / pi_rollout per token or per sequence (product), TIS
    # truncates at the upper threshold (2.0, verl's default), IcePop ("lower_upper") zeroes outside.
    # rollwise: behaviour_weight(prox, behaviour, ...) with tis_cap / tis_low / tis_action.
    from rollwise.objectives.common import behaviour_weight

    r = ragged(seed, drift=0.3 if level == "token" else 0.1)
    prox = r.ref  # the trainer's recompute (verl: old_log_prob); r.old is the sampler's
    theirs, _ = verl_rollout_corr.compute_rollout_correction_weights(
        (prox - r.old) * r.mask, r.mask, rollout_is=level, rollout_is_threshold=threshold
    )
    low = 0.5 if action == "mask" else 0.0
    ours, _ = behaviour_weight(prox, r.old, r.mask, level, low=low, cap=2.0, action=action)
    assert close(ours * r.mask, theirs)


@pytest.mark.parametrize("seed", SEEDS)
def test_exact_tis_weighted_ppo_loss(verl_core, verl_rollout_corr, verl_actor_config, seed):
    # The whole decoupled loss: verl's vanilla loss around old_log_prob = pi_prox, times its TIS
    # weights pi_prox / pi_rollout (token, cap 2), equals rollwise grpo with prox_logprobs and
    # tis_level="token" (dual_clip=3 for verl's default clip_ratio_c).
    r = ragged(seed, drift=0.4)
    prox = r.ref
    cfg = verl_actor_config(_batch_info(r, "token_mean"))
    weights, _ = verl_rollout_corr.compute_rollout_correction_weights((prox - r.old) * r.mask, r.mask)
    new_t = leaf(r.new)
    theirs, _ = verl_core.compute_policy_loss_vanilla(
        prox, new_t, r.adv[:, None] * r.mask, r.mask, loss_agg_mode="token-mean", config=cfg, rollout_is_weights=weights
    )
    theirs.backward()
    new_o = leaf(r.new)
    batch = dataclasses.replace(r.batch(), prox_logprobs=prox, ref_logprobs=None)
    ours = grpo.loss(batch, new_o, grpo.Options(tis_level="token", dual_clip=3.0)).loss
    ours.backward()
    assert close(ours, theirs) and close(new_o.grad, new_t.grad)
