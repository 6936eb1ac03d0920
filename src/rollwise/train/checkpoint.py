"""Checkpoints: ``checkpoints/step-<N>/`` holds ``model.safetensors`` (the policy weights) and
``state.pt`` (optimizer, scheduler, RNG states, data position, every stage's state, ledger
totals). A checkpoint is written to a temporary directory and renamed into place, so a kill
during saving never leaves a half checkpoint that ``latest`` would pick.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_model, save_model


def ckpt_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save(run_dir: Path, step: int, model, state: dict, keep: int, extra_models: dict | None = None) -> Path:
    """Write ``step-<step>``; ``extra_models`` (e.g. the frozen KL reference) go beside the
    policy as ``<name>.safetensors``."""
    root = ckpt_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step}"
    tmp = root / f".tmp-step-{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_model(model, str(tmp / "model.safetensors"))
    for name, extra in (extra_models or {}).items():
        save_model(extra, str(tmp / f"{name}.safetensors"))
    state = dict(state, rng=rng_state(), step=step)
    torch.save(state, tmp / "state.pt")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in sorted(list_steps(run_dir))[:-keep]:
        shutil.rmtree(root / f"step-{old}", ignore_errors=True)
    return final


def list_steps(run_dir: Path) -> list[int]:
    root = ckpt_dir(run_dir)
    if not root.exists():
        return []
    return sorted(int(p.name.split("-")[1]) for p in root.iterdir() if p.name.startswith("step-") and (p / "state.pt").exists())


def latest(run_dir: Path) -> Path | None:
    steps = list_steps(run_dir)
    return ckpt_dir(run_dir) / f"step-{steps[-1]}" if steps else None


def load(path: Path, model, extra_models: dict | None = None) -> dict:
    load_model(model, str(Path(path) / "model.safetensors"))
    for name, extra in (extra_models or {}).items():
        load_model(extra, str(Path(path) / f"{name}.safetensors"))
    state = torch.load(Path(path) / "state.pt", weights_only=False)
    set_rng_state(state["rng"])
    return state


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def set_rng_state(s: dict) -> None:
    torch.set_rng_state(s["torch"])
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
