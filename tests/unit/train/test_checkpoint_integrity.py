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
from rollwise.train import checkpoint


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


@pytest.mark.parametrize("damage, problem", [
    (lambda p: (p / "model.safetensors").write_bytes(b"x" * (p / "model.safetensors").stat().st_size), "checksum"),
    (lambda p: (p / "state.pt").write_bytes((p / "state.pt").read_bytes()[:10]), "bytes, the manifest says"),
    (lambda p: (p / "state.pt").unlink(), "state.pt"),  # partly written: list_steps no longer sees it
    (lambda p: (p / "model.safetensors").unlink(), "model.safetensors is missing"),
    (lambda p: (p / "manifest.json").write_text("{"), "unreadable manifest"),
])
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


def test_disk_full_leaves_the_previous_checkpoint_intact(tmp_path, monkeypatch):
    good = _save(tmp_path, 2, value=1.0)
    before = {p.name: p.read_bytes() for p in good.iterdir()}
    real = checkpoint.save_model

    def full(model, filename):  # half a file, then ENOSPC, as a full disk does
        open(filename, "wb").write(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "save_model", full)
    with pytest.raises(checkpoint.CheckpointError, match=r"disk full while writing checkpoint step-4 .*No space left.*"
                       r"previous checkpoint step-2 is intact.*--resume"):
        _save(tmp_path, 4, keep=1, value=2.0)
    monkeypatch.setattr(checkpoint, "save_model", real)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-2"]  # no temporary left
    assert {p.name: p.read_bytes() for p in good.iterdir()} == before
    assert checkpoint.latest(tmp_path) == good
    assert isinstance(checkpoint.CheckpointError("x"), UserError)  # the CLI prints it and exits 2


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
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from rollwise.train.checkpoint import lock_run_dir; "
                               f"lock_run_dir({str(run_dir)!r}); print('locked', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        cfg = load_config(overrides=[f"run.dir={str(tmp_path)!r}".replace("'", '"'), 'run.name="r"'])
        with pytest.raises(UserError, match=rf"run directory .*r is in use by another process \(pid {holder.pid}\)"):
            components.prepare_run_dir(cfg, resume=True)
        with pytest.raises(UserError, match="in use by another process"):  # overwrite must not delete a live run
            components.prepare_run_dir(cfg.model_copy(update={"run": cfg.run.model_copy(update={"overwrite": True})}), resume=False)
        assert (run_dir / ".lock").exists()
    finally:
        holder.kill()
        holder.wait()
    time.sleep(0.1)
    assert components.prepare_run_dir(cfg, resume=True) == run_dir  # the holder is gone: the lock is free
    checkpoint.unlock_run_dir(run_dir)
