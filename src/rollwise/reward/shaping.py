"""Reward shaping (config section ``[reward]``, metrics ``reward/*``): terms added to the
verifiers' scores of the training rows after filtering and replay, before advantages.

``shape(rows, rewards, cfg, max_new_tokens, kl=None) -> (rewards, metrics)`` is pure; the loop
calls it through ``batches.Batches.shape_rewards``, which computes the per-sequence KL first when it is on.

- ``overlong_penalty`` — DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476,
  allocation.md §14.1): ``r_i += R_len(|y_i|)`` with
  :func:`rollwise.objectives.dapo.overlong_penalty` (0 up to ``max_len - cache_len``, then linear
  to -1 at ``max_len``, -1 beyond). ``|y_i|`` is the rollout's completion length in tokens (EOS
  included, a continued prefix included). ``max_len`` defaults to ``sampling.max_new_tokens``
  and ``cache_len`` to ``max(1, max_len // 5)`` (the paper's 4096 of 20480), so by default a
  truncated response gets -1. The filters saw the unshaped scores (verl's DAPO recipe filters on
  accuracy too), so shaping never turns a dropped group into a kept one.
- ``fapo`` — FAPO's flawed-positive penalty (arXiv 2510.22543, guidance.md §6;
  :mod:`rollwise.reward.fapo`): a rollout scored correct whose working a flaw detector finds
  wrong loses ``penalty`` (0.5 on 0/1 scores = the paper's lambda = 1 on +-1). Metrics
  ``fapo/flawed_frac``, ``fapo/undecided_frac``, ``fapo/checked``.
- ``kl`` — KL to the frozen reference as a reward penalty (InstructGPT-style; verl's
  ``use_kl_in_reward``): ``r_i -= beta * sum_t m_it k(l_it)`` over the completion tokens, with
  ``l = log pi_ref - log pi_theta`` and ``k`` one of the estimators ``k1``/``k2``/``k3`` of
  :func:`rollwise.objectives.common.kl_penalty`. ``pi_theta`` is the current policy (the weights
  before this step's update, recomputed by the trainer without gradient at the training
  temperature, as the loss sees it), not the sampler's log-probs, so top-p renormalisation and
  sampler numerics do not enter. With outcome rewards verl sums the token-level penalty into the
  sequence score the same way. KL in the *loss* is the objective option ``kl_coef``; both may
  be on.

Only verified rollouts are shaped: the rows come from ``batch.collate.flatten``, which leaves out
``score is None``, and :func:`shape` refuses a row without a score.

Metrics (only when a term is on): ``reward/shaped_mean`` (mean shaped reward of the rows),
``reward/overlong_penalty_mean`` and ``reward/overlong_frac`` (rows with a penalty < 0),
``reward/kl_mean`` (mean per-sequence KL sum, before ``beta``).
"""

from __future__ import annotations

import torch

from rollwise.objectives.common import kl_penalty
from rollwise.objectives.dapo import overlong_penalty
from rollwise.registry import UserError
from rollwise.types import Advantages, Rollout


def overlong_limits(opts, max_new_tokens: int) -> tuple[int, int]:
    """(max_len, cache_len) of the overlong penalty with their defaults resolved; raises
    ``UserError`` when ``cache_len > max_len``."""
    max_len = opts.max_len or max_new_tokens
    cache_len = opts.cache_len or max(1, max_len // 5)
    if cache_len > max_len:
        raise UserError(f"reward.overlong_penalty.cache_len ({cache_len}) exceeds max_len ({max_len})")
    return max_len, cache_len


def sequence_kl(
    policy_logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, estimator: str
) -> torch.Tensor:
    """(B, T) log-probs and loss mask -> (B,) ``sum_t m_t k(l_t)`` with ``l = ref - policy``."""
    kl = kl_penalty(policy_logprobs.float(), ref_logprobs.float(), estimator)
    return torch.where(mask != 0, kl * mask, torch.zeros_like(kl)).sum(dim=1)


def reference_kl(rows: list[Rollout], trainer, estimator: str, pad_id: int) -> torch.Tensor:
    """(B,) per-sequence KL of the rows' completions, from the trainer's no-grad recompute of the
    current policy and of the frozen reference (``Trainer.policy_and_reference_logprobs``)."""
    from rollwise.collate import collate

    b = len(rows)
    every_row = Advantages(torch.zeros(b), torch.ones(b, dtype=torch.bool))
    batch = collate(rows, torch.zeros(b), torch.zeros(b, dtype=torch.long), every_row, pad_id)
    policy, ref = trainer.policy_and_reference_logprobs(batch)
    return sequence_kl(policy, ref, batch.loss_mask, estimator)


def shape(
    rows: list[Rollout], rewards: torch.Tensor, cfg, max_new_tokens: int, kl: torch.Tensor | None = None, prompts=None
) -> tuple[torch.Tensor, dict[str, float]]:
    """Shaped rewards (B,) for ``rows`` and ``reward/*`` metrics (see the module docstring).

    ``cfg`` is the ``[reward]`` section; ``kl`` (B,) is the per-sequence KL (:func:`reference_kl`),
    required when ``cfg.kl.coef > 0``; ``prompts`` maps prompt id -> ``Prompt`` for the FAPO flaw
    detector (``cfg.fapo``; ids it lacks reach the detector as None). Rewards are returned
    unchanged, with no metrics, when no term is on.
    """
    if any(r.reward is None for r in rows):
        raise ValueError("reward shaping got an unverified rollout (score None); flatten() must leave it out")
    on_overlong, beta, fapo = cfg.overlong_penalty.enabled, cfg.kl.coef, getattr(cfg, "fapo", None)
    on_fapo = fapo is not None and fapo.enabled
    if not on_overlong and not beta and not on_fapo:
        return rewards, {}
    out, metrics = rewards.float().clone(), {}
    if on_fapo:  # flawed positives, judged on the verifier scores (rollwise.reward.fapo)
        from rollwise.flaws import DETECTORS
        from rollwise.reward.fapo import fapo_penalty

        delta, fm = fapo_penalty(rows, prompts or {}, DETECTORS.get(fapo.detector), fapo.penalty, fapo.correct_at)
        out = out + delta.to(out.dtype)
        metrics.update(fm)
    if on_overlong:
        max_len, cache_len = overlong_limits(cfg.overlong_penalty, max_new_tokens)
        pen = torch.tensor([overlong_penalty(len(r.completion_ids), max_len, cache_len) for r in rows], dtype=out.dtype)
        out = out + pen
        metrics["reward/overlong_penalty_mean"] = _mean(pen)
        metrics["reward/overlong_frac"] = _mean((pen < 0).float())
    if beta:
        if kl is None or kl.shape != out.shape:
            raise ValueError(f"reward.kl.coef > 0 needs the per-sequence KL of shape {tuple(out.shape)}")
        out = out - beta * kl.to(out.dtype)
        metrics["reward/kl_mean"] = _mean(kl)
    metrics["reward/shaped_mean"] = _mean(out)
    return out, metrics


def _mean(x: torch.Tensor) -> float:
    return float(x.float().mean().item()) if x.numel() else 0.0
