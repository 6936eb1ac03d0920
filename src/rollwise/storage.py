"""Storage failures: a full disk, a read-only file system, a directory that vanished, met while a
run writes its checkpoints, ledger, ``final/`` model or a comparison's ``compare.json``.

One classifier (:func:`failure`) recognises them in the forms the writers really raise, found by
writing to a full / read-only / missing directory on a small tmpfs:

- plain writes (``open``, ``write_text``, ``os.write``): ``OSError`` with ``errno`` (``ENOSPC``,
  ``EDQUOT``, ``EROFS``, ``ENOENT``, ``ESTALE``, ``EIO``);
- safetensors (``save_model``, ``save_file``, transformers' ``save_pretrained``):
  ``SafetensorError("... I/O error: No space left on device (os error 28)")``, the errno only in
  the message;
- ``torch.save`` to a path: ``RuntimeError("... unexpected pos 576 vs 534")`` or ``"basic_ios::clear:
  iostream error"``, which name no cause. rollwise therefore gives ``torch.save`` an open file
  (:func:`torch_save`), so the failing ``write`` raises ``OSError``, or a ``RuntimeError`` whose
  ``__context__`` is that ``OSError``; the classifier follows ``__cause__`` / ``__context__``.

:func:`guard` turns such a failure into :class:`StorageError` (a ``UserError``: the CLI prints one
line, no traceback, and exits 2) naming what was being written, the cause, the newest checkpoint
on disk (always intact: a checkpoint is renamed into place only once complete) and what to do;
it first removes the given temporary paths, so no ``.tmp-step-N`` or ``final.tmp`` is left. Any
other exception passes through unchanged.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path

from rollwise.registry import UserError

# errno -> (what it means, what to do; {dir}: the directory written)
CAUSES = {
    errno.ENOSPC: ("disk full", "free space on the disk of {dir}"),
    errno.EDQUOT: ("disk quota exceeded", "free space or raise the quota for {dir}"),
    errno.EROFS: ("read-only file system", "make {dir} writable"),
    errno.ENOENT: ("directory vanished", "restore {dir}"),
    errno.ESTALE: ("directory vanished", "restore {dir}"),
    errno.EIO: ("I/O error", "check the disk of {dir}"),
}
_ANYWHERE = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO}  # a storage failure whichever file it hit


class StorageError(UserError):
    """A run's file could not be written (disk full, read-only, vanished); earlier checkpoints are intact."""


def failure(e: BaseException, within: Path | None = None) -> int | None:
    """The errno of the storage failure behind ``e`` (see the module docstring), else None.
    ``ENOENT``/``ESTALE`` with a known file name count only when that file is under ``within``
    (a missing input file elsewhere is the user's mistake, not a vanished run directory)."""
    seen: set[int] = set()
    x: BaseException | None = e
    while x is not None and id(x) not in seen:
        seen.add(id(x))
        code, name = None, None
        if isinstance(x, OSError) and x.errno in CAUSES:
            code, name = x.errno, x.filename
        elif type(x).__name__ == "SafetensorError":
            m = re.search(r"os error (\d+)", str(x))
            p = re.search(r'at path "([^"]*)"', str(x))
            code, name = (int(m.group(1)) if m else None), (p.group(1) if p else None)
        if code in CAUSES:
            if code in _ANYWHERE or within is None or name is None or _under(name, within):
                return code
        x = x.__cause__ or x.__context__
    return None


def _under(name, root: Path) -> bool:
    try:
        return Path(os.path.abspath(name)).is_relative_to(Path(os.path.abspath(root)))
    except (TypeError, ValueError):
        return False


def cache_root() -> Path:
    """Where rollwise keeps what later runs reuse (warm starts, ``hardware/precision.py``'s timings):
    ``$ROLLWISE_CACHE`` or ``~/.cache/rollwise``. Here, on the ground floor, so the trainer's warm start
    and the precision decision both read it without importing each other."""
    return Path(os.environ.get("ROLLWISE_CACHE") or Path.home() / ".cache" / "rollwise")


def ckpt_dir(run_dir: Path) -> Path:
    """A run's checkpoints folder (written by ``rollwise.trainer.checkpoint``)."""
    return Path(run_dir) / "checkpoints"


def list_steps(run_dir: Path) -> list[int]:
    """Steps of the checkpoints in place (renamed into ``step-<N>``), oldest first; not verified."""
    root = ckpt_dir(run_dir)
    if not root.exists():
        return []
    return sorted(
        int(p.name.split("-")[1])
        for p in root.iterdir()
        if p.name.startswith("step-") and p.name[5:].isdigit() and (p / "state.pt").exists()
    )


def latest_step(run_dir: Path) -> int | None:
    steps = list_steps(run_dir)
    return steps[-1] if steps else None


def message(code: int, what: str, run_dir: Path | None, then: str | None = None) -> str:
    """One line: what failed and why, then what to do: for a run (``run_dir``) the checkpoint that
    is intact and the resume command; otherwise the fix for the cause, then ``then``."""
    cause, fix = CAUSES[code]
    head = f"{cause} ({os.strerror(code)}) while writing {what}"
    if then is not None:
        return f"{head}: {fix.format(dir=run_dir)}, then {then}"
    where = Path(run_dir)
    prev, ckpts = latest_step(where), ckpt_dir(where)
    resume = f"rollwise train --resume {where}"
    if prev is not None:
        return (
            f"{head}; the run stopped. Checkpoint step-{prev} is intact: {fix.format(dir=where)}, then continue "
            f"with: {resume}"
        )
    return (
        f"{head}; the run stopped. No checkpoint is left in {ckpts}: "
        f"{fix.format(dir=where)}, then start again with: {resume}"
    )


@contextmanager
def guard(what: str | None, run_dir: Path | None = None, then: str | None = None, cleanup=()):
    """Turn a storage failure in the block into ``StorageError`` (module docstring), removing the
    ``cleanup`` paths first. ``what``: the file or directory being written (None: the failing
    file's name, from the exception); ``run_dir``: the run (or other directory) written to;
    ``then``: what to do once it is fixed, instead of a run's resume advice."""
    try:
        yield
    except StorageError:
        raise
    except Exception as e:
        code = failure(e, within=run_dir)
        if code is None:
            raise
        for p in map(Path, cleanup):  # best effort: on a read-only file system nothing was made
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                try:
                    p.unlink(missing_ok=True)
                except OSError:
                    pass
        raise StorageError(message(code, what or _filename(e) or "the run directory", run_dir, then)) from None


def _filename(e: BaseException) -> str | None:
    x: BaseException | None = e
    while x is not None:
        if isinstance(x, OSError) and x.filename:
            return str(x.filename)
        x = x.__cause__ or x.__context__
    return None


def torch_save(obj, path: Path) -> None:
    """``torch.save`` through an open file, so a failing write raises ``OSError`` (module docstring)."""
    import torch

    with open(path, "wb") as f:
        torch.save(obj, f)


def append_line(path: Path, text: str) -> None:
    """Append ``text`` (one line, newline included) to ``path`` and flush it; a write that fails
    part-way (a full disk) is cut back, so no half line is left for a resume to read."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        start = os.lseek(fd, 0, os.SEEK_END)
        data = text.encode()
        try:
            while data:
                data = data[os.write(fd, data) :]
        except OSError:
            try:
                os.ftruncate(fd, start)
            except OSError:
                pass
            raise
    finally:
        os.close(fd)


def read_jsonl(path: Path) -> list[dict]:
    """The records of a run's JSON-lines file (``metrics.jsonl``, ``eval.jsonl``, ...); [] when it does not exist."""
    import json

    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
