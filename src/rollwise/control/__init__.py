"""Controllers: which prompts, how many rollouts each, and extra rounds (docs/architecture.md §3).

Planning ahead (``train.async.max_staleness`` = η >= 1, :mod:`rollwise.distributed.async_pool`):
the pool calls ``select``/``plan`` for plans k+1 .. k+η before step k's ``next_round``,
``finish_batch``, ``observe``, ``advantage_inputs`` and ``after_update`` run. A controller whose
``select``/``plan`` write state that those later calls read *for the plan being trained* (a round
context, bins and arms, a "reference step" flag) would then work on the wrong plan. Such a
controller either keys that state by plan (``v05`` queues each plan's priors and ``observe`` takes
the oldest) or declares it in its compatibility record, ``compat = Compat(keeps_plan_state=True)``,
with which η >= 1 (a pool whose record says ``plans_ahead``) is refused at config load
(:func:`rollwise.compat.check_plans_ahead`). A controller that only resets
per-step counters in ``plan`` (read by the same step's rounds, which come after every ``plan``
call of that step) or keeps only cross-step statistics updated in ``observe`` leaves the default
(``keeps_plan_state = False``, ``rollwise.registry.Compat``): its next plans are
merely chosen from statistics up to step k - 1, the price of running ahead.
"""

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
REGISTRY.register("wise2", "rollwise.control.wise2:Wise2")
REGISTRY.register("wise3", "rollwise.control.wise3:Wise3")
REGISTRY.register("drive", "rollwise.control.drive:DRIVE")
REGISTRY.register("adhint", "rollwise.control.adhint:ADHint")
REGISTRY.register("r3l", "rollwise.control.r3l:R3L")
REGISTRY.register("v05", "rollwise.control.v05:V05")
REGISTRY.register("scope", "rollwise.control.scope:SCOPE")
REGISTRY.register("gdro", "rollwise.control.gdro:GDRO")
REGISTRY.register("mssr", "rollwise.control.mssr:MSSR")
REGISTRY.register("roc", "rollwise.control.roc:RoC")
REGISTRY.register("cog_rethinker", "rollwise.control.cog_rethinker:CogRethinker")
REGISTRY.hints["dapo"] = (
    "DAPO is a filter plus dynamic sampling, not a controller: set filter.names = ['zero_variance'] and "
    "control.dynamic_sampling.enabled = true (objective.name = 'dapo' for its clip-higher loss); "
    "see configs/dapo.toml"
)
