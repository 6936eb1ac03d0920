"""Verifiers: ``(prompt, completion_text) -> Verdict``; score None means could not verify."""

from rollwise.registry import Registry

REGISTRY = Registry("verifier")
REGISTRY.register("exact", "rollwise.verify.exact:verify")
REGISTRY.register("math", "rollwise.verify.math:verify")
REGISTRY.register("reasoning_gym", "rollwise.verify.reasoning_gym:verify")
REGISTRY.register("code", "rollwise.verify.code:verify")
