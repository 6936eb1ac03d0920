"""Replay sources: ``add(groups)``, ``mix(fresh, state) -> groups``, ``state_dict`` (docs/architecture.md §3)."""

from rollwise.registry import Registry

REGISTRY = Registry("replay")
REGISTRY.register("on_policy", "rollwise.replay.on_policy:OnPolicy")
REGISTRY.register("rollout_replay", "rollwise.replay.rollout_replay:RolloutReplay")
REGISTRY.register("april", "rollwise.generate.april:PartialRollouts")
REGISTRY.register("spec_rl", "rollwise.generate.spec_rl:SpeculativeRollouts")
REGISTRY.register("sapo", "rollwise.replay.sapo:Sapo")
REGISTRY.register("success_pool", "rollwise.replay.success_pool:SuccessPool")
REGISTRY.hints["partial"] = "APRIL's replay source is now named 'april' (replay.name = \"april\")"
REGISTRY.hints["speculative"] = "SPEC-RL's replay source is now named 'spec_rl' (replay.name = \"spec_rl\")"
