"""``success_pool``: past successes of a prompt mixed into its groups that have none (DART's experience pool).

Paper: "Efficient Multi-turn Reinforcement Learning for GUI Agents via Decoupled Training and Adaptive
Data Curation" (DART), arXiv 2509.23866; docs/specs/systems.md §9, item 5. For hard tasks, whose online
groups rarely hold a success, DART keeps an experience pool of successful trajectories and mixes one
in when a group has none, so that the group has a positive example and a non-zero advantage.

Per step (the loop's replay stage, docs/architecture.md §1):

1. ``mix(fresh, state)``: a fresh group with **no success** (no rollout whose reward reaches
   ``types.CORRECT``) whose prompt has a pooled success gets exactly one: the newest pooled success
   replaces the group's first failed rollout (a failed one is an unverified one, reward None, only when
   no verified failure is left). A group with a success, or whose prompt has none pooled, is unchanged.
   The group keeps its size, so group baselines see ``n`` rollouts as without the pool.
2. ``add(kept)``: every fresh success (reward >= ``CORRECT``) joins its prompt's pool, the newest
   ``per_prompt`` kept. A mixed-in success is not added again.

**Off-policy, stated.** A pooled rollout keeps the ids, the sampler log-probs ``mu`` and the
``policy_version`` it was generated with. The objective's truncated importance weight
(``objective.options.tis_level = "token"``, ``tis_cap = 1``: ``min(pi_prox / mu, 1)`` per token, as in
DART's code) is what handles it: the trainer recomputes ``pi_prox`` for every row and the weight is
1 for fresh rows (up to sampler/trainer mismatch) and below 1 where the current policy finds the old
success less likely than its sampler did. With ``tis_level = "off"`` the rows are still trained, with
the PPO ratio clipped around their own ``mu`` (as ``rollout_replay``'s are); ``configs/dart.toml`` sets
the weight.

Deviations [RECON]: DART's pool is pre-collected (successes gathered before training, for the tasks
it found hard); here it fills from the run's own successes, so a prompt can only be helped after one
success was seen. DART's per-task difficulty rule (rollout count and maximum length by difficulty)
is not published and is not built. Episodes or single completions alike: the pool stores
``Rollout`` records and reads only their rewards.

``replay/injected`` counts the groups that got a pooled success this step, ``replay/pooled`` the
successes held. State (checkpointed): the pools.
"""

from __future__ import annotations

import dataclasses

from pydantic import BaseModel, ConfigDict, Field

from rollwise.registry import Compat, UserError
from rollwise.types import CORRECT, Group, ReplaySource, Rollout


class SuccessPoolOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    per_prompt: int = Field(
        4, ge=1, description="Successes kept per prompt, the newest (DART's pool size is not published) [RECON]."
    )


def succeeded(r: Rollout) -> bool:
    return r.reward is not None and r.reward >= CORRECT


def inject(group: Group, success: Rollout) -> Group:
    """``group`` with its first failed rollout (a verified failure first, else an unverified one)
    replaced by ``success``; unchanged when every rollout succeeded."""
    rs = group.rollouts
    order = [i for i, r in enumerate(rs) if r.reward is not None and not succeeded(r)]
    order += [i for i, r in enumerate(rs) if r.reward is None]
    if not order:
        return group
    i = order[0]
    return dataclasses.replace(group, rollouts=(*rs[:i], success, *rs[i + 1 :]))


class SuccessPool(ReplaySource):
    """DART's experience pool of past successes (module docstring)."""

    Options = SuccessPoolOptions
    compat = Compat(replays_rows=True)  # a pooled rollout is trained again in a later step

    def __init__(self, cfg, options: SuccessPoolOptions | None, seed: int):
        self.opts = options if options is not None else self.Options()
        self.pool: dict[str, list[Rollout]] = {}  # prompt id -> successes, oldest first
        self.metrics: dict[str, float] = {}

    @classmethod
    def check_config(cls, cfg, opts) -> None:
        """Refused with the zero-variance filter, which drops the all-failed groups before the pool sees
        them (the pool would never act)."""
        if "zero_variance" in cfg.filter.names:
            raise UserError(
                "replay.name = 'success_pool' mixes successes into groups that have none, and 'zero_variance' in "
                "filter.names drops those groups first: remove it from filter.names"
            )

    def mix(self, fresh: list[Group], state) -> list[Group]:
        out, injected = [], 0
        for g in fresh:
            pooled = self.pool.get(g.prompt.id)
            if pooled and not any(succeeded(r) for r in g.rollouts):
                g2 = inject(g, pooled[-1])
                injected += g2 is not g
                g = g2
            out.append(g)
        self.metrics = {"replay/injected": injected, "replay/pooled": sum(map(len, self.pool.values()))}
        return out

    def add(self, groups: list[Group]) -> None:
        for g in groups:
            wins = [r for r in g.rollouts if succeeded(r)]
            if wins:
                kept = self.pool.setdefault(g.prompt.id, [])
                kept += [r for r in wins if all(r is not k for k in kept)]
                del kept[: -self.opts.per_prompt]

    def state_dict(self) -> dict:
        return {"pool": {k: list(v) for k, v in self.pool.items()}}

    def load_state_dict(self, s: dict) -> None:
        self.pool = {k: list(v) for k, v in s["pool"].items()}
