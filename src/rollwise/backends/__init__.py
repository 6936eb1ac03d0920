"""Backends: continue token sequences (``generate(sequences, sampling) -> completions``)."""

from rollwise.registry import Registry

REGISTRY = Registry("backend")
REGISTRY.register("hf", "rollwise.backends.hf:HFBackend")
REGISTRY.register("vllm", "rollwise.backends.vllm:VLLMBackend")
REGISTRY.register("scripted", "rollwise.backends.scripted:ScriptedBackend")


def build(cfg, codec, model=None, config=None, compute_dtype=None):
    """The rollout engine ``model.backend`` names, chosen through ``REGISTRY`` (its ``for_run``):
    around the trainer's ``model`` in this process (``rollwise.components``), or on a Ray worker
    (``rollwise.distributed.ray_pool``) around the worker's ``model`` (``hf``) or from the policy's
    architecture ``config`` (``vllm``). ``compute_dtype``: the resolved ``model.compute_dtype``
    (None: resolved here from the model's weights)."""
    return REGISTRY.get(cfg.model.backend).for_run(cfg, codec, model=model, config=config, compute_dtype=compute_dtype)
