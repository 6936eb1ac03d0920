"""Controllers: which prompts, how many rollouts each, and extra rounds (DESIGN.md §3)."""

from rollwise.registry import Registry

REGISTRY = Registry("controller")
REGISTRY.register("uniform", "rollwise.control.uniform:Uniform")
REGISTRY.register("vcrl", "rollwise.control.vcrl:VCRL")
REGISTRY.register("vade", "rollwise.control.vade:VADE")
REGISTRY.register("dots", "rollwise.control.dots:DOTS")
REGISTRY.register("dars", "rollwise.control.dars:DARS")
REGISTRY.register("dars_b", "rollwise.control.dars:DARSB")
REGISTRY.register("brorl", "rollwise.control.brorl:BroRL")
REGISTRY.register("xrpo", "rollwise.control.xrpo:Xrpo")
REGISTRY.register("cures", "rollwise.control.cures:CurES")
REGISTRY.register("ar3po", "rollwise.control.ar3po:AR3PO")
REGISTRY.register("greso", "rollwise.control.greso:GRESO")
REGISTRY.register("speed", "rollwise.control.speed:SPEED")
REGISTRY.register("wise", "rollwise.control.wise:Wise")
REGISTRY.register("drive", "rollwise.control.drive:DRIVE")
REGISTRY.register("adhint", "rollwise.control.adhint:ADHint")
REGISTRY.register("r3l", "rollwise.control.r3l:R3L")
REGISTRY.register("v05", "rollwise.control.v05:V05")
REGISTRY.register("scope", "rollwise.control.scope:SCOPE")
REGISTRY.register("gdro", "rollwise.control.gdro:GDRO")
REGISTRY.register("mssr", "rollwise.control.mssr:MSSR")
REGISTRY.hints["dapo"] = ("DAPO is a filter plus dynamic sampling, not a controller: set filter.names = ['zero_variance'] and "
                          "control.dynamic_sampling.enabled = true (objective.name = 'dapo' for its clip-higher loss); "
                          "see configs/dapo.toml")
