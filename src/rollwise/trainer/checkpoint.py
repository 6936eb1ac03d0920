"""Checkpoints: ``checkpoints/step-<N>/`` holds ``model.safetensors`` (the policy weights),
``state.pt`` (optimizer, scheduler, RNG states, data position, every stage's state, ledger
totals) and ``manifest.json`` (size and SHA-256 of every other file).

Integrity contract:

- A checkpoint is written to ``.tmp-step-<N>``, each file flushed to disk (fsync), the manifest
  written last, and the directory renamed into place; only then are checkpoints beyond
  ``run.keep_checkpoints`` deleted. A kill at any moment leaves either the new checkpoint
  complete or the previous ones untouched.
- A failed write (a full disk, a read-only file system, a vanished directory: see
  ``rollwise.storage``, which recognises the forms safetensors and ``torch.save`` really raise)
  removes the temporary directory, leaves every earlier checkpoint intact and raises
  ``CheckpointError`` (= ``storage.StorageError``, a ``UserError``: the CLI prints one line and
  exits 2) naming the step, the cause, the checkpoint a ``--resume`` would use and the command.
  The run directory is never created here, and a ``previous`` checkpoint that has vanished
  stops the run rather than writing into a directory made anew.
- ``latest`` verifies the manifest of the newest checkpoint; a corrupted or incomplete one
  (missing file, size or checksum mismatch, unreadable manifest) is moved aside to
  ``checkpoints/corrupt-step-<N>`` with a message, and the previous checkpoint is tried.
  Checkpoints written before manifests existed (a ``state.pt`` but no ``manifest.json``) are
  accepted unverified.
- ``lock_run_dir`` takes an exclusive ``flock`` on ``<run>/.lock`` for the life of the process
  (re-entrant within it), so a second process on the same run directory refuses to start.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_model, save_model

from rollwise import storage
from rollwise.registry import UserError
from rollwise.storage import ckpt_dir, latest_step, list_steps  # noqa: F401  (the run directory's layout; re-exported)

MANIFEST = "manifest.json"
LOCK = ".lock"


CheckpointError = storage.StorageError  # a checkpoint could not be written; earlier ones are intact


def save(
    run_dir: Path,
    step: int,
    model,
    state: dict,
    keep: int,
    extra_models: dict | None = None,
    previous: int | None = None,
) -> Path:
    """Write ``step-<step>`` (see the module docstring); ``extra_models`` (e.g. the frozen KL
    reference) go beside the policy as ``<name>.safetensors``. ``previous``: the newest checkpoint
    this run wrote or resumed from; if it is gone (the directory vanished) the run stops."""
    root = ckpt_dir(run_dir)
    final = root / f"step-{step}"
    tmp = root / f".tmp-step-{step}"
    with storage.guard(f"checkpoint step-{step} in {root}", run_dir, cleanup=[tmp]):
        if previous is not None and not (root / f"step-{previous}").is_dir():
            raise FileNotFoundError(errno.ENOENT, f"checkpoint step-{previous} is gone", str(root / f"step-{previous}"))
        root.mkdir(exist_ok=True)  # never the run directory: one that vanished is not made again
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        save_model(model, str(tmp / "model.safetensors"))
        for name, extra in (extra_models or {}).items():
            save_model(extra, str(tmp / f"{name}.safetensors"))
        storage.torch_save(dict(state, rng=rng_state(), step=step), tmp / "state.pt")
        files = sorted(p.name for p in tmp.iterdir())
        manifest = {"step": step, "files": {name: _digest(tmp / name) for name in files}}
        for name in files:
            _fsync(tmp / name)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        _fsync(tmp / MANIFEST)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        _fsync(root)
    for old in list_steps(run_dir)[:-keep]:
        shutil.rmtree(root / f"step-{old}", ignore_errors=True)
    return final


def _digest(path: Path) -> dict:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return {"size": path.stat().st_size, "sha256": h.hexdigest()}


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def verify(path: Path) -> str | None:
    """None if the checkpoint at ``path`` matches its manifest, else what is wrong."""
    path = Path(path)
    mf = path / MANIFEST
    if not mf.exists():
        return None if (path / "state.pt").exists() else "no manifest.json and no state.pt"
    try:
        files = json.loads(mf.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"unreadable manifest.json ({e})"
    for name, want in files.items():
        p = path / name
        if not p.is_file():
            return f"{name} is missing"
        if p.stat().st_size != want["size"]:
            return f"{name} has {p.stat().st_size} bytes, the manifest says {want['size']}"
        if _digest(p)["sha256"] != want["sha256"]:
            return f"{name} does not match its SHA-256 checksum"
    return None


def latest(run_dir: Path, log=print) -> Path | None:
    """The newest checkpoint that passes ``verify``; a failing one is moved aside to
    ``corrupt-step-<N>`` with a message through ``log`` and the previous one is tried."""
    root = ckpt_dir(run_dir)
    for step in reversed(list_steps(run_dir)):
        path = root / f"step-{step}"
        problem = verify(path)
        if problem is None:
            return path
        aside = root / f"corrupt-step-{step}"
        shutil.rmtree(aside, ignore_errors=True)
        path.rename(aside)
        log(
            f"checkpoint step-{step} is corrupted or incomplete ({problem}); moved to {aside.name}, "
            "using the previous checkpoint"
        )
    return None


def load(path: Path, model, extra_models: dict | None = None) -> dict:
    load_model(model, str(Path(path) / "model.safetensors"))
    for name, extra in (extra_models or {}).items():
        load_model(extra, str(Path(path) / f"{name}.safetensors"))
    state = torch.load(
        Path(path) / "state.pt", weights_only=False, map_location="cpu"
    )  # optimizer state follows its parameters
    set_rng_state(state["rng"])
    return state


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def set_rng_state(s: dict) -> None:
    torch.set_rng_state(s["torch"])
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])


# ---------------------------------------------------------------- run-directory lock

_HELD: dict[str, int] = {}  # resolved run dir -> fd of its locked .lock file (this process)


def lock_run_dir(run_dir: Path) -> None:
    """Hold an exclusive lock on ``<run_dir>/.lock`` until this process exits (or
    ``unlock_run_dir``); raise ``UserError`` if another process holds it. The file records the
    holder's pid for the message. A no-op where ``fcntl`` does not exist (Windows)."""
    try:
        import fcntl
    except ImportError:
        return
    key = str(Path(run_dir).resolve())
    if key in _HELD:
        return
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    fd = os.open(Path(run_dir) / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise UserError(
            f"run directory {run_dir} is in use by another process (pid {holder}); "
            "wait for it to finish, or choose another run.name"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    _HELD[key] = fd


def unlock_run_dir(run_dir: Path) -> None:
    fd = _HELD.pop(str(Path(run_dir).resolve()), None)
    if fd is not None:
        os.close(fd)  # closing the descriptor releases the flock
