"""``rollout_replay``: a FIFO buffer of recent groups that supplies part of every training batch.

Paper: Sun et al. 2025, "Improving Data Efficiency for LLM Reinforcement Fine-tuning Through
Difficulty-targeted Online Data Selection and Rollout Replay", arXiv 2506.05316 (NeurIPS 2025);
code github.com/ASTRAL-Group/data-efficient-llm-rl at 59df9187
(``ray_trainer_teacher_replay.py``); docs/specs/allocation.md §7.3. Pairs with the ``dots``
controller (:mod:`rollwise.control.dots`), but works behind any controller.

Only a share ``1 - replay_fraction`` of each batch is freshly generated; the rest are whole old
groups (all their rollouts, token ids, rewards and **behaviour log-probs** ``mu``, i.e.
``Rollout.logprobs`` and ``policy_version``, as generated). Per step:

1. ``mix(fresh, state)``: unless ``state.step < warmup_steps`` (the code's round 0, where
   nothing is replayed and the buffer only fills), draw
   ``round(len(fresh) * replay_fraction / (1 - replay_fraction))`` groups uniformly without
   replacement from the buffer (``replay_strategy = random``; with ``fresh`` = sigma B groups
   that is (1 - sigma) B), or all of them if the buffer holds fewer. With ``max_replay_age`` set,
   only groups at most that many policy versions old are eligible (``state.policy_version`` minus
   the oldest ``policy_version`` of the group's rollouts). The batch is the fresh groups followed
   by the replayed ones.
2. ``add(kept)`` (the loop calls it after ``mix``, with this step's kept fresh groups): append,
   deduplicate by prompt (the newest group of each prompt stays), keep the newest
   ``buffer_size`` groups.
3. Advantages are recomputed every step on the concatenated batch by the configured estimator
   (the loop's advantage stage is a pure function of rewards and group ids), as in the code.

**The replay-aware clip** (§7.3.4) needs no new objective option. The code's per-token loss is
``max(-A r, -A clip(r, r_old (1 - eps), r_old (1 + eps)))`` with ``r = pi_theta / mu`` and
``r_old = pi_old / mu``. Since ``r_old > 0`` this is ``r_old * max(-A u, -A clip(u, 1 - eps,
1 + eps))`` with ``u = pi_theta / pi_old``: the PPO clip around ``pi_old`` times the behaviour
weight ``pi_old / mu``, untruncated and per token. That is every clipped objective with
``objective.options = {tis_level = "token", tis_cap = 1e9}`` (``grpo``, ``dapo``,
``decoupled_ppo``; TOML has no null, and ``1e9`` exceeds the largest weight the objectives can
form, ``e^20``): the trainer then recomputes ``pi_old`` (``prox_logprobs``, the pre-update
policy) for every row, and the batch's ``old_logprobs`` are the stored ``mu``. For fresh rows
``mu`` is the sampler's log-prob of the current policy, so the weight is 1 up to
sampler/trainer numerical mismatch and the loss is standard PPO (tested in
tests/unit/replay/test_rollout_replay.py). Deviation: the code stores the trainer's recomputed
``old_log_prob`` as ``mu``; rollwise stores the sampler's log-probs (what the rollout was
actually drawn from).

Equivalences (tests): ``replay_fraction = 0`` or ``max_replay_age = 0`` (only groups of the
current version, and the buffer holds none) train on exactly the fresh groups, as ``on_policy``.

Differences from the code: the code truncates the buffer to ``buffer_size - sigma B`` before
appending and deduplicates at the next step (a moment with duplicates that count towards the
size); here deduplication comes first, so the buffer keeps up to ``buffer_size`` distinct
prompts; its "fresh batch appended twice" quirk is not reproduced (its duplicates are removed by
that deduplication anyway). ``warmup_steps`` (default 0) replaces the code's notion of round 0:
set it to DOTS's ``steps_per_round``. ``max_replay_age`` is ours (None = the paper's FIFO only;
it was ``max_staleness``, the name of ``train.async``'s bound, and is refused under that name).
Replayed groups are not re-added: only fresh groups enter the buffer.

Logs nothing of its own (``cost/trained_tokens`` includes the replayed rows). State
(checkpointed): the buffer (groups, in order) and the sampling RNG.
"""

from __future__ import annotations

import math
import random
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from rollwise.registry import Compat
from rollwise.types import Group, ReplaySource


class RolloutReplayOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # old option name -> new: refused naming the new one (rollwise.registry.validate_options); ``max_staleness``
    # is the bound of train.async, a different knob
    renamed: ClassVar[dict[str, str]] = {"max_staleness": "max_replay_age"}
    buffer_size: int = Field(512, ge=1, description="Most groups in the FIFO buffer (the script's buffer_size).")
    replay_fraction: float = Field(
        0.5,
        ge=0.0,
        lt=1.0,
        description="Share of each training batch drawn from the "
        "buffer: round(fresh * f / (1 - f)) replayed groups per step (the paper's 1 - sigma; "
        "0 = on-policy).",
    )
    warmup_steps: int = Field(
        0,
        ge=0,
        description="Steps at the start that replay nothing and only fill the buffer "
        "(DOTS: its steps_per_round, the code's round 0).",
    )
    max_replay_age: int | None = Field(
        None,
        ge=0,
        description="Replay only groups at most this many policy versions old "
        "(None = any group in the buffer; 0 = on-policy).",
    )


def group_version(group: Group) -> int:
    """The oldest policy version among a group's rollouts (its staleness reference)."""
    return min((r.policy_version for r in group.rollouts), default=0)


class RolloutReplay(ReplaySource):
    """DOTS rollout replay (arXiv 2506.05316): fresh groups plus uniformly drawn buffered groups."""

    Options = RolloutReplayOptions
    compat = Compat(replays_rows=True)  # a buffered group is trained again: POISE keeps its rows' baselines

    def __init__(self, cfg, options: RolloutReplayOptions | None, seed: int):
        self.opts = options if options is not None else self.Options()
        self.rng = random.Random(f"rollout_replay-{seed}")
        self.buffer: list[Group] = []  # oldest first, one group per prompt

    def replay_count(self, n_fresh: int) -> int:
        """Groups to replay next to ``n_fresh`` fresh ones (round half up): 8 fresh at 0.5 -> 8;
        3 fresh at 0.25 -> 1."""
        f = self.opts.replay_fraction
        return int(math.floor(n_fresh * f / (1.0 - f) + 0.5 + 1e-9))

    def eligible(self, state) -> list[Group]:
        if self.opts.max_replay_age is None:
            return list(self.buffer)
        version = getattr(state, "policy_version", 0)
        return [g for g in self.buffer if version - group_version(g) <= self.opts.max_replay_age]

    def mix(self, fresh: list[Group], state) -> list[Group]:
        if getattr(state, "step", 0) < self.opts.warmup_steps:
            return list(fresh)
        n = self.replay_count(len(fresh))
        if n <= 0:
            return list(fresh)
        pool = self.eligible(state)
        replayed = self.rng.sample(pool, min(n, len(pool))) if pool else []
        return list(fresh) + replayed

    def add(self, groups: list[Group]) -> None:
        newest: dict[str, Group] = {}
        for g in self.buffer + list(groups):  # later groups win; dict order = first insertion
            newest.pop(g.prompt.id, None)
            newest[g.prompt.id] = g
        self.buffer = list(newest.values())[-self.opts.buffer_size :]

    def state_dict(self) -> dict:
        return {"buffer": list(self.buffer), "rng": self.rng.getstate()}

    def load_state_dict(self, s: dict) -> None:
        self.buffer = list(s["buffer"])
        v, internal, gauss = s["rng"]
        self.rng.setstate((v, tuple(internal), gauss))
