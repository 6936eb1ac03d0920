"""The test session leaves the machine as it found it (issue #47): a pytest plugin (``tests/conftest.py``
uses its two hooks) that fails the session, naming them, when at its end there is

- a process it started still running: a descendant of the pytest process, one whose environment
  carries this session's mark (``ROLLWISE_TEST_SESSION``, inherited by everything the tests start),
  or a Ray or sandbox helper (``ray::``, raylet, gcs_server, ``rollwise_sandbox_harness``, ...) that
  appeared during the session and was orphaned (its parents gone), unless its environment names
  another session;
- a Ray cluster file (``ray_current_cluster``) written or changed during the session, in the
  machine's ``/tmp/ray`` or in the session's own Ray directory (``RAY_TMPDIR``, set here to a
  temporary directory of the session's, so that the Ray the tests start keeps its files there);
- a new top-level entry of ``/tmp`` (pytest's own ``pytest-of-<user>`` aside). On a machine others
  use at the same time, ``ROLLWISE_TEST_TMP_IGNORE`` (space-separated glob patterns) names the
  entries that are theirs.

Zombies (ended, not yet reaped) do not count: they run nothing; nor does what the test process
itself ends at its exit (``LIFETIME_HELPERS``, ``LIFETIME_TMP``).

Under pytest-xdist (``pytest -n 2``) only the controller checks, once every worker is gone (its
``pytest_sessionfinish`` runs last, after xdist has shut the workers down): a worker cannot tell the
other worker's files and processes from its own leftovers, and the controller sees both. The workers
inherit the controller's mark, so what their tests start is named as before; each gives its Ray a
directory of its own inside the session's (``<RAY_TMPDIR>/<worker id>``), so that two workers' Rays
never share a cluster file, and the controller checks those directories too.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import pytest

MARK = "ROLLWISE_TEST_SESSION"
HELPERS = ("ray::", "raylet", "gcs_server", "/site-packages/ray/", "rollwise_sandbox_harness", "rollwise_sandbox_child")
TMP = Path("/tmp")
# What the test process itself ends at its exit, after this check: multiprocessing's helper processes
# (they exit when their parent's pipe closes) and a library's per-process temporary directory
# removed at exit (W&B's artifact and media staging directories, made when ``wandb`` is imported).
LIFETIME_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")
LIFETIME_TMP = ("tmp*wandb-artifacts", "tmp*wandb-media")
_start: dict = {}


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state, start time in clock ticks) of a live process, or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[1]), fields[0], int(fields[19])


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _mark(pid: int) -> str | None:
    """This process's ``ROLLWISE_TEST_SESSION``; "" when it has none, None when its environment cannot be read."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(MARK.encode() + b"="):
            return item.split(b"=", 1)[1].decode(errors="replace")
    return ""


def _processes() -> dict[int, tuple[int, str, int]]:
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            out[int(entry)] = st
    return out


def _cluster_files() -> dict[str, str]:
    out = {}
    dirs = {"/tmp/ray", os.path.join(os.environ.get("RAY_TMPDIR", "/tmp"), "ray")}
    if "ray_dir" in _start:  # the xdist workers' own Ray directories (module docstring)
        dirs |= {str(d) for d in Path(_start["ray_dir"]).glob("*/ray")}
    for d in dirs:
        f = Path(d) / "ray_current_cluster"
        try:
            out[str(f)] = f.read_text()
        except OSError:
            pass
    return out


def _tmp_entries() -> set[str]:
    try:
        return set(os.listdir(TMP))
    except OSError:
        return set()


def configure(worker: str | None = None) -> None:
    """At the session's start: the mark, the session's Ray directory and what the machine holds now.
    In an xdist worker (``worker``: its id) only the worker's own Ray directory: the controller, whose
    mark and ``RAY_TMPDIR`` the worker inherited, checks for the whole session."""
    if _start:
        return
    if worker is not None and os.environ.get(MARK) and os.environ.get("RAY_TMPDIR"):
        ray_dir = os.path.join(os.environ["RAY_TMPDIR"], worker)
        os.makedirs(ray_dir, exist_ok=True)
        os.environ["RAY_TMPDIR"] = ray_dir
        _start.update(worker=worker)
        return
    os.environ[MARK] = uuid.uuid4().hex
    before_tmp = _tmp_entries()
    # short (Ray's socket paths must fit in 107 characters) and the session's own
    ray_dir = tempfile.mkdtemp(prefix="rwt-", dir=TMP)
    os.environ["RAY_TMPDIR"] = ray_dir
    _start.update(
        processes={(p, st[2]) for p, st in _processes().items()},
        cluster=_cluster_files(),
        tmp=before_tmp,
        ray_dir=ray_dir,
        time=time.time(),
    )


def leftovers() -> list[str]:
    """What this session left (module docstring), one line each; removes the session's Ray directory.
    Nothing in an xdist worker: the controller checks."""
    if not _start or "worker" in _start:
        return []
    me, mark = os.getpid(), os.environ.get(MARK)
    procs = _processes()

    def ancestors(pid):
        seen = []
        while pid in procs and pid not in (0, 1) and len(seen) < 200:
            pid = procs[pid][0]
            seen.append(pid)
        return seen

    def helper(pid):
        return any(h in _cmdline(pid) for h in HELPERS)

    found = []
    for pid, (_ppid, state, started) in sorted(procs.items()):
        if pid == me or state == "Z" or (pid, started) in _start["processes"]:
            continue
        up = ancestors(pid)
        own = _mark(pid)
        orphan = all(a in (0, 1) or helper(a) for a in up)
        if up[:1] == [me] and any(h in _cmdline(pid) for h in LIFETIME_HELPERS):
            continue  # ends with this process
        if me in up or (own and own == mark) or (helper(pid) and orphan and not own):
            found.append(f"process {pid} still running: {_cmdline(pid)[:200] or '?'}")
    for path, text in sorted(_cluster_files().items()):
        if _start["cluster"].get(path) != text:
            found.append(f"Ray cluster file {path} (names {text.strip()!r}) written during the session")
    shutil.rmtree(_start["ray_dir"], ignore_errors=True)
    ignore = os.environ.get("ROLLWISE_TEST_TMP_IGNORE", "").split()
    for name in sorted(_tmp_entries() - _start["tmp"]):
        if name.startswith("pytest-of-") or any(fnmatch.fnmatch(name, g) for g in (*ignore, *LIFETIME_TMP)):
            continue
        found.append(f"/tmp/{name} created during the session")
    return found


def finish(session) -> None:
    """At the session's end: fail it, naming what was left. The code sandbox's private copies of its
    harness live as long as the process (removed at exit): released first, as the process's exit would."""
    from rollwise.verify import sandbox

    sandbox.release()
    found = leftovers()
    if not found:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    text = "the tests left the machine changed (issue #47):\n  " + "\n  ".join(found)
    if reporter is not None:
        reporter.write_sep("=", "leftovers", red=True)
        reporter.write_line(text)
    else:
        print(text)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config) -> None:
    configure(getattr(config, "workerinput", {}).get("workerid"))


@pytest.hookimpl(trylast=True)  # after xdist's controller has shut its workers down
def pytest_sessionfinish(session, exitstatus) -> None:
    finish(session)
