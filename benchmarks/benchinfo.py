"""Helpers shared by the benchmark scripts in this folder: what machine and code a result came
from, peak memory, and small statistics. Pure functions take their inputs as arguments so the
unit tests (tests/unit/bench/test_bench_scripts.py) can check them on hand-made values.
"""

from __future__ import annotations

import importlib.metadata
import os
import resource
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

# cpuinfo flag -> the name we report (AMX shows up as three flags; any of them counts)
FEATURE_FLAGS = {
    "avx2": ("avx2",),
    "fma": ("fma",),
    "avx512f": ("avx512f",),
    "avx512_bf16": ("avx512_bf16",),
    "avx512_vnni": ("avx512_vnni",),
    "amx": ("amx_tile", "amx_bf16", "amx_int8"),
}


def cpu_model(cpuinfo: str) -> str | None:
    """The first ``model name`` line of /proc/cpuinfo text, e.g. ``"AMD EPYC"``."""
    for line in cpuinfo.splitlines():
        if line.lower().startswith("model name"):
            return line.split(":", 1)[1].strip()
    return None


def cpu_features(cpuinfo: str) -> dict[str, bool]:
    """Which of FEATURE_FLAGS the first ``flags`` line of /proc/cpuinfo text lists."""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        if line.lower().startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    return {name: any(f in flags for f in alts) for name, alts in FEATURE_FLAGS.items()}


def package_versions(
    names=("torch", "transformers", "trl", "accelerate", "datasets", "rollwise"),
) -> dict[str, str | None]:
    out = {}
    for n in names:
        try:
            out[n] = importlib.metadata.version(n)
        except importlib.metadata.PackageNotFoundError:
            out[n] = None
    return out


def machine() -> dict:
    """CPU model, feature flags, cores, memory, torch threads and library versions."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    import torch

    try:
        mem_gb = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        mem_gb = None
    return {
        "cpu": cpu_model(cpuinfo),
        "cpu_features": cpu_features(cpuinfo),
        "cores": os.cpu_count(),
        "memory_gb": mem_gb,
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
        "python": sys.version.split()[0],
        "versions": package_versions(),
        "load_avg_1min_at_start": _loadavg(),
    }


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def git() -> dict | None:
    """Commit of the checkout (and whether tracked files differ from it)."""
    from rollwise.bench.runner import git_info

    return git_info()


def peak_rss_mb() -> float:
    """This process's peak resident set size in MiB (``ru_maxrss`` is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def median(xs) -> float | None:
    xs = list(xs)
    return statistics.median(xs) if xs else None


def mean(xs) -> float | None:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else None


def stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
