"""A run killed with SIGKILL after a checkpoint and resumed matches an uninterrupted run."""

import json
import os
import signal
import subprocess
import sys
import time

from conftest import as_sets, tiny_overrides

VOLATILE = ("wall_s", "time/")


def _cli(args, **kw):
    return subprocess.Popen([sys.executable, "-m", "rollwise.cli", *args], env=dict(os.environ), **kw)


def _stable(path):
    out = []
    for line in path.read_text().splitlines():
        d = json.loads(line)
        out.append({k: v for k, v in d.items() if not k.startswith(VOLATILE)})
    return out


def test_sigkill_then_resume_matches_uninterrupted(tmp_path):
    common = tiny_overrides(
        tmp_path,
        steps=10,
        **{
            "run.checkpoint_every": 3,
            "eval.every": 5,
            "control.prompts_per_step": 8,
            "task.options": {"n_train": 400, "n_heldout": 20},
        },
    )
    full = dict(common, **{"run.name": "full"})
    killed = dict(common, **{"run.name": "killed"})
    sets = lambda o: sum((["--set", s] for s in as_sets(o)), [])  # noqa: E731
    assert _cli(["train", *sets(full)], stdout=subprocess.DEVNULL).wait(timeout=300) == 0

    proc = _cli(["train", *sets(killed)], stdout=subprocess.DEVNULL)
    ckpt = tmp_path / "killed" / "checkpoints" / "step-3"
    deadline = time.time() + 300
    while not ckpt.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert ckpt.exists()
    steps_done = len((tmp_path / "killed" / "metrics.jsonl").read_text().splitlines())
    assert steps_done < 10, "the run finished before it could be killed"

    assert _cli(["train", "--resume", str(tmp_path / "killed")], stdout=subprocess.DEVNULL).wait(timeout=300) == 0
    assert _stable(tmp_path / "killed" / "metrics.jsonl") == _stable(tmp_path / "full" / "metrics.jsonl")
    assert _stable(tmp_path / "killed" / "eval.jsonl") == _stable(tmp_path / "full" / "eval.jsonl")
