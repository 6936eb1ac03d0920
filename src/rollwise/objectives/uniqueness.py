"""``uniqueness``: uniqueness-aware reweighting of correct rollouts by strategy-cluster size.

Paper: "Rewarding the Rare: Uniqueness-Aware RL for Creative Problem Solving in LLMs",
arXiv 2601.08763 (no code found); allocation.md §12a. The paper's abstract says advantages are
"reweighted inversely with cluster size", with clusters of high-level solution strategies given by
an LLM judge. The exact form is the spec's reconstruction:

1. a *clusterer* labels the rollouts of a group by strategy; ``n_c`` is a cluster's size;
2. ``u_i = (1 / n_{c(i)})^gamma``; over the group's correct rows (``A_i > 0``) the weights are
   normalised to mean 1: ``u~_i = u_i / mean_{j correct} u_j``;
3. ``A'_i = u~_i * A_i`` for correct rows; every other row keeps ``A_i``.

``A`` is the ``grpo`` estimator's advantage (same ``eps`` / ``std`` options).

[RECON] (unverified, as the spec says): ``gamma = 1``; only the correct rows are clustered
(``cluster_over = "correct"``; ``"all"`` clusters every row of the group, sizes then count wrong
rows too, the normalisation stays over correct rows); mean-1 normalisation; a clusterer that
fails (returns ``None``) gives ``u = 1`` for the group (plain GRPO).

Deviation: the paper's clusterer is an LLM judge of *high-level strategy*. The built-in
clusterers are simple and rule-based, for the built-in tasks:

- ``"text"`` — rows with the same normalised completion (stripped, lower case, runs of
  whitespace collapsed) share a cluster;
- ``"shape"`` — the same after replacing every run of digits with ``#``: rows that carry out the
  same *form* of working (e.g. the same sequence of steps in an arithmetic chain-of-thought) share
  a cluster whatever the numbers. On answer-only arithmetic completions every correct row has the
  same shape, so the weights are all 1 (GRPO recovered); the method is meant for tasks whose
  completions show their working.

A clusterer is any callable ``(texts: list[str]) -> list[int] | None`` (one label per text, the
rows of one group); choose one by name or by ``"package.module:attr"`` (an LLM judge, say).

Properties (§12a.3): all correct rows in one cluster -> ``A' = A``; a correct singleton cluster
gets the largest weight; wrong rows unchanged; the mean weight over correct rows is 1.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Literal

import torch
from pydantic import Field, field_validator

from rollwise.objectives.advantages import GrpoOptions, grpo
from rollwise.objectives.groups import Groups
from rollwise.registry import Registry
from rollwise.types import Advantages


def _normalise(text: str) -> str:
    return " ".join(text.strip().lower().split())


def _labels(keys: Sequence[str]) -> list[int]:
    seen: dict[str, int] = {}
    return [seen.setdefault(k, len(seen)) for k in keys]


def text_clusters(texts: Sequence[str]) -> list[int]:
    """Cluster by normalised text. Example: ["12", " 12 ", "13"] -> [0, 0, 1]."""
    return _labels([_normalise(t) for t in texts])


def shape_clusters(texts: Sequence[str]) -> list[int]:
    """Cluster by normalised text with digit runs replaced by '#'.
    Example: ["7+5=12,=12", "1+1=2,=2", "=12"] -> [0, 0, 1]."""
    return _labels([re.sub(r"\d+", "#", _normalise(t)) for t in texts])


CLUSTERERS = Registry("clusterer")
CLUSTERERS.register("text", text_clusters)
CLUSTERERS.register("shape", shape_clusters)


class UniquenessOptions(GrpoOptions):
    gamma: float = Field(
        1.0, ge=0.0, description="Exponent in u = (1/cluster size)^gamma (spec [RECON] 1.0; 0 = GRPO)."
    )
    clusterer: str = Field(
        "shape",
        description="Strategy clusterer: 'text', 'shape' (digits ignored), or 'package.module:attr', a "
        "callable (texts of one group) -> labels or None.",
    )
    cluster_over: Literal["correct", "all"] = Field(
        "correct", description="Rows clustered: only the correct ones (A > 0; spec [RECON]) or all rows of the group."
    )

    @field_validator("clusterer")
    @classmethod
    def _known(cls, v: str) -> str:
        CLUSTERERS.resolve(v)  # raises UserError naming the known clusterers
        return v


def weights(labels: torch.Tensor, correct: torch.Tensor, gamma: float) -> torch.Tensor:
    """(B,) mean-1 uniqueness weights over the correct rows of ONE group (1.0 elsewhere).

    ``labels`` (B,) long cluster labels (only rows counted in clusters matter), ``correct`` (B,) bool.
    Example: correct rows with labels [a, a, b] -> sizes [2, 2, 1] -> u = [0.5, 0.5, 1]
    -> mean 2/3 -> [0.75, 0.75, 1.5].
    """
    sizes = Groups.of(labels).count(labels.float())
    u = sizes.pow(-gamma)
    if not bool(correct.any()):
        return torch.ones_like(u)
    u = u / u[correct].mean()
    return torch.where(correct, u, torch.ones_like(u))


def uniqueness(
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    opts: UniquenessOptions | None = None,
    *,
    completion_texts: Sequence[str] | None = None,
) -> Advantages:
    """GRPO advantage with the correct rows reweighted inversely to their strategy cluster's size.

    Example (one group, unbiased std, gamma = 1): r = [1, 1, 1, 0] -> A = [0.5, 0.5, 0.5, -1.5];
    clusters of the correct rows [a, a, b] -> weights [0.75, 0.75, 1.5]
    -> A' = [0.375, 0.375, 0.75, -1.5].
    """
    opts = opts or UniquenessOptions()
    if completion_texts is None:
        raise ValueError("advantage 'uniqueness' needs completion_texts (one str per row; rollwise.objectives.inputs)")
    if len(completion_texts) != rewards.numel():
        raise ValueError(f"completion_texts has {len(completion_texts)} entries for {rewards.numel()} rows")
    cluster: Callable = CLUSTERERS.get(opts.clusterer)
    base = grpo(rewards, group_index, GrpoOptions(**{k: getattr(opts, k) for k in GrpoOptions.model_fields}))
    a = base.values
    out = a.clone()
    groups = Groups.of(group_index)
    for g in range(groups.num):
        rows = (groups.inverse == g).nonzero().flatten()
        correct = a[rows] > 0
        if not bool(correct.any()):
            continue
        members = rows if opts.cluster_over == "all" else rows[correct]
        labels = cluster([completion_texts[int(i)] for i in members])
        if labels is None:  # the clusterer could not decide: no reweighting (plain GRPO) for this group
            continue
        if len(labels) != len(members):
            raise ValueError(f"clusterer {opts.clusterer!r} returned {len(labels)} labels for {len(members)} texts")
        lab = torch.full((rows.numel(),), -1, dtype=torch.long)
        lab[correct if opts.cluster_over == "correct" else torch.ones_like(correct)] = torch.as_tensor(
            labels, dtype=torch.long
        )
        if opts.cluster_over == "correct":  # wrong rows: their own singleton labels, never counted with correct ones
            lab[~correct] = -2 - torch.arange(int((~correct).sum()))
        w = weights(lab, correct, opts.gamma)
        out[rows] = torch.where(correct, a[rows] * w.to(a.dtype), a[rows])
    return Advantages(out, base.include)


uniqueness.Options = UniquenessOptions  # type: ignore[attr-defined]
uniqueness.inputs = ("completion_texts",)  # type: ignore[attr-defined]
