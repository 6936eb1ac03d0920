"""D3S: dynamic dual-level down-sampling of the training batch (rows, then tokens).

Paper: "Learning More with Less: A Dynamic Dual-Level Down-Sampling Framework for Efficient
Policy Optimization" (D3S), arXiv 2509.22115, ICLR 2026 (allocation.md §8). The paper's code
was not available; the criteria are from its abstract, the details are the spec's
reconstruction [RECON] and are marked so below.

Where it acts: after advantages and ``collate``, before the optimizer step (the loop calls
``Run.downsample``, which calls :func:`apply`). Config: ``[batch.d3s]`` (``enabled = true``).

1. **Sample level** (stage S3). In each group (``sample_scope = "group"``, the intra-group
   variant "D3S-I" the spec recommends) keep ``m = ceil(rho_s(t) * G)`` of the group's ``G``
   rows: the subset with the largest (population) variance of the advantages. The max-variance
   subset of size m is always "the j largest plus the m - j smallest" for some j (the PODS rule,
   arXiv 2504.13818), so :func:`max_variance_subset` scans j = 0..m. With
   ``sample_scope = "batch"`` the same rule runs over every row of the batch. Advantages are
   **not** recomputed on the kept subset [RECON, spec default]. Dropped rows leave the batch
   (so the trainer does not forward them: this is where D3S saves compute) and are counted as
   ``d3s/rows``.
2. **Token level** (stage S5). Score every loss token of the kept rows by ``|A_{i,t}| * H_{i,t}``
   and keep the top ``ceil(rho_k(t) * #tokens)`` in the loss mask, over the whole batch
   (``token_scope = "batch"``, default) or per row (``"sequence"``). ``A_{i,t}`` is the row's
   advantage (or the per-token advantage when an estimator provides one). With one advantage
   per row, per-row selection reduces to ranking by entropy; the batch scope is where ``|A|``
   matters. Ties keep the earlier token. Masked tokens still pass through the forward/backward
   pass (a dense transformer cannot skip them): token selection changes the gradient and
   lowers ``cost/trained_tokens`` (loss tokens), not compute.
3. **Schedule** [RECON, form unverified]: ``rho(t) = start + (1 - start) * min(1, t / R)``,
   linear from ``sample_start`` / ``token_start`` (default 0.5) at step 0 to 1.0 at step
   ``R = ramp_steps`` (default ``ramp * train.steps``, ramp 0.6: the spec's "first 50-70% of
   training"), then 1.0. ``schedule = "constant"`` keeps the start values (ablations; with
   ``token_level = false`` it is the paper's single-level "D1S" ablation).

Entropy source (``entropy``): ``"sampler"`` (default) reads ``H`` of the distribution each token
was actually drawn from, recorded by the hf backend during generation
(``HFBackend.record_entropy``, ``Rollout.entropies``): the behaviour policy pi_old, which the
spec allows, at the cost of one softmax reduction per decode step. Rows without recorded
entropies (other backends, continued prefixes) make the run compute them for that batch with
one no-grad forward of the current policy (``Trainer.token_entropy``; metric
``d3s/entropy_from_trainer`` = 1). ``"trainer"`` always does that forward: pi_theta before the
update, exact but one extra forward per step. Either way entropies are needed (read or computed)
only while ``rho_k < 1`` (:func:`needs_entropy`): once the ramp reaches 1.0 no entropy forward
is made. The run counts the down-sampling time (that forward included) in ``time/train_s``.

Metrics: ``d3s/rows`` (rows dropped), ``d3s/rho_s``, ``d3s/rho_k``, ``d3s/token_frac``
(kept / candidate loss tokens), ``d3s/adv_var_before`` and ``d3s/adv_var_after`` (variance of
the included rows' advantages), ``d3s/entropy_from_trainer``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch

from rollwise.config import D3SOptions as Options  # noqa: F401 (the schema lives in config.py)
from rollwise.types import Batch, Rollout

# ---------------------------------------------------------------------------- schedule


def ratio(step: int, start: float, ramp_steps: int, schedule: str = "linear") -> float:
    """rho(t): ``start`` at step 0, linear to 1.0 at ``ramp_steps``, then 1.0 (``constant``: ``start``).

    Example: start 0.5, ramp 60 -> rho(0) = 0.5, rho(30) = 0.75, rho(60) = rho(99) = 1.0.
    """
    if schedule == "constant":
        return start
    if ramp_steps <= 0:
        return 1.0
    return start + (1.0 - start) * min(1.0, step / ramp_steps)


def ramp_length(opts: Options, train_steps: int) -> int:
    return opts.ramp_steps if opts.ramp_steps is not None else int(round(opts.ramp * train_steps))


def ratios(step: int, train_steps: int, opts: Options) -> tuple[float, float]:
    """(rho_s, rho_k) at training step ``step``; a level that is off stays at 1.0."""
    ramp = ramp_length(opts, train_steps)
    rho_s = ratio(step, opts.sample_start, ramp, opts.schedule) if opts.sample_level else 1.0
    rho_k = ratio(step, opts.token_start, ramp, opts.schedule) if opts.token_level else 1.0
    return rho_s, rho_k


def needs_entropy(step: int, train_steps: int, opts: Options) -> bool:
    """Whether :func:`apply` at ``step`` reads token entropies: only while ``rho_k < 1``."""
    return opts.token_level and ratios(step, train_steps, opts)[1] < 1.0


def keep_count(rho: float, n: int) -> int:
    """``ceil(rho * n)`` (at least 1 when n > 0); the epsilon absorbs float noise (0.7 * 10)."""
    return 0 if n <= 0 else max(1, min(n, math.ceil(rho * n - 1e-9)))


# ---------------------------------------------------------------------------- sample level


def max_variance_subset(values: torch.Tensor, m: int) -> torch.Tensor:
    """Indices (sorted) of the size-``m`` subset of ``values`` (n,) with the largest population
    variance: the best "j largest + (m - j) smallest", j = 0..m (ties: the smallest j).

    Example: A = [-0.425, -0.225, 0.075, 0.575], m = 3 -> j = 1 keeps {0.575, -0.425, -0.225}
    (variance 0.1867; j = 0: 0.0422, j = 2: 0.1667, j = 3: 0.1089) -> indices [0, 1, 3].
    """
    n = int(values.numel())
    if m >= n:
        return torch.arange(n)
    if m <= 0:
        return torch.zeros(0, dtype=torch.long)
    order = torch.sort(values.double(), stable=True).indices
    v = values.double()[order]
    best_j, best_var = 0, -1.0
    for j in range(m + 1):
        pick = torch.cat([v[: m - j], v[n - j :]]) if j else v[:m]
        var = float(((pick - pick.mean()) ** 2).mean())
        if var > best_var + 1e-12:
            best_j, best_var = j, var
    idx = torch.cat([order[: m - best_j], order[n - best_j :]]) if best_j else order[:m]
    return torch.sort(idx).values


def select_rows(
    advantages: torch.Tensor, group_index: torch.Tensor, candidates: torch.Tensor, rho: float, scope: str = "group"
) -> torch.Tensor:
    """(B,) bool: the candidate rows kept by the max-variance rule, ``ceil(rho * G)`` per group
    (``scope="group"``) or ``ceil(rho * B)`` over all candidates (``"batch"``)."""
    keep = torch.zeros_like(candidates, dtype=torch.bool)
    cand = torch.nonzero(candidates).flatten()
    parts = [cand] if scope == "batch" else [cand[group_index[cand] == g] for g in torch.unique(group_index[cand])]
    for rows in parts:
        chosen = max_variance_subset(advantages[rows], keep_count(rho, int(rows.numel())))
        keep[rows[chosen]] = True
    return keep


# ---------------------------------------------------------------------------- token level


def token_scores(abs_advantage: torch.Tensor, entropy: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) ``|A| * H`` on loss tokens, 0 elsewhere; ``abs_advantage`` is (B, 1) or (B, T)."""
    s = abs_advantage.abs() * entropy.clamp(min=0.0)
    return torch.where(loss_mask > 0, s, torch.zeros_like(s))


def _top(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest of a 1-D tensor; ties keep the lower index."""
    return torch.sort(scores, descending=True, stable=True).indices[:k]


def select_tokens(scores: torch.Tensor, loss_mask: torch.Tensor, rho: float, scope: str = "batch") -> torch.Tensor:
    """(B, T) float mask: ``loss_mask`` restricted to the top ``ceil(rho * n)`` loss tokens by score
    (n = loss tokens of the batch, or of each row with ``scope="sequence"``)."""
    out = torch.zeros_like(loss_mask)
    on = loss_mask > 0
    if scope == "batch":
        pos = torch.nonzero(on.flatten()).flatten()
        keep = pos[_top(scores.flatten()[pos], keep_count(rho, int(pos.numel())))]
        out.view(-1)[keep] = loss_mask.flatten()[keep]
        return out
    for i in range(loss_mask.shape[0]):
        pos = torch.nonzero(on[i]).flatten()
        keep = pos[_top(scores[i, pos], keep_count(rho, int(pos.numel())))]
        out[i, keep] = loss_mask[i, keep]
    return out


# ---------------------------------------------------------------------------- the stage


def sampler_entropy(rows: Sequence[Rollout], batch: Batch) -> torch.Tensor | None:
    """(B, T) sampler entropies aligned with ``batch`` (completion positions as in ``collate``), or
    None when any row with completion tokens has none recorded."""
    out = torch.zeros_like(batch.old_logprobs)
    for i, r in enumerate(rows):
        c = len(r.completion_ids)
        if not c:
            continue
        if r.entropies is None or len(r.entropies) != c:
            return None
        p = len(r.prompt_ids)
        out[i, p : p + c] = torch.tensor(r.entropies, dtype=out.dtype)
    return out


def _var(x: torch.Tensor) -> float:
    return float(((x - x.mean()) ** 2).mean()) if x.numel() else 0.0


def apply(batch: Batch, entropy: torch.Tensor | None, step: int, train_steps: int, opts: Options) -> tuple[Batch, dict]:
    """Down-sample ``batch`` at training step ``step``; returns the new batch (dropped rows
    removed, token mask applied, global counts recomputed) and ``d3s/*`` metrics. ``entropy``
    (B, T) is needed only while ``rho_k < 1`` (:func:`needs_entropy`); it is not read otherwise."""
    rho_s, rho_k = ratios(step, train_steps, opts)
    candidates = batch.loss_mask.sum(dim=1) > 0
    metrics = {
        "d3s/rho_s": rho_s,
        "d3s/rho_k": rho_k,
        "d3s/adv_var_before": _var(batch.advantages[candidates].double()),
    }
    keep = candidates
    if opts.sample_level and rho_s < 1.0:
        keep = select_rows(batch.advantages, batch.group_index, candidates, rho_s, opts.sample_scope)
    metrics["d3s/rows"] = int(candidates.sum()) - int(keep.sum())
    metrics["d3s/adv_var_after"] = _var(batch.advantages[keep].double())
    mask = torch.where(keep[:, None], batch.loss_mask, torch.zeros_like(batch.loss_mask))
    before = int((mask > 0).sum())
    if opts.token_level and rho_k < 1.0 and before:
        if entropy is None:
            raise ValueError("D3S token selection needs the (B, T) entropy tensor")
        adv = batch.token_advantages if batch.token_advantages is not None else batch.advantages[:, None]
        mask = select_tokens(token_scores(adv, entropy, mask), mask, rho_k, opts.token_scope)
    metrics["d3s/token_frac"] = int((mask > 0).sum()) / before if before else 1.0
    batch = dataclasses.replace(batch, loss_mask=mask)
    batch = batch.rows(torch.nonzero(keep).flatten())
    n_tokens = int(batch.loss_mask.sum().item()) if batch.loss_mask.numel() else 0  # as collate counts
    n_seqs = int((batch.loss_mask.sum(dim=1) > 0).sum()) if batch.loss_mask.numel() else 0
    return dataclasses.replace(batch, num_loss_tokens=n_tokens, num_sequences=n_seqs), metrics
