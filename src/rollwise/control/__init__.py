"""Controllers: which prompts, how many rollouts each, and extra rounds (DESIGN.md §3)."""

from rollwise.registry import Registry

REGISTRY = Registry("controller")
REGISTRY.register("uniform", "rollwise.control.uniform:Uniform")
