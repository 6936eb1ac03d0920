"""FAPO's flawed-positive penalty and its pluggable flaw detectors (reward shaping, ``[reward.fapo]``).

Paper: "Flawed-Aware Policy Optimization for Efficient and Reliable Reasoning" (FAPO),
arXiv 2510.22543 (ICLR 2026); code verl ``recipe/fapo`` (``reward_fn_reasoning.py``);
guidance.md §6. A *flawed positive* is a rollout with the right final answer but unreliable
reasoning (a guessed answer, a wrong step). Per rollout the paper's reward is ``R_RLVR + R_delta``
with ``R_RLVR = +1`` (correct) / ``-1`` (wrong) and ``R_delta = -lambda * 1[flawed]``, ``lambda = 1``:
+1 fully correct, 0 flawed positive, -1 wrong. A detector (FAPO-GenRM-4B in the paper) names the
*earliest* erroneous step of a correct rollout, or -1; only correct rollouts of the training
split are checked, and an output that cannot be parsed counts as **not** flawed.

Here (:func:`fapo_penalty`), on rollwise's 0/1 verifier scores: a row whose score is
``>= correct_at`` is checked by the detector; if it names a step the row's reward drops by
``penalty`` (default 0.5). ``0.5`` is the paper's ``lambda = 1`` moved to the 0/1 scale: the
paper's rewards are the affine image ``2r - 1`` of 0/1 scores, a flawed positive sits at the
midpoint (0 of [-1, 1], 0.5 of [0, 1]), and GRPO's ``(r - mean) / std`` is unchanged by that map
(up to ``eps``). So a flawed positive's advantage is positive iff the group has more wrong than
fully-correct rows, negative iff fewer, and 0 at equality (the paper's "parameter-free" switch).
Evaluation never shapes rewards, so the detector never sees held-out prompts.

The detectors (``rollwise.flaws``: a registry by name, the rule detector) sit on the ground floor,
written once for every stage that asks where a correct answer's working first goes wrong (this
penalty; R3L's and SCOPE's restarts, ``control/r3l.py``, ``control/scope.py``).

Deviation: the paper's detector is a trained generative reward model that judges any reasoning;
the rule detector only catches false arithmetic in written equations (it cannot see a guessed
answer with no working). GenRM training (the process reward ``1 - |t_hat - t*| / n``) is not built.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from rollwise.types import Prompt, Rollout


def fapo_penalty(
    rows: Sequence[Rollout], prompts: Mapping[str, Prompt], detector: Callable, penalty: float, correct_at: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """(B,) reward deltas (``-penalty`` on flawed positives, 0 elsewhere) and ``fapo/*`` metrics.

    Only rows with score ``>= correct_at`` are passed to ``detector``. Metrics:
    ``fapo/flawed_frac`` (flawed among the checked rows), ``fapo/undecided_frac``
    (checked rows the detector could not judge), ``fapo/checked`` (detector calls).
    """
    delta = torch.zeros(len(rows))
    checked = flawed = undecided = 0
    for i, r in enumerate(rows):
        if r.reward is None or r.reward < correct_at:
            continue
        checked += 1
        step = detector(prompts.get(r.prompt_id), r.text)
        if step is None:
            undecided += 1
        elif step != -1:
            flawed += 1
            delta[i] = -penalty
    n = max(checked, 1)
    return delta, {"fapo/flawed_frac": flawed / n, "fapo/undecided_frac": undecided / n, "fapo/checked": float(checked)}
