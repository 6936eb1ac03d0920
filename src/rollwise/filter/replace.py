"""Group operations of "replace" dynamic sampling: zero-variance groups are overwritten by copies
of good groups from the same batch (selection.md §4).

Origin: POLARIS (hkunlp.github.io/blog/2025/Polaris; ``ray_trainer.py`` ``replace_bad_samples``)
as implemented in SkyRL (``trainer.algorithm.dynamic_sampling.type = "replace"``,
``trainer_utils.handle_replace_sampling``). This module holds the pure pieces; the step-level
behaviour (discarding a batch and generating another, logging) is the ``replace`` type of
:class:`rollwise.control.rounds.DynamicSampling`.

:func:`replace_bad` on one batch of B groups:

1. **Classify.** A group is *good* when ``is_good(group)``; the default is SkyRL's rule, not
   :func:`is_zv` (more than one verified reward and all equal), so a group of one rollout is
   good. In the loop, good = "every configured filter keeps it" (with ``filter.names =
   ["zero_variance"]`` that is "not zero-variance", except that rollwise's filter also drops
   groups of one verified rollout, which carry no advantage under any estimator here).
2. **Gate.** Only when ``#good > min_ratio * B`` (strictly; :func:`passes_gate`) is the batch
   used; otherwise ``keep_sampling`` is True and the groups come back unchanged (the caller
   discards the batch). SkyRL: ``min_replace_ratio = 0.3``.
3. **Sources** (:func:`pick_sources`). With ``#good >= #bad`` the first ``#bad`` entries of a
   random permutation of the good groups, so each is copied at most once; otherwise draws with
   replacement, so a good group may be copied several times.
4. **Copy.** ``merge=True`` (SkyRL): each copy takes its source's prompt (uid) and so *joins the
   source group*: a source copied m times becomes one group of ``(m + 1) n`` rollouts (the same
   ``Rollout`` records repeated); the output has ``#good`` groups and the same number of rollouts
   as the input (for equal group sizes). ``merge=False`` (POLARIS, whose copy keeps the bad
   prompt's uid): the copy is a group of its own in the bad group's slot, with the source's
   prompt and rollouts, so its advantages equal the source's; the output keeps B groups. Copies
   carry their rewards; nothing is re-scored (POLARIS re-scores against the bad prompt's answer,
   which the spec reads as a bug).

**Side effects** (tested in tests/unit/filter/test_replace.py):

- A duplicated group counts twice (m + 1 times) in the loss: under ``token_mean`` each of its
  tokens appears twice in the numerator and the global ``num_loss_tokens`` counts them twice, so
  the step's denominator is that of a full batch of B groups, and the trained *distinct* prompts
  are only ``#good``.
- Merged groups change the advantage scale. The mean is unchanged. The *unbiased* std (``grpo``'s
  default) of the doubled sample shrinks by ``sqrt(2(n-1)/(2n-1))`` (0.966 at n = 8), so
  advantages grow by ``1/0.966 = 3.5%``: n = 8, k = 4 gives ``±0.5/0.5345 = ±0.935`` before and
  ``±0.5/0.5164 = ±0.968`` after. The population std is unchanged (``grpo`` with
  ``std = "population"``, and ``dr_grpo``, give exactly the source's advantages). With
  ``merge=False`` every estimator gives the copy exactly its source's advantages.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rollwise.types import Group


def is_zv(group: Group, tol: float = 0.0) -> bool:
    """selection.md §0.3 / §4: more than one verified reward, all equal (within ``tol``); a group
    of one is good here (``Group.is_zero_variance`` with ``short_is_zv=False``)."""
    return group.is_zero_variance(tol, short_is_zv=False)


def passes_gate(n_good: int, batch_size: int, min_ratio: float) -> bool:
    """``n_good > min_ratio * batch_size`` (strict): B = 10, ratio 0.3 needs 4 good groups (3 > 3.0 is false)."""
    return n_good > min_ratio * batch_size


def pick_sources(n_good: int, n_bad: int, rng: random.Random) -> list[int]:
    """Index into the good groups for each bad group: a permutation's first ``n_bad`` entries when
    ``n_good >= n_bad`` (each good group at most once), else uniform draws with replacement."""
    if n_bad <= 0:
        return []
    if n_good >= n_bad:
        order = list(range(n_good))
        rng.shuffle(order)
        return order[:n_bad]
    return [rng.randrange(n_good) for _ in range(n_bad)]


@dataclass(frozen=True)
class Replaced:
    groups: list[Group]  # the batch after replacement (the input unchanged when keep_sampling)
    keep_sampling: bool  # the gate failed: discard this batch and generate another
    replaced: int  # bad groups overwritten by copies
    distinct: int  # distinct groups (prompts) left: #good, or B when the gate failed


def replace_bad(
    groups: Sequence[Group],
    rng: random.Random,
    min_ratio: float = 0.3,
    merge: bool = True,
    is_good: Callable[[Group], bool] = lambda g: not is_zv(g),
) -> Replaced:
    """Replace the bad groups of one batch by copies of its good groups (module docstring)."""
    groups = list(groups)
    good = [g for g in groups if is_good(g)]
    n_bad = len(groups) - len(good)
    if not passes_gate(len(good), len(groups), min_ratio):
        return Replaced(groups, True, 0, len(groups))
    sources = pick_sources(len(good), n_bad, rng)
    if merge:
        copies = Counter(sources)
        out = [Group(g.prompt, g.rollouts * (1 + copies[i])) if copies[i] else g for i, g in enumerate(good)]
    else:
        it = iter(sources)
        good_ids = {id(g) for g in good}
        out = [g if id(g) in good_ids else good[next(it)] for g in groups]
    return Replaced(out, False, n_bad, len(good))
