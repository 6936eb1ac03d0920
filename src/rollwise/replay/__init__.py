"""Replay sources: ``add(groups)``, ``mix(fresh, state) -> groups``, ``state_dict`` (docs/architecture.md §3)."""

from rollwise.registry import Registry

REGISTRY = Registry("replay")
REGISTRY.register("on_policy", "rollwise.replay.on_policy:OnPolicy")
REGISTRY.register("rollout_replay", "rollwise.replay.rollout_replay:RolloutReplay")
REGISTRY.register("partial", "rollwise.replay.partial:PartialRollouts")
REGISTRY.register("speculative", "rollwise.replay.speculative:SpeculativeRollouts")
REGISTRY.register("sapo", "rollwise.replay.sapo:Sapo")
