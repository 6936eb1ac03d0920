"""Backends: continue token sequences (``generate(sequences, sampling) -> completions``)."""

from rollwise.registry import Registry

REGISTRY = Registry("backend")
REGISTRY.register("hf", "rollwise.backends.hf:HFBackend")
REGISTRY.register("vllm", "rollwise.backends.vllm:VLLMBackend")
REGISTRY.register("scripted", "rollwise.backends.scripted:ScriptedBackend")
