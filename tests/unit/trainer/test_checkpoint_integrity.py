"""Checkpoint integrity: checksums, fall back past a corrupted newest checkpoint, a full disk
leaves the previous one intact, keep_checkpoints, and the run-directory lock."""

import errno
import json
import subprocess
import sys
import time

import pytest
import torch

from rollwise.registry import UserError
from rollwise.trainer import checkpoint


def _save(run_dir, step, keep=5, value=None):
    model = torch.nn.Linear(2, 2)
    if value is not None:
        with torch.no_grad():
            model.weight.fill_(value)
    return checkpoint.save(run_dir, step, model, {"run_state": {"step": step}}, keep)


def test_manifest_lists_every_file_with_its_checksum(tmp_path):
    import hashlib

    path = _save(tmp_path, 3)
    files = json.loads((path / "manifest.json").read_text())["files"]
    assert sorted(files) == ["model.safetensors", "state.pt"]
    blob = (path / "state.pt").read_bytes()
    assert files["state.pt"] == {"size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
    assert checkpoint.verify(path) is None


@pytest.mark.parametrize(
    "damage, problem",
    [
        (lambda p: (p / "model.safetensors").write_bytes(b"x" * (p / "model.safetensors").stat().st_size), "checksum"),
        (lambda p: (p / "state.pt").write_bytes((p / "state.pt").read_bytes()[:10]), "bytes, the manifest says"),
        (lambda p: (p / "state.pt").unlink(), "state.pt"),  # partly written: list_steps no longer sees it
        (lambda p: (p / "model.safetensors").unlink(), "model.safetensors is missing"),
        (lambda p: (p / "manifest.json").write_text("{"), "unreadable manifest"),
    ],
)
def test_corrupted_newest_is_moved_aside_and_the_previous_used(tmp_path, damage, problem):
    _save(tmp_path, 2)
    newest = _save(tmp_path, 4)
    damage(newest)
    messages = []
    got = checkpoint.latest(tmp_path, log=messages.append)
    assert got == tmp_path / "checkpoints" / "step-2"
    if (tmp_path / "checkpoints" / "corrupt-step-4").exists():  # detected by verify (state.pt present)
        assert len(messages) == 1 and "step-4" in messages[0] and problem in messages[0]
    else:  # no state.pt: never counted as a checkpoint
        assert messages == [] and newest.exists()
    assert checkpoint.list_steps(tmp_path) == [2]


@pytest.mark.parametrize(
    "free, writer",
    [
        (0, "SafetensorError"),  # full: the weights fail
        (1536 * 1024, "RuntimeError"),
    ],
)  # room for the weights: torch.save fails
def test_real_full_disk_leaves_the_previous_checkpoint_intact(disk, free, writer):
    """A real full file system (tmpfs) at two points of a checkpoint write: whichever writer hits
    it (safetensors' SafetensorError, torch.save's RuntimeError), CheckpointError names the intact
    previous checkpoint and the resume command, and no temporary directory is left."""
    run = disk.tmpfs("16m")
    good = _save(run, 2, value=1.0)
    before = {p.name: p.read_bytes() for p in good.iterdir()}
    filler = disk.fill(run, leave=free)
    big = torch.nn.Linear(512, 512)  # ~1 MiB of weights, ~1 MiB of state
    with pytest.raises(
        checkpoint.CheckpointError,
        match=r"^disk full \(No space left on device\) while writing checkpoint "
        r"step-4 in .*checkpoints; the run stopped\. Checkpoint step-2 is intact: free space on the disk of "
        rf"{run}, then continue with: rollwise train --resume {run}$",
    ) as e:
        checkpoint.save(run, 4, big, {"run_state": {"step": 4}, "blob": torch.zeros(256 * 1024)}, keep=1)
    assert type(e.value.__context__).__name__ == writer  # the real exception, recognised
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-2"]  # no .tmp-step-4
    assert {p.name: p.read_bytes() for p in good.iterdir()} == before
    assert checkpoint.latest(run) == good
    filler.unlink()  # room made: the same write succeeds
    checkpoint.save(run, 4, big, {"run_state": {"step": 4}}, keep=1)
    assert checkpoint.list_steps(run) == [4] and checkpoint.verify(run / "checkpoints" / "step-4") is None
    assert isinstance(checkpoint.CheckpointError("x"), UserError)  # the CLI prints it and exits 2


def test_read_only_and_vanished_checkpoint_directories(disk, tmp_path):
    run = disk.tmpfs("16m")
    _save(run, 2)
    disk.read_only(run)
    with pytest.raises(
        checkpoint.CheckpointError,
        match=r"^read-only file system \(Read-only file system\) while writing "
        rf"checkpoint step-4 .* Checkpoint step-2 is intact: make {run} writable, then continue with",
    ):
        _save(run, 4)
    disk.unmount(run)  # writable again
    gone = tmp_path / "gone"
    gone.mkdir()
    _save(gone, 2)
    import shutil

    shutil.rmtree(gone / "checkpoints")  # deleted under the run
    with pytest.raises(
        checkpoint.CheckpointError,
        match=r"^directory vanished \(No such file or directory\) while writing "
        r"checkpoint step-4 .*No checkpoint is left in .*: restore .*, then start again with",
    ):
        checkpoint.save(gone, 4, torch.nn.Linear(2, 2), {}, keep=5, previous=2)
    assert not (gone / "checkpoints").exists()  # not made anew
    shutil.rmtree(gone)
    with pytest.raises(checkpoint.CheckpointError, match="directory vanished"):  # the run directory itself
        _save(gone, 4)
    assert not gone.exists()


def test_storage_failure_recognises_what_writers_really_raise(disk):
    """The classifier against the real exceptions of a full disk and a missing directory:
    safetensors' SafetensorError, torch.save's RuntimeError (through a file: OSError in its
    context), plain OSError; anything else is not a storage failure."""
    from safetensors.torch import save_model

    from rollwise import storage

    d = disk.tmpfs("1m")
    disk.fill(d)
    m = torch.nn.Linear(64, 64)

    def raised(fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - the real exception is the point
            return e
        raise AssertionError("no exception")

    full = [
        raised(lambda: save_model(m, str(d / "a.safetensors"))),
        raised(lambda: storage.torch_save({"w": torch.zeros(100_000)}, d / "b.pt")),
        raised(lambda: storage.torch_save({"w": torch.zeros(10)}, d / "c.pt")),
        raised(lambda: (d / "e.txt").write_text("x" * 10_000)),
    ]
    assert type(full[0]).__name__ == "SafetensorError"
    assert [storage.failure(e) for e in full] == [errno.ENOSPC] * 4, [repr(e) for e in full]
    assert (
        storage.failure(raised(lambda: torch.save({"w": torch.zeros(100_000)}, str(d / "p.pt")))) is None
    )  # path: no cause
    assert storage.failure(ValueError("os error 28")) is None
    missing = raised(lambda: open(d.parent / "no-such-dir" / "x", "w"))
    assert storage.failure(missing) == errno.ENOENT
    assert storage.failure(missing, within=d) is None  # a missing file elsewhere is not the run directory vanishing


def test_a_failed_append_is_cut_back_to_the_last_whole_line(disk):
    """A ledger line written part-way on a full disk (the last page had room for some bytes) is
    removed, so a resume reads whole lines only."""
    import os

    from rollwise import storage

    d = disk.tmpfs("1m")
    path = d / "metrics.jsonl"
    storage.append_line(path, "x" * 4000 + "\n")  # 96 bytes left in the file's page
    disk.fill(d)
    assert os.statvfs(d).f_bavail == 0
    with pytest.raises(OSError) as e:
        storage.append_line(path, json.dumps({"step": 1, "pad": "y" * 3000}) + "\n")
    assert e.value.errno == errno.ENOSPC
    assert path.read_text() == "x" * 4000 + "\n"


def test_keep_checkpoints_keeps_the_newest_n(tmp_path):
    for step in (1, 2, 3, 4, 5):
        _save(tmp_path, step, keep=3)
    assert checkpoint.list_steps(tmp_path) == [3, 4, 5]


def test_legacy_checkpoint_without_manifest_is_accepted(tmp_path):
    path = _save(tmp_path, 1)
    (path / "manifest.json").unlink()
    assert checkpoint.latest(tmp_path) == path


def test_second_process_on_a_run_directory_refuses(tmp_path):
    from rollwise import components
    from rollwise.config import load_config

    run_dir = tmp_path / "r"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from rollwise.trainer.checkpoint import lock_run_dir; "
            f"lock_run_dir({str(run_dir)!r}); print('locked', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        cfg = load_config(overrides=[f"run.dir={str(tmp_path)!r}".replace("'", '"'), 'run.name="r"'])
        with pytest.raises(UserError, match=rf"run directory .*r is in use by another process \(pid {holder.pid}\)"):
            components.prepare_run_dir(cfg, resume=True)
        with pytest.raises(UserError, match="in use by another process"):  # overwrite must not delete a live run
            components.prepare_run_dir(
                cfg.model_copy(update={"run": cfg.run.model_copy(update={"overwrite": True})}), resume=False
            )
        assert (run_dir / ".lock").exists()
    finally:
        holder.kill()
        holder.wait()
    time.sleep(0.1)
    assert components.prepare_run_dir(cfg, resume=True) == run_dir  # the holder is gone: the lock is free
    checkpoint.unlock_run_dir(run_dir)
