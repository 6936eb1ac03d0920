"""On-policy-distillation diagnostics: how well a candidate teacher's distillation gradient points
where the student's success lies (``rollwise distill-diagnose``; the run-loading half is
:mod:`rollwise.bench.distill`).

Paper: "On-policy distillation diagnostics" (arXiv 2605.10889, Apple; agents-and-rest.md). Training
free: at each prefix node of the student's own rollouts, compare, in the student's **logit space**,

- the distillation direction: minus the gradient of the reverse KL ``KL(p || q)`` of the student's
  next-token distribution ``p = softmax(z)`` from the teacher's ``q``, with respect to the student's
  logits ``z``: ``-dKL/dz_k = -p_k (log p_k - log q_k - KL)`` (:func:`kl_descent`);
- the success direction: a Monte-Carlo estimate of the logit direction that most raises the student's
  success, REINFORCE with a baseline on the same rollouts: ``(r - b) (e_y - p)`` at each position, the
  gradient of ``(r - b) log p_y`` (:func:`success_direction`), ``b`` the leave-one-out mean reward of
  the prompt's other rollouts (RLOO).

A rollout's **alignment** is the cosine of the two directions, each concatenated over the rollout's
completion positions (:func:`cosine`). Scores are reported separately on correct and incorrect
rollouts (the paper finds alignment far higher on incorrect ones) and per teacher or context
(a later checkpoint; the student itself with the answer in its context).

Deviations [RECON]: the paper's success direction comes from targeted rollouts per candidate token
(Monte-Carlo success of each branch, through the softmax Jacobian); ours is the cheaper
one-sample-per-rollout REINFORCE estimate the issue asks for, so a single rollout's score is noisy and
only averages over rollouts are meaningful. Conventions: the cosine with a zero vector is 0 (a teacher
equal to the student gives a zero distillation direction: no alignment, never NaN); rollouts whose
success direction is zero (``r = b``: every rollout of the prompt scored the same) carry no Monte-Carlo
signal and are left out of the means, counted in ``no_signal``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch


def kl_descent(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """(T, V) ``-d KL(p || q) / dz`` at each position, ``p`` / ``q`` the softmax of the (T, V) logits.
    Example: p = [0.5, 0.5], q = [0.8, 0.2] -> KL = 0.2231 and the direction is [0.3466, -0.3466]."""
    logp = torch.log_softmax(student_logits.double(), dim=-1)
    logq = torch.log_softmax(teacher_logits.double(), dim=-1)
    p = logp.exp()
    kl = (p * (logp - logq)).sum(dim=-1, keepdim=True)
    return -(p * (logp - logq - kl))


def reverse_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """(T,) ``KL(p || q)`` at each position."""
    logp = torch.log_softmax(student_logits.double(), dim=-1)
    logq = torch.log_softmax(teacher_logits.double(), dim=-1)
    return (logp.exp() * (logp - logq)).sum(dim=-1)


def success_direction(student_logits: torch.Tensor, tokens: torch.Tensor, weight: float) -> torch.Tensor:
    """(T, V) ``weight * (e_y - p)`` at each position: the logit gradient of ``weight * log p(y_t)``.
    Example: p = [0.5, 0.5], y = 0, weight 0.5 -> [0.25, -0.25]."""
    p = torch.softmax(student_logits.double(), dim=-1)
    onehot = torch.nn.functional.one_hot(tokens.long(), p.shape[-1]).to(p.dtype)
    return weight * (onehot - p)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine of the flattened ``a`` and ``b``; 0.0 when either is zero (never NaN)."""
    a, b = a.double().flatten(), b.double().flatten()
    na, nb = float(a.norm()), float(b.norm())
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float((a @ b) / (na * nb))


def loo_baselines(rewards: Sequence[float]) -> list[float]:
    """Each rollout's baseline: the mean reward of the prompt's other rollouts (0 for a single one).
    Example: [1, 0, 0, 1] -> [1/3, 2/3, 2/3, 1/3]."""
    n, total = len(rewards), sum(rewards)
    return [(total - r) / (n - 1) if n > 1 else 0.0 for r in rewards]


@dataclass(frozen=True)
class RolloutScore:
    """One student rollout against one teacher."""

    correct: bool
    alignment: float  # cosine of the distillation and success directions
    distill_norm: float  # norm of the distillation direction (0: the teacher agrees with the student)
    success_norm: float  # norm of the success direction (0: no Monte-Carlo signal)
    kl: float  # mean reverse KL per completion position


def score_rollout(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, tokens: torch.Tensor, reward: float, baseline: float
) -> RolloutScore:
    """Score one rollout: (T, V) logits of the student and the teacher at its T completion positions,
    its (T,) tokens, reward and baseline (``reward >= 0.5`` is correct, as held-out pass@k counts)."""
    d = kl_descent(student_logits, teacher_logits)
    s = success_direction(student_logits, tokens, reward - baseline)
    kl = reverse_kl(student_logits, teacher_logits)
    return RolloutScore(
        correct=reward >= 0.5,
        alignment=cosine(d, s),
        distill_norm=float(d.norm()),
        success_norm=float(s.norm()),
        kl=float(kl.mean()) if kl.numel() else 0.0,
    )


def summarise(scores: Sequence[RolloutScore]) -> dict:
    """Per class (``correct``, ``incorrect``, ``all``): rollouts, rollouts with a success signal, the
    mean alignment over those (None when there are none), the mean distillation-direction norm and the
    mean reverse KL over every rollout of the class."""
    out = {}
    for name, keep in (("correct", lambda s: s.correct), ("incorrect", lambda s: not s.correct), ("all", None)):
        sel = [s for s in scores if keep is None or keep(s)]
        live = [s for s in sel if s.success_norm > 0.0]
        out[name] = {
            "rollouts": len(sel),
            "with_signal": len(live),
            "no_signal": len(sel) - len(live),
            "alignment_mean": sum(s.alignment for s in live) / len(live) if live else None,
            "distill_norm_mean": sum(s.distill_norm for s in sel) / len(sel) if sel else None,
            "kl_mean": sum(s.kl for s in sel) / len(sel) if sel else None,
        }
    return out


def plot(result: dict, path: Path) -> Path:
    """Bars of the mean alignment per teacher, on correct and incorrect rollouts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["teachers"])
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(names), 3.6))
    width = 0.38
    for j, (cls, colour) in enumerate((("correct", "tab:green"), ("incorrect", "tab:red"))):
        vals = [result["teachers"][n]["summary"][cls]["alignment_mean"] or 0.0 for n in names]
        xs = [i + (j - 0.5) * width for i in range(len(names))]
        ax.bar(xs, vals, width, label=f"{cls} rollouts", color=colour)
    ax.axhline(0.0, color="black", lw=0.8)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, fontsize=8)
    ax.set_ylabel("alignment (cosine)")
    ax.set_title("distillation vs success direction", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
