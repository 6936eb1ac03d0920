"""Objectives ``(batch, new_logprobs, options, entropy) -> LossOut`` and advantage estimators
``(rewards, group_index, options) -> Advantages`` (docs/architecture.md §3)."""

from rollwise.registry import Registry

OBJECTIVES = Registry("objective")
OBJECTIVES.register("grpo", "rollwise.objectives.grpo:loss")
OBJECTIVES.register("dapo", "rollwise.objectives.dapo:loss")
OBJECTIVES.register("gspo", "rollwise.objectives.gspo:loss")
OBJECTIVES.register("cispo", "rollwise.objectives.cispo:loss")
OBJECTIVES.register("decoupled_ppo", "rollwise.objectives.decoupled_ppo:loss")
OBJECTIVES.register("minpro", "rollwise.objectives.minpro:loss")
OBJECTIVES.register("opmd", "rollwise.objectives.opmd:loss")

ADVANTAGES = Registry("advantage")
ADVANTAGES.register("grpo", "rollwise.objectives.advantages:grpo")
ADVANTAGES.register("dr_grpo", "rollwise.objectives.advantages:dr_grpo")
ADVANTAGES.register("rloo", "rollwise.objectives.advantages:rloo")
ADVANTAGES.register("reinforce_pp_baseline", "rollwise.objectives.advantages:reinforce_pp_baseline")
ADVANTAGES.register("median", "rollwise.objectives.advantages:median")
ADVANTAGES.register("novelty", "rollwise.objectives.novelty:novelty")
ADVANTAGES.register("tree", "rollwise.objectives.tree:tree")
ADVANTAGES.register("gdpo", "rollwise.objectives.gdpo:gdpo")
ADVANTAGES.register("grpo_sum", "rollwise.objectives.gdpo:grpo_sum")
ADVANTAGES.register("mssr", "rollwise.objectives.mssr:mssr")
ADVANTAGES.register("ettrl", "rollwise.objectives.ettrl:ettrl")
ADVANTAGES.register("echo", "rollwise.objectives.echo:echo_advantage")
OBJECTIVES.register("echo", "rollwise.objectives.echo:loss")
ADVANTAGES.register("ace", "rollwise.objectives.ace:ace")
ADVANTAGES.register("uniqueness", "rollwise.objectives.uniqueness:uniqueness")
ADVANTAGES.register("r3l", "rollwise.objectives.r3l:r3l")
ADVANTAGES.register("adhint", "rollwise.objectives.adhint:adhint")
ADVANTAGES.register("v05", "rollwise.objectives.v05:v05")
ADVANTAGES.register("poise", "rollwise.objectives.poise:poise")
