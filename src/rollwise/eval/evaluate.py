"""Held-out evaluation: sample ``samples`` completions per held-out prompt at the evaluation
temperature with a generator seeded by the step (so training's sampling RNG is untouched),
and report ``eval/pass@1``, ``eval/pass@<k>``, ``eval/maj@<k>`` and ``eval/n_prompts``.
Evaluation generation is never charged to the training ledger.
"""

from __future__ import annotations

import time

import torch

from rollwise.eval.metrics import maj_at_k, pass_at_k
from rollwise.types import Plan, Request, Sampling


def heldout_subset(prompts, n: int) -> list:
    """``eval.n_prompts`` of the held-out split: ``n`` prompts evenly spaced through it (all of them when
    ``n`` covers it), so a split listed by level keeps every level in its share."""
    prompts = list(prompts)
    if n >= len(prompts):
        return prompts
    return [prompts[i * len(prompts) // n] for i in range(n)]


def evaluate(
    pool, prompts, cfg, sampling: Sampling, seed: int, step: int, version: int, outcomes: dict | None = None
) -> dict[str, float]:
    """The held-out metrics (module docstring); ``outcomes``, when given, is filled with each prompt's
    correct flags (prompt id -> [bool], unverified samples left out) for the pass-rate predictor."""
    prompts = heldout_subset(prompts, cfg.n_prompts)
    temp = sampling.temperature if cfg.temperature is None else cfg.temperature
    smp = Sampling(temp, sampling.top_p, sampling.max_new_tokens)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    t0 = time.perf_counter()
    results = pool.rollouts(Plan(tuple(Request(p, cfg.samples) for p in prompts)), version, smp, gen, charge=False)
    by_prompt: dict[str, list] = {}
    for prompt, r in results:
        by_prompt.setdefault(prompt.id, []).append(r)
    out: dict[str, float] = {"eval/n_prompts": float(len(by_prompt))}
    ks = sorted({1, *cfg.k})
    sums = {k: 0.0 for k in ks}
    maj = {k: 0.0 for k in cfg.k}
    unverified = 0
    for pid, rolls in by_prompt.items():
        scores = [r.verdict.score for r in rolls]
        unverified += sum(s is None for s in scores)
        correct = [None if s is None else s >= 0.5 for s in scores]
        if outcomes is not None:
            outcomes[pid] = [x for x in correct if x is not None]
        n, c = len(rolls), sum(bool(x) for x in correct)
        for k in ks:
            sums[k] += pass_at_k(n, c, k)
        answers = [
            r.verdict.details.get("answer", r.text.strip()) if r.verdict.score is not None else None for r in rolls
        ]
        for k in cfg.k:
            maj[k] += maj_at_k(answers, correct, k)
    m = max(1, len(by_prompt))
    for k in ks:
        out[f"eval/pass@{k}"] = sums[k] / m
    for k in cfg.k:
        out[f"eval/maj@{k}"] = maj[k] / m
    out["eval/unverified"] = float(unverified)
    out["eval/mean_length"] = sum(len(r.completion_ids) for _, r in results) / max(1, len(results))
    out["time/eval_s"] = time.perf_counter() - t0
    return out
