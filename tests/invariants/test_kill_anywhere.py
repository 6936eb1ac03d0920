"""A run SIGKILLed at 20+ random moments (generation, optimizer step, checkpoint write,
evaluation, and random wall-clock times), resumed with ``--resume`` after each kill, ends equal
to the uninterrupted run: the same metrics and evaluation lines (every step once, none lost or
repeated; wall-clock fields aside), and bit-identical final weights (last checkpoint and
``final/``).

Kills at chosen moments come from a child process that wraps one function (``LocalPool.generate``,
``Trainer.optimize``, ``session.evaluate``, the checkpoint's ``save_model`` / ``torch.save``) and
SIGKILLs itself before or after its n-th call; timed kills are a SIGKILL from the test after a
random delay. The kill moments are drawn by a seeded RNG; the test prints what it did.
"""

import json
import os
import random
import signal
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from conftest import as_sets, tiny_overrides

pytestmark = pytest.mark.slow

VOLATILE = ("wall_s", "time/")
N_KILLS = 20

CHILD = r"""
import os, signal, sys
phase, n, when = os.environ["ROLLWISE_TEST_KILL"].split(":")
n, calls = int(n), [0]

def die():
    os.kill(os.getpid(), signal.SIGKILL)

def wrap(owner, name):
    real = getattr(owner, name)
    def wrapped(*a, **k):
        calls[0] += 1
        hit = calls[0] == n
        if hit and when == "before":
            die()
        out = real(*a, **k)
        if hit:
            die()
        return out
    setattr(owner, name, wrapped)

if phase == "generate":
    from rollwise.distributed.local import LocalPool
    wrap(LocalPool, "generate")
elif phase == "optimize":
    from rollwise.trainer.trainer import Trainer
    wrap(Trainer, "optimize")
elif phase == "evaluate":
    import rollwise.session as s
    wrap(s, "evaluate")
elif phase == "checkpoint":
    import rollwise.trainer.checkpoint as c
    if when == "state":  # mid-write: model.safetensors written, state.pt cut off
        import rollwise.storage as st
        def cut(obj, path):
            open(path, "wb").write(b"partial")
            die()
        st.torch_save = cut
    else:
        wrap(c, "save_model")
from rollwise.cli import main
main(sys.argv[1:])
"""


def _stable(path):
    return [
        {k: v for k, v in json.loads(ln).items() if not k.startswith(VOLATILE)} for ln in path.read_text().splitlines()
    ]


def _weights(path):
    return load_file(str(path))


def _kill_and_resume(tmp_path, common, seed: int, n_kills: int, phases) -> tuple:
    """The uninterrupted run ``full``, then the run ``killed`` SIGKILLed ``n_kills`` times at moments
    drawn from ``phases`` by a seeded RNG and resumed after each, then resumed to its end; returns
    (its run directory, the log of what was done)."""
    sets = lambda o: sum((["--set", s] for s in as_sets(o)), [])  # noqa: E731
    env = dict(os.environ, ROLLWISE_TEST_KILL="none:0:before")

    def launch(args):
        return subprocess.Popen(
            [sys.executable, "-c", CHILD, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )

    ref = launch(["train", *sets(dict(common, **{"run.name": "full"}))])
    assert ref.wait(timeout=600) == 0, ref.stderr.read().decode()[-3000:]

    rng = random.Random(seed)
    run_dir = tmp_path / "killed"
    fresh = ["train", *sets(dict(common, **{"run.name": "killed"}))]
    kills, log = 0, []
    while kills < n_kills:
        phase = rng.choice(phases)
        when = rng.choice(["state", "before", "after"] if phase == "checkpoint" else ["before", "after"])
        n = rng.randint(1, 3)
        env["ROLLWISE_TEST_KILL"] = f"{phase}:{n}:{when}"
        args = ["train", "--resume", str(run_dir)] if (run_dir / "config.resolved.toml").exists() else fresh
        proc = launch(args)
        if phase == "timed":
            try:
                proc.wait(timeout=rng.uniform(4.0, 12.0))
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
        rc = proc.wait(timeout=600)
        err = proc.stderr.read().decode()
        steps = len((run_dir / "metrics.jsonl").read_text().splitlines()) if (run_dir / "metrics.jsonl").exists() else 0
        if rc == 0:  # the run finished before the kill came: start it again from scratch with the next kill
            log.append(f"{phase}:{n}:{when} finished first")
            import shutil

            shutil.rmtree(run_dir)
            continue
        assert rc == -signal.SIGKILL, f"exit {rc} after kill {phase}:{n}:{when}:\n{err[-3000:]}"
        kills += 1
        log.append(f"kill {kills}: {phase}:{n}:{when} with {steps} metrics lines on disk")
        print(log[-1], flush=True)
    final = subprocess.run(
        [sys.executable, "-m", "rollwise.cli", "train", "--resume", str(run_dir)],
        env=dict(os.environ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=600,
    )
    assert final.returncode == 0, final.stderr.decode()[-3000:]
    return run_dir, log


def test_twenty_random_kills_each_resumed_equal_uninterrupted(tmp_path):
    common = tiny_overrides(
        tmp_path, steps=8, **{"run.checkpoint_every": 2, "run.keep_checkpoints": 2, "eval.every": 3}
    )
    run_dir, log = _kill_and_resume(
        tmp_path, common, 17, N_KILLS, ["generate", "optimize", "checkpoint", "evaluate", "timed"]
    )
    print("\n".join(log))

    full = tmp_path / "full"
    got, want = _stable(run_dir / "metrics.jsonl"), _stable(full / "metrics.jsonl")
    assert [d["step"] for d in got] == list(range(8))  # every step once: none lost, none repeated
    assert got == want
    assert _stable(run_dir / "eval.jsonl") == _stable(full / "eval.jsonl")
    for rel in ("checkpoints/step-8/model.safetensors", "final/model.safetensors"):
        a, b = _weights(run_dir / rel), _weights(full / rel)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), rel


def test_async_run_killed_and_resumed_trains_every_plan_once(tmp_path):
    """Asynchronous rollouts (η = 1, a generator thread running a plan ahead), SIGKILLed 6 times
    (optimizer step, checkpoint write, wall-clock) and resumed: every step once, each step trained
    its own plan (``async/plan`` = step: none lost, none twice), every rollout charged once
    (``cost/rollouts``), and each prompt visited as often as in the uninterrupted run (the plans
    drawn ahead are in the checkpoint, so the controller's draws are not repeated or skipped)."""
    common = tiny_overrides(
        tmp_path,
        steps=8,
        **{
            "run.checkpoint_every": 2,
            "run.keep_checkpoints": 2,
            "eval.every": 3,
            "train.async.max_staleness": 1,
            "objective.name": "decoupled_ppo",
        },
    )
    run_dir, _ = _kill_and_resume(tmp_path, common, 5, 6, ["optimize", "checkpoint", "timed"])
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [d["step"] for d in lines] == list(range(8)) and [d["async/plan"] for d in lines] == list(range(8))
    assert all(d["async/max_staleness"] <= 1 for d in lines)
    full = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["cost/rollouts"] == full[-1]["cost/rollouts"] == 8 * 16

    def visits(d):
        return {p: (s["visits"], s["rollouts"]) for p, s in json.loads((d / "prompt_stats.json").read_text()).items()}  # noqa: E731

    assert visits(run_dir) == visits(tmp_path / "full")
