"""Run-level reliability: a full disk at a checkpoint stops the run with a clear error and the
resumed run matches an uninterrupted one; a corrupted newest checkpoint is skipped with a message;
``rollwise compare`` killed mid-sweep resumes with finished runs skipped."""

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import rollwise
from conftest import tiny_overrides
from rollwise.config import load_config
from rollwise.train import checkpoint

VOLATILE = ("wall_s", "time/")


def _cfg(tmp_path, name, **extra):
    o = tiny_overrides(tmp_path, name=name, steps=4, **{"run.checkpoint_every": 2, **extra})
    return load_config(data={}, overrides=[f"{k}={json.dumps(v)}" if not isinstance(v, dict) else
                                           f"{k}={{{', '.join(f'{a} = {json.dumps(b)}' for a, b in v.items())}}}" for k, v in o.items()])


def _stable(path):
    return [{k: v for k, v in json.loads(ln).items() if not k.startswith(VOLATILE)} for ln in path.read_text().splitlines()]


def test_disk_full_stops_the_run_then_resume_matches(tmp_path, monkeypatch):
    rollwise.train(_cfg(tmp_path, "full"), log=lambda m: None)
    real, calls = checkpoint.save_model, []

    def full_at_step_4(model, filename):
        calls.append(filename)
        if "step-4" in filename:
            open(filename, "wb").write(b"half")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(model, filename)

    monkeypatch.setattr(checkpoint, "save_model", full_at_step_4)
    cfg = _cfg(tmp_path, "disk")
    with pytest.raises(checkpoint.CheckpointError, match="disk full while writing checkpoint step-4.*step-2 is intact"):
        rollwise.train(cfg, log=lambda m: None)
    assert checkpoint.list_steps(tmp_path / "disk") == [2]
    assert checkpoint.verify(tmp_path / "disk" / "checkpoints" / "step-2") is None
    monkeypatch.setattr(checkpoint, "save_model", real)
    rollwise.train(cfg, resume=True, log=lambda m: None)  # space freed: resume from step-2
    assert _stable(tmp_path / "disk" / "metrics.jsonl") == _stable(tmp_path / "full" / "metrics.jsonl")
    assert _stable(tmp_path / "disk" / "eval.jsonl") == _stable(tmp_path / "full" / "eval.jsonl")


def test_corrupted_newest_checkpoint_resumes_from_the_previous_with_a_message(tmp_path):
    cfg = _cfg(tmp_path, "c", **{"train.steps": 4, "run.keep_checkpoints": 3})
    rollwise.train(cfg, log=lambda m: None)
    newest = tmp_path / "c" / "checkpoints" / "step-4" / "model.safetensors"
    blob = bytearray(newest.read_bytes())
    blob[-1] ^= 0xFF  # one flipped bit pattern in the last weight byte
    newest.write_bytes(bytes(blob))
    messages = []
    result = rollwise.train(cfg, resume=True, log=messages.append)
    assert any("checkpoint step-4 is corrupted or incomplete (model.safetensors does not match its SHA-256 checksum)" in m
               for m in messages), messages
    assert any("resumed from" in m and "step-2" in m for m in messages)
    assert result.steps == 4 and checkpoint.list_steps(tmp_path / "c")[-1] == 4  # steps 3-4 redone, saved again
    assert (tmp_path / "c" / "checkpoints" / "corrupt-step-4").is_dir()
    assert [d["step"] for d in _stable(tmp_path / "c" / "metrics.jsonl")] == [0, 1, 2, 3]


@pytest.mark.slow
def test_compare_killed_mid_sweep_resumes_with_finished_runs_skipped(tmp_path):
    sweep = tmp_path / "sweep.toml"
    base = tiny_overrides(tmp_path, steps=3)
    base.pop("run.dir"), base.pop("run.name")
    sets = "\n".join(f"{json.dumps(k)} = {json.dumps(v) if not isinstance(v, dict) else '{' + ', '.join(f'{a} = {json.dumps(b)}' for a, b in v.items()) + '}'}"
                     for k, v in base.items())
    sweep.write_text(textwrap.dedent(f"""\
        name = "killsweep"
        out_dir = "{tmp_path / 'out'}"
        seeds = [0, 1]
        budget = {{ generated_tokens = 100000 }}
        [base]
        """) + sets + '\n[[arms]]\nname = "uniform"\n[[arms]]\nname = "drgrpo"\nset = { "advantage.name" = "dr_grpo" }\n')
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-m", "rollwise.cli", "compare", "--config", str(sweep), "--jobs", "1"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = tmp_path / "out"
    deadline = time.time() + 400
    while time.time() < deadline and proc.poll() is None:  # kill once the second run is under way
        if list(out.glob("**/done.json")) and len(list(out.glob("**/metrics.jsonl"))) >= 2:
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    finished = sorted(str(p.parent.relative_to(out)) for p in out.glob("**/done.json"))
    assert finished, "no run finished before the kill"
    mtimes = {f: (out / f / "metrics.jsonl").stat().st_mtime_ns for f in finished}
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    for f in finished:  # finished runs were not touched again
        assert (out / f / "metrics.jsonl").stat().st_mtime_ns == mtimes[f]
    result = json.loads((out / "compare.json").read_text())
    assert set(result["arms"]) == {"uniform", "drgrpo"}
    assert len(list(out.glob("**/done.json"))) == 4
    for f in finished:
        assert f"{f.split('/')[-1]}: already done, skipped" in again.stdout
