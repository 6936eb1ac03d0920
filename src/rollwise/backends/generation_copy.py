"""The static decode path's own module and weights: the generation copy (issue #42 item 2).

The trainer keeps its master weights (fp32 by default, a peft wrapper under ``model.lora``); the
eager path samples from that module under ``model.compute_dtype``'s autocast, which casts every
linear weight to bf16 in every forward (about 470 of the ~1,370 kernels of a SmolLM2 decode step on
an H200, issue #42). The static path (``rollwise.backends.static_decode``) samples from a
:class:`GenerationCopy` of it instead:

- **A module tree of its own** (a deep copy of the plain model), whose config routes attention
  through the static path's ``grouped_attention`` once, at build: the trainer's module keeps its
  own attention implementation, so a generator thread (``train.async``) can decode while the
  trainer's thread runs its forwards.
- **Each weight in the dtype the forward computes it in.** Under a bf16 / fp16 compute dtype every
  ``nn.Linear``'s weight and bias (the LM head included, untied from the embedding) is a tensor of
  the copy's own in that dtype: the very cast autocast makes in each eager forward, made once per
  refresh. Everything else (embeddings, norms, buffers) is the master's tensor itself, shared (what
  autocast leaves in the master's dtype), so the copy decodes the eager path's numbers and holds
  only the cast linears (SmolLM2-135M: ~0.27 GB in bf16 beside the fp32 master). Under fp32 nothing
  is cast and, without LoRA, every tensor is shared: the copy costs a module tree, no weights.
- **LoRA merged**: each adapted linear holds ``W + B A * alpha / r`` as ``distributed.weights``
  publishes it (``policy_weights``, one definition of the merge), and adapter layers are gone from
  the copy, so a decode step runs no adapter products.
- **Refreshed in place** (:meth:`GenerationCopy.refresh`): the copy's own tensors take the master's
  values with ``copy_``, so their storage (what a captured CUDA graph reads) never moves and decode
  itself casts and allocates nothing. The decoder calls ``refresh`` before each chunk it decodes;
  it copies only when a master parameter's in-place version (``Tensor._version``, bumped by every
  optimizer step, checkpoint load, received weights or FSDP's copy into the whole model) moved since
  the last copy, so it copies once after each optimizer step, whatever changed the weights (a write
  through ``Tensor.data`` bypasses the version counter; none of rollwise's writers after the first
  decode uses one, and the copy is built at that decode). A replaced master parameter
  (``load_state_dict(assign=True)``) or a move to another device asks for a new copy
  (:meth:`GenerationCopy.follows`).

An FP8-emulated sampler (``hardware.fp8``, ``model.rollout_precision``) quantises its master weights
per in-place version itself: its tensors are all shared.
"""

from __future__ import annotations

import copy

import torch

from rollwise.distributed.weights import base_model, policy_weights
from rollwise.hardware.fp8 import quantised

HALF = (torch.bfloat16, torch.float16)


def _is_lora_layer(mod) -> bool:
    """A peft LoRA layer (``distributed.weights.policy_weights`` recognises them the same way)."""
    return hasattr(mod, "get_delta_weight") and hasattr(mod, "base_layer")


def _structure(master) -> tuple:
    """What sharing depends on: the master's parameter objects and their device."""
    params = list(master.parameters())
    return tuple(id(p) for p in params), params[0].device if params else None


class GenerationCopy:
    """The generation copy of ``master`` (module docstring): ``module`` is the model the static path
    runs; ``dtype`` the compute dtype its linears hold (None: the master's dtypes, nothing cast);
    ``attention``: the attention implementation its config names (set once, here)."""

    def __init__(self, master, dtype: torch.dtype | None = None, attention: str | None = None):
        self.master = master
        self.dtype = dtype if dtype in HALF else None
        self._built_from = _structure(master)
        base = base_model(master)
        shared = {id(t): t for t in (*base.parameters(), *base.buffers())}
        module = copy.deepcopy(base, memo=shared)  # a module tree of its own over the master's tensors
        merged = set()
        for name, mod in list(module.named_modules()):
            if _is_lora_layer(mod):  # the adapted linear stays, as a plain layer holding W + delta
                parent, _, child = name.rpartition(".")
                setattr(module.get_submodule(parent) if parent else module, child, mod.get_base_layer())
                merged.add(name)
        self.own: list[tuple[str, torch.Tensor]] = []  # (name in policy_weights, tensor): what refresh copies
        if not quantised(base):
            for name, mod in module.named_modules():
                if not isinstance(mod, torch.nn.Linear):
                    continue
                for attr in ("weight", "bias"):
                    t = getattr(mod, attr)
                    if t is None:
                        continue
                    cast = self.dtype is not None and t.dtype != self.dtype
                    if cast or (attr == "weight" and name in merged):
                        new = torch.empty(t.shape, dtype=self.dtype if cast else t.dtype, device=t.device)
                        setattr(mod, attr, torch.nn.Parameter(new, requires_grad=False))
                        self.own.append((f"{name}.{attr}" if name else attr, new))
        if attention is not None:
            module.config._attn_implementation = attention
        self.module = module.eval()
        self._versions = None
        self.refresh()

    def follows(self, master, dtype: torch.dtype | None) -> bool:
        """Whether this copy is the generation copy of ``master`` in ``dtype`` (else build a new one)."""
        same_dtype = (dtype if dtype in HALF else None) == self.dtype
        return master is self.master and same_dtype and _structure(master) == self._built_from

    def _master_versions(self) -> tuple[int, ...]:
        return tuple(p._version for p in self.master.parameters())

    def stale(self) -> bool:
        """Whether a master parameter changed in place since the last refresh."""
        return bool(self.own) and self._master_versions() != self._versions

    @torch.no_grad()
    def refresh(self) -> bool:
        """Copy the master's current values into the copy's own tensors, in place, if any changed
        (module docstring); returns whether it copied."""
        if not self.stale():
            return False
        weights = policy_weights(self.master)  # LoRA merged; otherwise views of the master's tensors
        for name, t in self.own:
            t.copy_(weights[name])
        self._versions = self._master_versions()
        return True

    def own_bytes(self) -> int:
        """Bytes the copy holds beside the master's (its cast or merged linears)."""
        return sum(t.numel() * t.element_size() for _, t in self.own)
