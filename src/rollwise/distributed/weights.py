"""Weights flow one way (docs/architecture.md §8): after each optimizer step the trainer *publishes* its
weights and engines that do not share the trainer's module (the colocated vLLM backend, Ray
rollout workers) receive them. A receiver never reads the trainer's module.

``policy_weights(model)`` is what is published: ``{name: tensor}`` in the Hugging Face naming of
the plain model. With LoRA (a ``peft`` model) each adapted weight is published merged,
``W + B A * alpha / r`` (peft's ``get_delta_weight``), and adapter tensors are left out, so a
receiver always holds a plain model of the base architecture and the trainer's module is never
modified (no merge / unmerge round trip, whose rounding would drift the base weights).

``plain_config(model)``: the base model's ``PretrainedConfig`` with ``architectures`` set and any
quantisation entry dropped (a GGUF-loaded config keeps one), enough for a receiver to build the
architecture and load the published tensors.
"""

from __future__ import annotations

import torch


def base_model(model):
    """The plain model under a peft wrapper (the model itself otherwise)."""
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) else model


@torch.no_grad()
def policy_weights(model) -> dict[str, torch.Tensor]:
    """``{name: tensor}`` of the plain model, LoRA deltas merged in (module docstring). Tensors
    are detached; without LoRA they share storage with the trainer's parameters, so a receiver
    must copy them (vLLM's loader and ``load_state_dict`` do)."""
    base = base_model(model)
    deltas: dict[str, torch.Tensor] = {}
    for name, mod in base.named_modules():
        if hasattr(mod, "get_delta_weight") and hasattr(mod, "base_layer"):  # a peft LoRA layer
            for adapter in getattr(mod, "active_adapters", ()):
                if adapter in getattr(mod, "lora_A", {}):
                    d = mod.get_delta_weight(adapter)
                    deltas[name + ".weight"] = deltas[name + ".weight"] + d if name + ".weight" in deltas else d
    out = {}
    for key, value in base.state_dict().items():
        if ".lora_" in key:
            continue
        key = key.replace(".base_layer.", ".")
        delta = deltas.get(key)
        out[key] = (value + delta.to(value.dtype)) if delta is not None else value.detach()
    return out


def plain_config(model):
    """The base model's config (a copy) with ``architectures`` and without ``quantization_config``."""
    import copy

    base = base_model(model)
    cfg = copy.deepcopy(base.config)
    if not getattr(cfg, "architectures", None):
        cfg.architectures = [type(base).__name__]
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")
    return cfg
