"""Sampler/trainer mismatch: how far the log-probs the rollouts were sampled with are from the
trainer's own recompute, and truncated importance sampling (TIS) against the sampler by default
whenever the two differ by construction.

Why: an inference engine (vLLM, SGLang) computes the same distribution with other kernels, other
reduction orders and often another precision, so ``mu`` (sampler) != ``pi_old`` (trainer) even at
equal weights, and the PPO ratio silently becomes off-policy. Yao et al., "Your Efficient RL
Framework Secretly Brings You Off-Policy RL Training" (2025, the TIS blog post behind verl's
``rollout_is`` / ``tis_imp_ratio_cap`` and slime's ``--use-tis``) measure the gap and correct it
with the truncated weight ``min(pi_old / mu, C)``, ``C = 2``. Here:

- :class:`MismatchMeter` (fed by the trainer with each micro-batch's pre-update log-probs, the
  ``prox`` the objective also sees) logs per step, over loss tokens, with
  ``d = log pi_trainer - log mu``: ``mismatch/abs_mean`` = mean |d|, ``mismatch/abs_max`` =
  max |d|, and ``mismatch/k3_kl`` = mean of ``exp(d) - 1 - d`` (Schulman's k3 estimator of
  KL(mu || pi_trainer) from tokens sampled from mu; slime's ``train_rollout_logprob_diff`` /
  verl's ``rollout_probs_diff`` report the same quantities). It is logged for every backend;
  with ``hf`` it measures only rounding (and replayed data's staleness), and changes nothing.
- :func:`default_tis`: when the backend's engine is not the trainer's forward (``hf``) and the objective has a
  ``tis_level`` option that the config did not set, it becomes ``"token"`` (per-token weight
  ``exp(prox - old)`` truncated to ``[tis_low, tis_cap]`` = ``[0, 2]``, objectives/common.py).
  Deviation from the post: the weight uses the trainer's pre-update log-probs as ``pi_old``
  (rollwise's ``prox``), which is exactly the post's ``pi_fsdp`` with one update epoch. With
  ``hf`` nothing changes, so today's runs stay bit-identical. An explicit ``tis_level`` (even
  ``"off"``) is kept.
"""

from __future__ import annotations

import torch

from rollwise.registry import UserError


class MismatchMeter:
    """Accumulates the gap over a step's micro-batches; ``metrics()`` gives the step's values."""

    def __init__(self) -> None:
        self.abs_sum = 0.0
        self.k3_sum = 0.0
        self.abs_max = 0.0
        self.tokens = 0.0

    @torch.no_grad()
    def add(self, trainer_lp: torch.Tensor, sampler_lp: torch.Tensor, mask: torch.Tensor) -> None:
        """(B, T) trainer log-probs, sampler log-probs and loss mask (0 = not a loss token)."""
        on = mask != 0
        if not bool(on.any()):
            return
        d = (trainer_lp.float() - sampler_lp.float())[on].clamp(-20.0, 20.0)  # as the objectives' ratio guard
        self.abs_sum += float(d.abs().sum())
        self.k3_sum += float((torch.exp(d) - 1.0 - d).sum())
        self.abs_max = max(self.abs_max, float(d.abs().max()))
        self.tokens += float(on.sum())

    @classmethod
    def merge(cls, meters: list[MismatchMeter]) -> MismatchMeter:
        """One meter over the tokens of all ``meters`` (data-parallel ranks): sums added in
        order, maxima maxed."""
        out = cls()
        for m in meters:
            out.abs_sum += m.abs_sum
            out.k3_sum += m.k3_sum
            out.abs_max = max(out.abs_max, m.abs_max)
            out.tokens += m.tokens
        return out

    def metrics(self) -> dict[str, float]:
        if not self.tokens:
            return {}
        return {
            "mismatch/abs_mean": self.abs_sum / self.tokens,
            "mismatch/abs_max": self.abs_max,
            "mismatch/k3_kl": self.k3_sum / self.tokens,
        }


class StaleWeightsError(UserError):
    """Raised by the trainer when ``GapGuard`` fires: the CLI prints it without a traceback."""


class GapGuard:
    """The stale-weight alarm (docs/architecture.md §9; ``train.gap_guard``). A sampler that is a separate
    engine (vLLM, Ray workers) must hold the trainer's weights; when a weight push silently fails
    (sleep mode waking on old weights, a LoRA sync that delivers nothing: both reported against
    TRL and verl) the gap between the sampler's and the trainer's log-probs jumps, e.g. 0.015 ->
    0.201 nats per token at step 3 in the TRL report. ``check(gap)`` returns the message to stop
    with when ``gap`` (``mismatch/abs_mean``) exceeds ``ceiling``, or exceeds both ``floor`` and
    ``jump`` x the median of the earlier steps' gaps; else None (and the gap joins the history).
    Only meaningful for fresh rollouts: asynchrony and replay make old log-probs legitimately
    far, so the session turns the guard on only without them."""

    def __init__(self, ceiling: float, jump: float, floor: float):
        self.ceiling, self.jump, self.floor = ceiling, jump, floor
        self.history: list[float] = []

    def check(self, gap: float) -> str | None:
        base = sorted(self.history)[len(self.history) // 2] if self.history else None
        why = None
        if gap > self.ceiling:
            why = f"above train.gap_guard.ceiling = {self.ceiling}"
        elif base is not None and gap > self.floor and gap > self.jump * base:
            why = (
                f"{gap / max(base, 1e-12):.1f}x the median {base:.4f} of the earlier steps (train.gap_guard.jump = "
                f"{self.jump})"
            )
        if why is None:
            self.history.append(gap)
            return None
        return (
            f"the sampler's log-probs are {gap:.4f} nats per token from the trainer's ({why}): the rollout engine "
            "is most likely generating with stale weights (a weight push that did not arrive). The run stops before "
            "training on them; its last checkpoint is intact. Set train.gap_guard.enabled = false to train anyway"
        )


def default_tis(options, cfg, engine: str):
    """``options`` with ``tis_level = "token"`` when the sampler is not the trainer's forward
    (``engine``, the backend's declared kind, ``rollwise.compat.engine_kind``, is not ``'trainer'``),
    the objective has the option and the config did not set it."""
    if engine == "trainer" or "tis_level" in cfg.objective.options or not hasattr(options, "tis_level"):
        return options
    if options.tis_level != "off":
        return options
    return type(options).model_validate({**options.model_dump(), "tis_level": "token"})
