"""A finished run on Ray workers exits (issue #47): its pools are closed, in order, before Ray shuts
down, and nothing calls into Ray afterwards. A call after the shutdown would start Ray again (Ray's
auto-init), join the cluster named by a ``ray_current_cluster`` file that a stopped
``ray start --head`` left behind, and wait for that head forever.

The stale file is put where Ray reads it, in a temporary directory of the test's own (``RAY_TMPDIR``:
Ray's temporary directory, ``ray_current_cluster`` under its ``ray/``), never the machine's
``/tmp/ray``. The run is the smallest that hung: two workers, one step of staleness, two steps."""

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import as_sets, tiny_overrides

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray not installed (rollwise[ray])"),
]

BOUND_S = 240  # the run takes about a minute on 2 busy CPU cores; the old code never exited


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_async_run_on_ray_workers_exits_beside_a_stale_cluster_file(tmp_path):
    # short: Ray's socket paths (<dir>/ray/session_<date>_<pid>/sockets/...) must fit in 107 characters
    ray_tmp = Path(tempfile.mkdtemp(prefix="r"))
    stale = ray_tmp / "ray" / "ray_current_cluster"
    stale.parent.mkdir()
    stale.write_text(f"127.0.0.1:{_free_port()}")  # a head that is gone: nothing listens there
    o = tiny_overrides(
        tmp_path,
        steps=2,
        **{
            "distributed.workers": 2,
            "distributed.cpus_per_worker": 1,
            "run.threads": 1,
            "train.async.max_staleness": 1,
            "objective.name": "decoupled_ppo",
        },
    )
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "ROLLWISE_CACHE": str(tmp_path / "cache"),
        "RAY_TMPDIR": str(ray_tmp),
        "RAY_USAGE_STATS_ENABLED": "0",
        "PYTHONUNBUFFERED": "1",
        "COLUMNS": "200",
    }
    cmd = [sys.executable, "-m", "rollwise.cli", "train", *[x for s in as_sets(o) for x in ("--set", s)]]
    # its own process group: a run that does not exit is killed whole, its Ray with it
    p = subprocess.Popen(
        cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = p.communicate(timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        pytest.fail(f"rollwise train did not exit within {BOUND_S} s (killed):\n{out[-3000:]}")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        import shutil

        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert p.returncode == 0, out[-3000:]
    assert "done: 2 steps" in out and "files: " in out, out[-3000:]
    assert "Connecting to existing Ray cluster" not in out, out[-3000:]  # nothing called into Ray after it stopped
