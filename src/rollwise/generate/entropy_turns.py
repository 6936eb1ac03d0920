"""Training on high-entropy turns only (``task.high_entropy_turns``; DART, arXiv 2509.23866, issue #44).

DART ("Efficient Multi-turn RL for GUI Agents via Decoupled Training and Adaptive Data Curation")
trains step-wise: every step of a trajectory is a sample, and its data curation keeps only the steps
on which the policy was uncertain. The released code (a commented-out path) ranks the batch's samples
by their mean token entropy and keeps the top fraction (docs/specs/systems.md §9, item 5). Here a
step is an episode's turn (``Turn``: policy ids ``[start, end)`` of ``Rollout.completion_ids``), so:

1. each turn of a call's training episodes scores the mean of the sampler's entropies
   (``Rollout.entropies``, recorded by the backend while it decoded) over its policy tokens;
2. the ``k = ceil(keep * turns)`` highest-scoring turns of the call stay in the loss (ties: the
   earlier episode, then the earlier turn, first); the other turns' policy tokens get
   ``loss_mask`` 0, like observation tokens. Their ids stay in the row, so the kept turns are
   still scored in their real context, and the episode's reward and advantage are unchanged
   (step-wise GRPO: every step carries its trajectory's advantage).

[RECON] The fraction: the paper does not publish it; ``task.high_entropy_turns`` defaults to 1 (every
turn) and ``configs/dart.toml`` sets 0.5. Turns are ranked within one generation call (a step's
episodes), the unit the code's batch would be here. An episode without entropies (an engine that
records none: refused at load, ``rollwise.compat.check_episode_transforms``) is left as it is.

Counts in ``metrics.jsonl``: ``entropy_turns/kept`` and ``entropy_turns/dropped`` (turns),
``entropy_turns/dropped_tokens`` (policy tokens taken out of the loss).
"""

from __future__ import annotations

import dataclasses
import math

from rollwise.types import Prompt, Rollout


def turn_entropies(rollout: Rollout) -> list[float | None]:
    """The mean sampler entropy of each turn's policy tokens (None: a turn with no policy token, or a
    rollout without entropies)."""
    ent, out = rollout.entropies, []
    for t in rollout.episode.turns:
        out.append(None if ent is None or t.end <= t.start else sum(ent[t.start : t.end]) / (t.end - t.start))
    return out


def keep_high_entropy_turns(out: list[tuple[Prompt, Rollout]], keep: float, cost=None) -> list[tuple[Prompt, Rollout]]:
    """``out`` with the policy tokens of all but the top ``ceil(keep * turns)`` turns (by mean entropy,
    over every episode of ``out``) out of the loss (module docstring). ``cost`` (a ``StepCost``), when
    given, counts ``entropy_turns/*``."""
    scored = [
        (h, i, j)
        for i, (_, r) in enumerate(out)
        if r.episode is not None
        for j, h in enumerate(turn_entropies(r))
        if h is not None
    ]
    k = math.ceil(keep * len(scored) - 1e-9)
    ranked = sorted(scored, key=lambda s: (-s[0], s[1], s[2]))  # stable: ties keep episode then turn order
    drop: dict[int, list[int]] = {}
    for _, i, j in ranked[k:]:
        drop.setdefault(i, []).append(j)
    tokens = 0
    res = list(out)
    for i, turns in drop.items():
        prompt, r = out[i]
        mask = list(r.loss_mask) if r.loss_mask is not None else [1] * len(r.completion_ids)
        for j in turns:
            t = r.episode.turns[j]
            tokens += sum(mask[t.start : t.end])
            mask[t.start : t.end] = [0] * (t.end - t.start)
        res[i] = (prompt, dataclasses.replace(r, loss_mask=tuple(mask)))
    if cost is not None:
        dropped = len(scored) - min(k, len(scored))
        cost.count(
            **{
                "entropy_turns/kept": len(scored) - dropped,
                "entropy_turns/dropped": dropped,
                "entropy_turns/dropped_tokens": tokens,
            }
        )
    return res
