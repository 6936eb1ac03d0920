"""The session-end check of ``tests/leftovers.py`` (issue #47), run on a pytest session of its own: a
session whose tests leave a process running, a Ray cluster file and a ``/tmp`` entry exits non-zero
naming each of them; a session that leaves nothing exits 0. Both also under pytest-xdist (``-n 2``,
issue #41 item 5), where the workers are the session's own processes until the controller ends them
and a worker's Ray writes its cluster file in a directory of the worker's."""

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

LEAKY = """
import os, subprocess
from pathlib import Path

def test_leaves_a_process():
    p = subprocess.Popen(["sleep", "300"], start_new_session=True)
    Path("pid").write_text(str(p.pid))

def test_leaves_a_cluster_file():
    d = Path(os.environ["RAY_TMPDIR"]) / "ray"
    d.mkdir(exist_ok=True)
    (d / "ray_current_cluster").write_text("127.0.0.1:6391")

def test_leaves_a_tmp_entry():
    Path("/tmp/{name}").mkdir()
"""

CLEAN = """
import subprocess

def test_waits_for_its_process():
    subprocess.run(["true"], check=True)

def test_waits_for_another():
    subprocess.run(["true"], check=True)
"""


def _session(tmp_path, source: str, *args, **env):
    (tmp_path / "test_inner.py").write_text(source)
    env = {**os.environ, "PYTHONPATH": str(TESTS), **env}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "leftovers", "-p", "no:cacheprovider", *args, "test_inner.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("args", [(), ("-n", "2")], ids=["one process", "xdist"])
def test_a_session_that_leaves_things_fails_naming_them(tmp_path, args):
    name = f"rw-leftover-{uuid.uuid4().hex[:8]}"
    try:
        r = _session(tmp_path, LEAKY.format(name=name), *args)
    finally:
        pid = int((tmp_path / "pid").read_text()) if (tmp_path / "pid").exists() else None
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        if Path("/tmp", name).is_dir():
            Path("/tmp", name).rmdir()
    out = r.stdout + r.stderr
    assert "3 passed" in out, out
    assert r.returncode == 1, out  # every test passed, the session failed
    assert f"process {pid} still running: sleep 300" in out, out
    assert "ray_current_cluster (names '127.0.0.1:6391') written during the session" in out, out
    assert f"/tmp/{name} created during the session" in out, out


@pytest.mark.parametrize("args", [(), ("-n", "2")], ids=["one process", "xdist"])
def test_a_session_that_leaves_nothing_passes(tmp_path, args):
    # others' /tmp entries on a shared machine are not this session's
    r = _session(tmp_path, CLEAN, *args, ROLLWISE_TEST_TMP_IGNORE="*")
    assert "2 passed" in r.stdout, r.stdout + r.stderr
    assert r.returncode == 0, r.stdout + r.stderr
    assert "leftovers" not in r.stdout
