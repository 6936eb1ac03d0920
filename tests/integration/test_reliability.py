"""Run-level reliability: a real full disk (a size-capped tmpfs) at a checkpoint, a ledger append
or the final export, a run directory made read-only and a checkpoint directory deleted mid-run
stop the run with one clear line, and the resumed run matches an uninterrupted one; a corrupted newest checkpoint is
skipped with a message; ``rollwise compare`` killed mid-sweep resumes with finished runs skipped."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import rollwise
from conftest import as_sets, tiny_overrides
from rollwise.config import load_config
from rollwise.trainer import checkpoint

VOLATILE = ("wall_s", "time/")


def _overrides(tmp_path, name, **extra):
    return tiny_overrides(tmp_path, name=name, steps=4, **{"run.checkpoint_every": 2, "run.threads": 1, **extra})


def _cfg(tmp_path, name, **extra):
    return load_config(data={}, overrides=as_sets(_overrides(tmp_path, name, **extra)))


def _stable(path):
    return [
        {k: v for k, v in json.loads(ln).items() if not k.startswith(VOLATILE)} for ln in path.read_text().splitlines()
    ]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The reference: the fault tests' run (4 steps, checkpoints every 2) never interrupted."""
    root = tmp_path_factory.mktemp("ref")
    rollwise.train(_cfg(root, "ref"), log=lambda m: None)
    return root / "ref"


def _same_as(run_dir, ref):
    from safetensors.torch import load_file

    assert _stable(run_dir / "metrics.jsonl") == _stable(ref / "metrics.jsonl")
    assert _stable(run_dir / "eval.jsonl") == _stable(ref / "eval.jsonl")
    a, b = load_file(run_dir / "final" / "model.safetensors"), load_file(ref / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _cli(*args):
    """``rollwise`` in a child process (the user's view: its output and exit status)."""
    return subprocess.run(
        [sys.executable, "-m", "rollwise.cli", *args],
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_real_full_disk_at_a_checkpoint_stops_the_cli_with_one_line_then_resume_matches(disk, uninterrupted, capsys):
    """A tmpfs with room for the first checkpoint and not the second: ``rollwise train`` stops at
    step-4 with one line (no traceback, exit 2) naming the intact step-2 and the resume command,
    leaving no .tmp-step-4; with the disk made bigger, ``--resume`` ends equal to the
    uninterrupted run."""
    ckpt = sum(f.stat().st_size for f in (uninterrupted / "checkpoints" / "step-2").iterdir())
    root = disk.tmpfs(f"{ckpt * 3 // 2 + (1 << 20)}")  # step-2 + everything else fits, step-4 does not
    run = root / "disk"
    sets = as_sets({k: v for k, v in _overrides(root, "disk").items()})
    out = _cli("train", *sum((["--set", x] for x in sets), []))
    text = out.stdout + out.stderr
    errors = [ln for ln in text.splitlines() if ln.startswith("error:")]
    with capsys.disabled():
        print(f"\n[rollwise train on a full tmpfs, exit {out.returncode}] {errors}")
    assert out.returncode == 2, text[-3000:]
    assert "Traceback" not in text
    assert len(errors) == 1 and re.fullmatch(
        rf"error: disk full \(No space left on device\) while writing checkpoint step-4 in {run}/checkpoints; the run "
        rf"stopped\. Checkpoint step-2 is intact: free space on the disk of {run}, then continue with: rollwise train "
        rf"--resume {run}",
        errors[0],
    ), errors
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-2"]  # no .tmp-step-4
    assert checkpoint.verify(run / "checkpoints" / "step-2") is None
    disk.resize(root, "64m")  # room made
    again = _cli("train", "--resume", str(run))
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    _same_as(run, uninterrupted)


def _after_checkpoint(monkeypatch, step, fault):
    """Call ``fault()`` once checkpoint step-``step`` is written (the moment of a real fault)."""
    real = checkpoint.save

    def save(run_dir, s, *a, **k):
        path = real(run_dir, s, *a, **k)
        if s == step:
            fault()
        return path

    monkeypatch.setattr(checkpoint, "save", save)
    return real


@pytest.mark.parametrize("when, failing", [(2, "metrics.jsonl in {run}"), (4, "the exported model {run}/final")])
def test_real_full_disk_at_a_ledger_append_or_the_final_export(disk, uninterrupted, monkeypatch, when, failing):
    """The disk fills up right after checkpoint step-``when``: the next write (step 2's ledger line;
    or ``final/`` after the last checkpoint) fails for real, the run stops with the message, no
    half line and no final.tmp is left, and a resume once room is made matches the uninterrupted run."""
    root = disk.tmpfs("64m")
    run = root / "d"
    filler = []
    real = _after_checkpoint(monkeypatch, when, lambda: filler.append(disk.fill(root)))
    with pytest.raises(checkpoint.CheckpointError) as e:
        rollwise.train(_cfg(root, "d"), log=lambda m: None)
    assert str(e.value).startswith(
        f"disk full (No space left on device) while writing {failing.format(run=run)}; "
        f"the run stopped. Checkpoint step-{when} is intact: free space on the disk of {run}, "
        f"then continue with: rollwise train --resume {run}"
    ), str(e.value)
    text = (run / "metrics.jsonl").read_text()  # whole lines only (one may still fit in the file's last page)
    steps = [json.loads(x)["step"] for x in text.splitlines()]
    assert text.endswith("\n") and steps == list(range(len(steps)))
    assert when <= len(steps) < 4 if failing.startswith("metrics") else len(steps) == 4
    assert not (run / "final.tmp").exists() and not (run / "final").exists()
    filler[0].unlink()
    monkeypatch.setattr(checkpoint, "save", real)
    rollwise.train(_cfg(root, "d"), resume=True, log=lambda m: None)
    _same_as(run, uninterrupted)


def test_run_directory_made_read_only_mid_run(disk, uninterrupted, tmp_path, monkeypatch):
    run = tmp_path / "ro"
    real = _after_checkpoint(monkeypatch, 2, lambda: disk.read_only(run))
    with pytest.raises(
        checkpoint.CheckpointError,
        match=rf"^read-only file system \(Read-only file system\) while writing "
        rf"metrics.jsonl in {run}; the run stopped. Checkpoint step-2 is intact: make {run} writable, then "
        rf"continue with: rollwise train --resume {run}$",
    ):
        rollwise.train(_cfg(tmp_path, "ro"), log=lambda m: None)
    with pytest.raises(
        checkpoint.CheckpointError,
        match=rf"^read-only file system .* while writing {run}/.lock; the run "
        rf"stopped. Checkpoint step-2 is intact: make {run} writable",
    ):  # a resume while still read-only
        rollwise.train(_cfg(tmp_path, "ro"), resume=True, log=lambda m: None)
    disk.unmount(run)  # writable again
    monkeypatch.setattr(checkpoint, "save", real)
    rollwise.train(_cfg(tmp_path, "ro"), resume=True, log=lambda m: None)
    _same_as(run, uninterrupted)


def test_checkpoint_directory_deleted_mid_run(uninterrupted, tmp_path, monkeypatch):
    """checkpoints/ deleted under the running run (after step-2): the run does not write step-4
    into a directory made anew as if nothing happened; it stops, saying no checkpoint is left. A
    resume then starts again at step 0 and ends equal to the uninterrupted run."""
    import shutil

    run = tmp_path / "gone"
    real = _after_checkpoint(monkeypatch, 2, lambda: shutil.rmtree(run / "checkpoints"))
    with pytest.raises(
        checkpoint.CheckpointError,
        match=rf"^directory vanished \(No such file or directory\) while writing "
        rf"checkpoint step-4 in {run}/checkpoints; the run stopped. No checkpoint is left in {run}/checkpoints: "
        rf"restore {run}, then start again with: rollwise train --resume {run}$",
    ):
        rollwise.train(_cfg(tmp_path, "gone"), log=lambda m: None)
    assert not (run / "checkpoints").exists()
    monkeypatch.setattr(checkpoint, "save", real)
    rollwise.train(_cfg(tmp_path, "gone"), resume=True, log=lambda m: None)
    _same_as(run, uninterrupted)


def test_corrupted_newest_checkpoint_resumes_from_the_previous_with_a_message(tmp_path):
    cfg = _cfg(tmp_path, "c", **{"train.steps": 4, "run.keep_checkpoints": 3})
    rollwise.train(cfg, log=lambda m: None)
    newest = tmp_path / "c" / "checkpoints" / "step-4" / "model.safetensors"
    blob = bytearray(newest.read_bytes())
    blob[-1] ^= 0xFF  # one flipped bit pattern in the last weight byte
    newest.write_bytes(bytes(blob))
    messages = []
    result = rollwise.train(cfg, resume=True, log=messages.append)
    assert any(
        "checkpoint step-4 is corrupted or incomplete (model.safetensors does not match its SHA-256 checksum)" in m
        for m in messages
    ), messages
    assert any("resumed from" in m and "step-2" in m for m in messages)
    assert result.steps == 4 and checkpoint.list_steps(tmp_path / "c")[-1] == 4  # steps 3-4 redone, saved again
    assert (tmp_path / "c" / "checkpoints" / "corrupt-step-4").is_dir()
    assert [d["step"] for d in _stable(tmp_path / "c" / "metrics.jsonl")] == [0, 1, 2, 3]


@pytest.mark.slow
def test_compare_killed_mid_sweep_resumes_with_finished_runs_skipped(tmp_path):
    sweep = tmp_path / "sweep.toml"
    base = tiny_overrides(tmp_path, steps=3)
    base.pop("run.dir"), base.pop("run.name")
    sets = "\n".join(
        f"{json.dumps(k)} = {json.dumps(v) if not isinstance(v, dict) else '{' + ', '.join(f'{a} = {json.dumps(b)}' for a, b in v.items()) + '}'}"  # noqa: E501
        for k, v in base.items()
    )
    sweep.write_text(
        textwrap.dedent(f"""\
        name = "killsweep"
        out_dir = "{tmp_path / "out"}"
        seeds = [0, 1]
        budget = {{ generated_tokens = 100000 }}
        [base]
        """)
        + sets
        + '\n[[arms]]\nname = "uniform"\n[[arms]]\nname = "drgrpo"\nset = { "advantage.name" = "dr_grpo" }\n'
    )
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


def test_real_full_disk_at_compare_json(disk, tmp_path, monkeypatch, capsys):
    """``rollwise compare`` whose disk fills up once its runs are done: one line (exit 2) saying
    what to do, no compare.json (nor its temporary); run again with room, it skips the finished
    run and writes compare.json."""
    from rollwise import cli
    from rollwise.bench import runner

    out = disk.tmpfs("64m")
    base = tiny_overrides(tmp_path, steps=2, **{"run.threads": 1})
    base.pop("run.dir"), base.pop("run.name")
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(
        'name = "full"\nseeds = [0]\nbudget = { generated_tokens = 100000 }\n[base]\n'
        + "\n".join(f"{json.dumps(k)} = {v}" for k, v in (x.split("=", 1) for x in as_sets(base)))
        + '\n[[arms]]\nname = "uniform"\n'
    )
    real, filler = runner.collect, []

    def collect(specs):  # the runs are done; then the disk is full
        filler.append(disk.fill(out))
        return real(specs)

    monkeypatch.setattr(runner, "collect", collect)
    with pytest.raises(SystemExit) as e:
        cli.main(["compare", "--config", str(sweep), "--out-dir", str(out)])
    printed = capsys.readouterr().out
    errors = [ln for ln in printed.splitlines() if ln.startswith("error:")]
    assert e.value.code == 2 and "Traceback" not in printed
    assert errors == [
        f"error: disk full (No space left on device) while writing compare.json in {out}: free space on the disk "
        f"of {out}, then run the same rollwise compare again (finished runs are skipped)"
    ], printed[-2000:]
    assert not (out / "compare.json").exists() and not (out / "compare.json.tmp").exists()
    filler[0].unlink()
    monkeypatch.setattr(runner, "collect", real)
    cli.main(["compare", "--config", str(sweep), "--out-dir", str(out)])
    assert "uniform-s0: already done, skipped" in capsys.readouterr().out
    assert json.loads((out / "compare.json").read_text())["sweep"]["arms"] == ["uniform"]
