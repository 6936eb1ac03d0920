"""Compute precision: bf16 autocast with fp32 master weights where the hardware runs bf16 natively.

``model.compute_dtype`` (config) chooses the dtype matrix products run in while the weights, the
optimizer state and every log-softmax stay in ``model.dtype`` (fp32 by default):

* ``"float32"``: no autocast;
* ``"bfloat16"``: ``torch.autocast(<device>, torch.bfloat16)`` around the policy's forward passes
  (generation, scoring, training);
* ``"auto"``: bfloat16 where it is native, float32 elsewhere. On CPU "native" means the CPU flags
  ``avx512_bf16`` or ``amx_bf16`` (``/proc/cpuinfo``; torch's ``get_cpu_capability()`` as a
  fallback where that file does not exist); on CUDA ``torch.cuda.is_bf16_supported()``. On a CPU
  without them bf16 matmuls are emulated and 2-4x *slower* than fp32 (shared/notes/cpu-facts.md §3),
  so auto never picks them there.

A model whose weights are already bf16 (``model.dtype = "bfloat16"``) runs in bf16 regardless.
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path

import torch

BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from ``/proc/cpuinfo`` (empty where it cannot be read)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def cpu_has_native_bf16(flags: frozenset[str] | None = None) -> bool:
    """True when the CPU executes bf16 dot products natively (``avx512_bf16`` or AMX)."""
    flags = cpu_flags() if flags is None else flags
    if flags:
        return any(f in flags for f in BF16_CPU_FLAGS)
    try:  # no /proc/cpuinfo (macOS, Windows): torch's dispatch level; AVX512 alone is not enough
        return torch.backends.cpu.get_cpu_capability() in ("AVX512_BF16", "AMX")
    except Exception:  # pragma: no cover - very old torch
        return False


def resolve_compute_dtype(setting: str, device: torch.device | str = "cpu",
                          flags: frozenset[str] | None = None) -> torch.dtype:
    """The dtype ``setting`` ("auto" / "float32" / "bfloat16") means on ``device``."""
    if setting == "float32":
        return torch.float32
    if setting == "bfloat16":
        return torch.bfloat16
    if setting != "auto":
        raise ValueError(f"model.compute_dtype must be 'auto', 'float32' or 'bfloat16', got {setting!r}")
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    if dev.type == "cpu":
        return torch.bfloat16 if cpu_has_native_bf16(flags) else torch.float32
    return torch.float32


def autocast(dtype: torch.dtype | None, device: torch.device | str = "cpu"):
    """``torch.autocast`` to ``dtype`` on ``device``, or a no-op for None / float32."""
    if dtype is None or dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)
