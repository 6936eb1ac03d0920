"""rollwise against TRL 1.16.0's own loss (``GRPOTrainer._compute_loss``), on random ragged
batches (fixed seeds, float64, one process, no gradient accumulation).

Test names: ``test_exact_*`` -- equal within ``peerutil.RTOL/ATOL`` with the rollwise options named
in the test; ``test_convention_*`` -- rollwise's default differs by a named convention (asserted)
and the named option makes it exact (asserted). How TRL's method is called: tests/peers/peerfixtures.py.
TRL's advantages are inline in ``_generate_and_score_completions`` and not compared here (see the
peerfixtures docstring); their conventions (eps 1e-4, scale_rewards="batch") are unit-tested by hand.
"""

from __future__ import annotations

import pytest
from peerfixtures import trl_grpo, trl_loss, trl_rloo_loss  # noqa: F401 (pytest fixtures)
from peerutil import SEEDS, close, leaf, ragged

from rollwise.objectives import cispo, grpo, gspo

MAX_COMPLETION = 12  # TRL's max_completion_length, rollwise's norm_constant for Dr. GRPO


def _pair(trl_loss, r, ours_module, ours_opts, num_rows=False, **trl_kw):
    new_t = leaf(r.new)
    theirs = trl_loss(new_t, r.old, r.mask, r.adv, ref=r.ref, max_completion_length=MAX_COMPLETION, **trl_kw)
    theirs.backward()
    new_o = leaf(r.new)
    ours = ours_module.loss(r.batch(num_rows=num_rows), new_o, ours_opts).loss
    ours.backward()
    return (ours, new_o.grad), (theirs, new_t.grad)


def _same(a, b) -> bool:
    return close(a[0], b[0]) and close(a[1], b[1])


LOSS_TYPES = {
    "dapo": {"aggregation": "token_mean"},  # TRL's default loss_type
    "bnpo": {"aggregation": "token_mean"},  # token mean of the (one) micro-batch
    "grpo": {"aggregation": "seq_mean_token_mean"},  # every row has >= 1 token here (empty rows: below)
    "dr_grpo": {"aggregation": "seq_mean_token_sum_norm", "norm_constant": float(MAX_COMPLETION)},
}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("loss_type", list(LOSS_TYPES))
def test_exact_clipped_loss_types(trl_loss, seed, loss_type):
    # TRL's defaults: epsilon 0.2 (epsilon_high = epsilon), beta 0, token-level ratio.
    r = ragged(seed, drift=0.6, max_len=MAX_COMPLETION)
    ours, theirs = _pair(trl_loss, r, grpo, grpo.Options(**LOSS_TYPES[loss_type]), loss_type=loss_type)
    assert _same(ours, theirs)


@pytest.mark.parametrize("seed", SEEDS)
def test_exact_clip_higher(trl_loss, seed):
    from rollwise.objectives import dapo

    r = ragged(seed, drift=0.6)
    ours, theirs = _pair(trl_loss, r, dapo, dapo.Options(), loss_type="dapo", epsilon=0.2, epsilon_high=0.28)
    assert _same(ours, theirs)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo"])
def test_convention_sequence_losses_count_empty_rows(trl_loss, seed, loss_type):
    # TRL's loss_type="grpo" averages sum_t / max(count, 1) over *all* rows and "dr_grpo" divides
    # by all rows * max_completion_length; rollwise (and verl) count rows with >= 1 loss token.
    # count_empty_rows=True (with Batch.num_rows) makes both exact.
    r = ragged(seed, min_len=0, drift=0.6, max_len=MAX_COMPLETION)
    assert (r.mask.sum(dim=1) == 0).any()
    base = LOSS_TYPES[loss_type]
    default, theirs = _pair(trl_loss, r, grpo, grpo.Options(**base), loss_type=loss_type)
    assert not close(default[0], theirs[0])
    matched, theirs = _pair(
        trl_loss, r, grpo, grpo.Options(count_empty_rows=True, **base), num_rows=True, loss_type=loss_type
    )
    assert _same(matched, theirs)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("bias_correction", [False, True])
def test_exact_kl_term(trl_loss, seed, bias_correction):
    # TRL's KL is k3 = exp(ref - new) - (ref - new) - 1, optionally times coef_1 (use_bias_correction_kl).
    r = ragged(seed, drift=0.6)
    opts = grpo.Options(kl_coef=0.04, kl_bias_correction=bias_correction)
    ours, theirs = _pair(trl_loss, r, grpo, opts, loss_type="dapo", beta=0.04, use_bias_correction_kl=bias_correction)
    assert _same(ours, theirs)


@pytest.mark.parametrize("seed", SEEDS)
def test_convention_kl_bias_correction(trl_loss, seed):
    r = ragged(seed, drift=0.6)
    default, theirs = _pair(
        trl_loss, r, grpo, grpo.Options(kl_coef=0.04), loss_type="dapo", beta=0.04, use_bias_correction_kl=True
    )
    assert not close(default[1], theirs[1])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("loss_type, aggregation", [("dapo", "token_mean"), ("grpo", "seq_mean_token_mean")])
def test_exact_gspo_sequence_level(trl_loss, seed, loss_type, aggregation):
    # TRL's GSPO: importance_sampling_level="sequence"; with epsilon 3e-4 / 4e-4 it is rollwise gspo.
    r = ragged(seed, drift=0.002)
    ours, theirs = _pair(
        trl_loss,
        r,
        gspo,
        gspo.Options(aggregation=aggregation),
        loss_type=loss_type,
        importance_sampling_level="sequence",
        epsilon=3e-4,
        epsilon_high=4e-4,
    )
    assert _same(ours, theirs)


@pytest.mark.parametrize("seed", SEEDS)
def test_exact_gspo_kl_bias_correction_uses_the_sequence_ratio(trl_loss, seed):
    r = ragged(seed, drift=0.002)
    opts = gspo.Options(aggregation="token_mean", kl_coef=0.04, kl_bias_correction=True)
    ours, theirs = _pair(
        trl_loss,
        r,
        gspo,
        opts,
        loss_type="dapo",
        importance_sampling_level="sequence",
        epsilon=3e-4,
        epsilon_high=4e-4,
        beta=0.04,
        use_bias_correction_kl=True,
    )
    assert _same(ours, theirs)


@pytest.mark.parametrize("seed", SEEDS)
def test_exact_cispo_default_is_trl_recommended_cap(trl_loss, seed):
    # TRL: clamp(coef_1, max=epsilon_high).detach(), recommended epsilon_high = 5.0 -> rollwise's
    # default eps_high = 4.0 (cap 1 + 4), eps_low = 1.0 (no lower bound). Drift 1.5: some ratios > 5.
    r = ragged(seed, drift=1.5)
    assert ((r.new - r.old).exp() * r.mask > 5).any()
    ours, theirs = _pair(trl_loss, r, cispo, cispo.Options(), loss_type="cispo", epsilon_high=5.0)
    assert _same(ours, theirs)


@pytest.mark.parametrize("seed", SEEDS)
def test_convention_rloo_trainer_sequence_ratio(trl_rloo_loss, seed):
    # TRL's RLOOTrainer clips the *sequence* ratio exp(sum_t new - old) (not length-normalised) and
    # averages rows. rollwise has no such objective; on-policy (new == old, one update per batch,
    # as in the rollwise loop) its gradient is -A sum_t d log pi / B, which is rollwise grpo with
    # aggregation seq_mean_token_sum_norm and norm_constant 1 (exact gradient; the loss *values*
    # differ: TRL -mean(A), rollwise -sum_i A_i |y_i| / B). Off-policy the two differ.
    r = ragged(seed)
    new_t = leaf(r.old)
    theirs = trl_rloo_loss(new_t, r.old, r.mask, r.adv)
    theirs.backward()
    assert close(theirs, -r.adv.mean())
    new_o = leaf(r.old)
    opts = grpo.Options(aggregation="seq_mean_token_sum_norm", norm_constant=1.0)
    grpo.loss(r.batch(), new_o, opts).loss.backward()
    assert close(new_o.grad, new_t.grad)
    # off-policy: the sequence ratio and the token ratios clip differently
    off_t = leaf(r.new)
    trl_rloo_loss(off_t, r.old, r.mask, r.adv).backward()
    off_o = leaf(r.new)
    grpo.loss(r.batch(), off_o, opts).loss.backward()
    assert not close(off_o.grad, off_t.grad)
