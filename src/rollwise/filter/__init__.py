"""Filters: ``(group) -> Decision``; every drop has a reason that becomes ``filter/<reason>``."""

from rollwise.registry import Registry

REGISTRY = Registry("filter")
REGISTRY.register("zero_variance", "rollwise.filter.basic:zero_variance")
REGISTRY.register("overlong", "rollwise.filter.basic:overlong")
REGISTRY.register("errored", "rollwise.filter.basic:errored")
REGISTRY.register("vcrl", "rollwise.control.vcrl:variance_filter")
REGISTRY.register("dots_reference", "rollwise.control.dots:reference_filter")
REGISTRY.register("speed_complete", "rollwise.control.speed:complete_filter")
