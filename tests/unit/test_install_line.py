"""Install honesty: on a machine without an NVIDIA GPU `make install` asks for the CPU torch wheel
(torch==2.13.0+cpu, PyTorch CPU index or a local wheel), with a stated fallback; with nvidia-smi on
PATH it takes PyPI's build (CUDA on Linux)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _dry_run(tmp_path, path_dirs, **variables):
    venv = tmp_path / "v"
    args = [
        "make",
        "-n",
        "-C",
        str(ROOT),
        f"VENV={venv}",
        f"{venv}/.installed",
        *(f"{k}={v}" for k, v in variables.items()),
    ]
    env = {**os.environ, "PATH": os.pathsep.join(map(str, path_dirs))}
    return subprocess.run(args, capture_output=True, text=True, env=env, check=True).stdout


def _bin_without_nvidia(tmp_path):
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    for tool in ("sh", "make", "uname", "python3"):
        if shutil.which(tool):
            (d / tool).symlink_to(shutil.which(tool))
    return d


def test_cpu_machine_asks_for_the_cpu_wheel(tmp_path):
    out = _dry_run(tmp_path, [_bin_without_nvidia(tmp_path)])
    assert '--no-deps "torch==2.13.0+cpu" --extra-index-url https://download.pytorch.org/whl/cpu' in out
    assert "on Linux the CUDA build" in out  # the fallback says what it installs


def test_gpu_machine_takes_pypis_build(tmp_path):
    d = _bin_without_nvidia(tmp_path)
    (d / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
    (d / "nvidia-smi").chmod(0o755)
    out = _dry_run(tmp_path, [d])
    assert 'if [ "pypi" = cpu ]' in out


def test_variant_can_be_forced(tmp_path):
    out = _dry_run(tmp_path, [_bin_without_nvidia(tmp_path)], TORCH_VARIANT="pypi")
    assert 'if [ "pypi" = cpu ]' in out
