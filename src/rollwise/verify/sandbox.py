"""Running untrusted code checks: one sandboxed process tree per call (the ``code`` verifier's engine).

``Sandbox(limits, isolation).run(source, test, entry_point, prelude) -> SandboxResult``

Each call starts ``python -I -S -B rollwise_sandbox_harness.py`` (the trusted harness, see that
module) with a clean environment, in a new session, and feeds it the job on stdin (limits,
source, test, a per-call nonce). The harness first starts the completion's process -- a fork of
itself taken before it has read anything, running ``rollwise_sandbox_child.py`` -- then makes
itself non-dumpable, and only then reads the job; both lower their resource limits (CPU
seconds, address space, processes, file size, open files, no core dumps) before anything
untrusted runs. The harness runs the test itself against a proxy that forwards each call to the
child over a pipe. This side enforces the wall-clock limit and the size of what comes back,
accepts only the report that carries the nonce, then kills whatever the call left behind.

Threat model. The completion is adversarial: it wants a pass it did not earn, or to harm the
machine. It runs only in the child process, which sees:

- its own source (prompt + completion) and the entry point's name;
- the arguments of each call, as plain data, in order (the child is one process per
  verification, so it may keep state between the calls of one verification, as HumanEval's own
  harness allows);
- its working directory (empty at the start), the standard library, and an environment of
  ``PATH``, ``HOME``, ``TMPDIR``, ``LANG`` and the call's random marker.

It cannot see: the test, the expected values, the compiled ``check``, the prelude's objects or
the job (the child is forked before the harness reads any of them, so no frame, ``gc`` object,
byte of ``/proc/self/mem``, descriptor, environment variable or argv of the child holds them,
and the completion runs only after the harness has read its stdin to the end; the harness
that holds them is non-dumpable, so ``/proc/<harness>/{mem,environ,fd}`` and ptrace are closed,
and its stdin pipe is drained before untrusted code runs); whether its answers were accepted
(beyond the fact that the test goes on calling: the first failed assert ends the verification);
other verifications' calls or results (one process and one empty working directory per
verification, removed after it; the verdict cache keys on (prompt id, program)); the trainer's
files, home, ``/tmp``, environment or processes (bwrap: not mounted, other namespaces; rlimit: the
kernel confinement below, or a different uid when run as root); the network (bwrap: an empty
network namespace; rlimit: the seccomp filter, or the guard as root without confinement).

It can write anything to its reply pipe (that descriptor lives in its process), which is worth
exactly what returning a value is worth: the harness accepts only the reply numbered for the call
it just made, of a known kind, plain built-ins within the reply cap and 100 levels of nesting; a
reply it refuses, a non-plain return value, or a ``BaseException`` that ``except Exception`` would
not catch fails the verification even if the test catches everything. No code of the completion
runs where the verdict is decided: the tests compare decoded built-ins. It cannot write the
harness's report: the harness's stdout is not among its descriptors, ``/proc/<harness>/fd`` is
closed, and a line without the call's nonce (which only this process and the harness hold) is
ignored. The verdict is ``correct`` only when ``check`` returned normally in the harness.

Kernel confinement (``rollwise_sandbox_child.confine``), applied by the child to itself before
the source is compiled, irrevocably, and inherited by everything it starts: Landlock (reads only
in the standard library and the shared-library directories, writes only in its working
directory, no ``execve``, nothing under ``/proc``, no TCP; from Landlock ABI 6 no signals outside
the sandbox) and a seccomp filter (no ``kill`` and its kin, ptrace, cross-process memory calls,
pidfds, io_uring or sockets). So a completion that switches off the Python-level guard (its state
lives in objects ``gc`` reaches) still cannot open another process's descriptors or memory,
signal it, or reach the report pipe. A confinement probe runs once per process (its effect is
checked: a confined program cannot open ``/proc/self/status``); where it works it is used in
both isolations, and ``describe()``, every verdict's details (``confinement``) and the ledger
(``sandbox/*``) say so.

What rollwise promises, by setting:

- bwrap (any user): namespaces; the harness is the sandbox's PID 1 (``--as-pid-1``), so no
  dumpable process of the sandbox holds the report pipe (bwrap's own reaper did, and a
  completion could read and rewrite the report through ``/proc/1/fd``); plus the confinement
  where the kernel has it.
- rlimit, trainer not root: runs only where the confinement works (Linux 5.13+ with Landlock,
  x86_64 or aarch64); elsewhere a code task refuses to start, naming how to get isolation,
  unless ``unsafe = true`` (trusted code only: the log's line and the ledger say UNSAFE; a
  completion can then forge its pass).
- rlimit, trainer root: a dedicated uid per call (it cannot open or signal the trainer), the
  guard, and the confinement where the kernel has it.

Not promised: resource exhaustion is bounded by the limits below, not prevented; a completion
can always fail itself (``could not verify`` is reserved for the harness failing); Landlock
before ABI 3 cannot forbid truncating a file the process could already reach (none outside its
working directory, since it cannot open them); without ABI 6, signals are refused by the
seccomp filter only.

Isolation, chosen by ``isolation`` (``"auto"`` picks the first that works on this machine, probed
once per process; the choice is in every verdict's details and in the run's log and ledger):

- ``"bwrap"`` (Debian's ``bubblewrap``): new user, PID, network, IPC, UTS and cgroup namespaces
  (no network at all); a read-only view of ``/usr`` and the interpreter's prefix only (the
  trainer's files, home and ``/tmp`` are not there); ``/dev`` holds only null, zero and urandom;
  the one writable place is an empty size-capped tmpfs ``/work`` (``disk_mb``). The sandbox's
  PID 1 dies with its parent, which takes every process of the call with it.
- ``"rlimit"`` (fallback where bubblewrap is missing or cannot create namespaces): the same
  harness and resource limits in a plain subprocess whose working directory is a fresh private
  temporary directory, the kernel confinement above, and an in-process audit-hook guard in the
  completion's process (writes only in that directory, reads only there and in the standard
  library, no sockets, subprocesses, exec, ctypes, or signals to other processes): a defence in
  depth, Python-level, which a completion can switch off.

In both, when this process runs as root the sandbox runs as a dedicated unprivileged user (one
per concurrent call, from ``UID_BASE`` up, offset by the process id), so the process-count limit holds (root is exempt
from it) and the sandbox cannot signal or read the trainer. Without root the sandbox shares the trainer's
user; the process limit is then set relative to that user's current task count.

Clean-up after every call, whatever happened: the session is killed, then every process of the
call (:func:`marked`: the call's token as the harness's last argument, which its forks keep, or
``ROLLWISE_SANDBOX_ID`` in the initial environment, which a detached grandchild inherits) is
killed, then the temporary directory is removed. Under bwrap the harness dies with its parent
(``--die-with-parent``) and, as PID 1, takes every process of the namespace with it.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

HARNESS = Path(__file__).with_name("rollwise_sandbox_harness.py")
CHILD = Path(__file__).with_name("rollwise_sandbox_child.py")  # the harness finds it beside itself
INNER_DIR = "/rollwise"  # where bwrap shows the harness's directory
MARKER = "ROLLWISE_SANDBOX_ID"
UID_BASE = 61000  # dedicated sandbox uids when running as root: UID_BASE .. UID_BASE + UID_SLOTS - 1
UID_SLOTS = 64
FAILURES = (
    "wrong_answer",
    "exception",
    "syntax_error",
    "no_function",
    "timeout",
    "memory",
    "output_limit",
    "killed",
    "exited",
)

# the trusted test of ``Sandbox.call``: the harness reports a str left in REPORT
_CALL_TEST = "def check(candidate):\n    global REPORT\n    REPORT = candidate()\n    assert type(REPORT) is str\n"

Isolation = Literal["auto", "bwrap", "rlimit"]


class Limits(BaseModel):
    """Per-call limits of the code sandbox (``task.options.sandbox`` of the code tasks)."""

    model_config = ConfigDict(extra="forbid")

    isolation: Isolation = Field(
        "auto",
        description="'bwrap' (bubblewrap namespaces), 'rlimit' (resource limits and an "
        "audit-hook guard in a plain subprocess) or 'auto' (bwrap where it works, else rlimit).",
    )
    wall_s: float = Field(
        5.0, gt=0, le=600, description="Wall-clock seconds per call, start-up included; then the whole call is killed."
    )
    cpu_s: int = Field(3, ge=1, le=600, description="CPU seconds per process (RLIMIT_CPU).")
    memory_mb: int = Field(512, ge=64, le=65536, description="Address space per process in MiB (RLIMIT_AS).")
    processes: int = Field(16, ge=2, le=4096, description="Processes the sandbox may hold at once (RLIMIT_NPROC).")
    file_mb: int = Field(8, ge=1, le=4096, description="Largest file the sandbox may write, MiB (RLIMIT_FSIZE).")
    disk_mb: int = Field(
        16,
        ge=1,
        le=4096,
        description="Size of the writable working directory, MiB (bwrap's tmpfs; rlimit: file_mb per file).",
    )
    output_bytes: int = Field(
        65536,
        ge=1024,
        le=1 << 30,
        description="Most bytes the completion may print (and most per return value); more is 'output_limit'.",
    )
    unsafe: bool = Field(
        False,
        description="Run completions without operating-system confinement where none can be had "
        "(no bubblewrap namespaces, no Landlock and seccomp, not root). A completion can then forge "
        "its pass and reach the trainer's files and processes: for trusted code only. Off: such a "
        "machine refuses to start a code task, naming how to get isolation.",
    )
    python: str = Field(
        "",
        description="Interpreter that runs inside the sandbox (standard library only); empty: "
        "this interpreter's base executable when other users can read it, else /usr/bin/python3.",
    )


@dataclass(frozen=True)
class SandboxResult:
    status: str  # "correct", a failure in FAILURES, or "sandbox_error" (could not verify)
    detail: str
    seconds: float
    isolation: str  # "bwrap" or "rlimit"
    output_bytes: int = 0
    calls: int = 0
    extra: dict = field(default_factory=dict)


# ---------------------------------------------------------------- environment facts


def _world_traversable(path: str) -> bool:
    """True when every directory above ``path`` is searchable and ``path`` readable by others."""
    p = Path(path).resolve()
    for parent in reversed(p.parents):
        try:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
    try:
        return bool(os.stat(p).st_mode & stat.S_IROTH)
    except OSError:
        return False


def default_python() -> str:
    base = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    if os.geteuid() != 0 or _world_traversable(base):
        return base
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(cand) and _world_traversable(os.path.realpath(cand)):
            return cand
    return base


def _prefix(python: str) -> str:
    """The installation prefix of ``python`` (``<prefix>/bin/python3``)."""
    return str(Path(os.path.realpath(python)).parent.parent)


class _Uids:
    """Dedicated uids for concurrent calls (root only)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        base = UID_BASE + (os.getpid() % 64) * UID_SLOTS  # concurrent trainer processes rarely share a uid
        self.free = list(range(base, base + UID_SLOTS))

    def take(self) -> int:
        with self.lock:
            if not self.free:
                raise RuntimeError(f"more than {UID_SLOTS} concurrent sandbox calls")
            return self.free.pop(0)

    def give(self, uid: int) -> None:
        with self.lock:
            self.free.append(uid)


_UIDS = _Uids()
_PROBED: dict[tuple, tuple[bool, str]] = {}
_PROBE_LOCK = threading.Lock()
CHECK_ONE = "def check(c):\n    assert c() == 1\n"
_CONFINE_PROBE = (
    "def f():\n    try:\n        open('/proc/self/status').close()\n    except OSError:\n"
    "        return 1\n    return 0\n"
)
UNSAFE_WARNING = (
    "WARNING: UNSAFE CODE EXECUTION: completions run as this user with no operating-system confinement "
    "(task.options.sandbox.unsafe = true); a completion can forge its pass and reach this process"
)


def _probed(key: tuple, probe) -> tuple[bool, str]:
    """``probe()``'s answer, computed once per process for ``key``."""
    with _PROBE_LOCK:
        if key not in _PROBED:
            _PROBED[key] = probe()
        return _PROBED[key]


def _user_tasks(uid: int) -> int:
    """Threads currently owned by ``uid`` (what RLIMIT_NPROC counts)."""
    n = 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                st = os.stat(f"/proc/{d}")
                if st.st_uid == uid:
                    n += len(os.listdir(f"/proc/{d}/task"))
            except OSError:
                pass
    return n


_CODE: dict[str, tuple[str, str]] = {}
_CODE_LOCK = threading.Lock()


def _code_dir(python: str) -> tuple[str, str]:
    """(directory, harness file name) that a call runs. Once per process and interpreter, the
    harness and the child program are copied to a private directory that the sandbox can read
    and not write, with ``.pyc`` files compiled by that interpreter beside them, so a call does
    not compile them again (the harness runs its ``.pyc``; it loads the child's ``.pyc``, falling
    back to the source). When that fails: the package's directory and the sources."""
    with _CODE_LOCK:
        if python not in _CODE or not os.path.isfile(os.path.join(*_CODE[python])):  # new, or removed by a /tmp cleaner
            fallback = (str(HARNESS.parent), HARNESS.name)
            try:
                d = tempfile.mkdtemp(prefix="rollwise-sandbox-code-")
                for src in (HARNESS, CHILD):
                    shutil.copyfile(src, Path(d) / src.name)
                compile_cmd = (
                    "import py_compile, sys\nfor f in sys.argv[1:]:\n"
                    "    py_compile.compile(f, cfile=f + 'c', doraise=True)\n"
                )
                subprocess.run(
                    [python, "-I", "-S", "-c", compile_cmd, *(str(Path(d) / src.name) for src in (HARNESS, CHILD))],
                    check=True,
                    capture_output=True,
                    timeout=120,
                    env={"PATH": "/usr/bin:/bin"},
                )
                for f in Path(d).iterdir():
                    os.chmod(f, 0o644)
                os.chmod(d, 0o755)
                _CODE[python] = (d, HARNESS.name + "c")
            except (OSError, subprocess.SubprocessError):
                _CODE[python] = fallback
        return _CODE[python]


def marked(pid: str | int, token: str) -> bool:
    """Whether process ``pid`` belongs to the call ``token``: ``MARKER=token`` in its initial
    environment (a detached grandchild inherits it), or the token as its last argument (the
    harness and whatever it forks carry it in their command line, which stays readable when the
    harness is non-dumpable and its environment is not)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if f.read().split(b"\0")[-2:-1] == [token.encode()]:
                return True
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"{MARKER}={token}".encode() in f.read().split(b"\0")
    except OSError:
        return False


@atexit.register
def release() -> None:
    """Remove the private copies of the harness that :func:`_code_dir` made (at interpreter exit, or
    earlier by whoever knows no call follows: the test session's end); a later call makes them anew."""
    with _CODE_LOCK:
        for d, _ in _CODE.values():
            if d != str(HARNESS.parent):
                shutil.rmtree(d, ignore_errors=True)
        _CODE.clear()


def sweep(token: str) -> int:
    """SIGKILL every process of the call ``token`` (:func:`marked`); repeats until none is left
    (a fork loop can add one between scans). Returns how many were killed."""
    killed = 0
    for _ in range(50):
        found = [int(d) for d in os.listdir("/proc") if d.isdigit() and int(d) != os.getpid() and marked(d, token)]
        if not found:
            break
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
        time.sleep(0.01)
    return killed


# ---------------------------------------------------------------- the sandbox


class Sandbox:
    def __init__(self, limits: Limits | None = None):
        self.limits = limits or Limits()
        self.python = self.limits.python or default_python()
        if not (os.path.isfile(self.python) and os.access(self.python, os.X_OK)):
            from rollwise.registry import UserError

            raise UserError(f"task.options.sandbox.python: {self.python!r} is not an executable file")
        self.code = _code_dir(self.python)
        self.confine = False  # rlimit: the child confines itself (Landlock + seccomp) before the source runs
        self.unsafe = False  # rlimit without root and without confinement, opted into (limits.unsafe)
        self.isolation = "bwrap"  # set by _choose: the isolation the probes run under
        self.isolation, self.why = self._choose(self.limits.isolation)

    def describe(self) -> str:
        lim = self.limits
        line = (
            f"code sandbox: {self.isolation} ({self.why}); python {self.python}; limits wall {lim.wall_s}s, cpu "
            f"{lim.cpu_s}s, memory {lim.memory_mb} MiB, {lim.processes} processes, output {lim.output_bytes} B"
        )
        return (UNSAFE_WARNING + "; " + line) if self.unsafe else line

    def ledger_facts(self) -> dict:
        """What the run's ledger records on every line about the code it ran (``sandbox/*``)."""
        return {"sandbox/isolation": self.isolation, "sandbox/confined": self.confine, "sandbox/unsafe": self.unsafe}

    # ------------------------------------------------------------ choosing isolation
    def _choose(self, wanted: str) -> tuple[str, str]:
        from rollwise.registry import UserError

        why = "asked for"
        if wanted != "rlimit":
            ok, why = _probed(("bwrap", self.python, os.geteuid()), self._probe_bwrap)
            if ok:  # namespaces isolate; the kernel's confinement is added where it works
                self.confine, how = _probed(("confine-bwrap", self.python, os.geteuid()), self._probe_confine)
                return "bwrap", f"{why}; " + (f"confined by {how}" if self.confine else f"not confined: {how}")
            if wanted == "bwrap":
                raise UserError(
                    f"task.options.sandbox.isolation = 'bwrap' but bubblewrap cannot run here: {why}; "
                    "install it (apt-get install bubblewrap) or use 'auto' / 'rlimit'"
                )
            why = f"fallback: {why}"
        self.isolation = "rlimit"
        ok, how = _probed(("confine", self.python, os.geteuid()), self._probe_confine)
        if ok:
            self.confine = True
            return "rlimit", f"{why}; confined by {how}"
        if os.geteuid() == 0:
            return "rlimit", f"{why}; no Landlock/seccomp confinement ({how}): a dedicated user and the guard"
        if self.limits.unsafe:
            self.unsafe = True
            return "rlimit", f"{why}; NOT CONFINED ({how}), task.options.sandbox.unsafe = true"
        raise UserError(
            "no isolation for untrusted code on this machine: bubblewrap cannot create namespaces "
            f"({why}) and the kernel refused Landlock/seccomp confinement ({how}), and this process is "
            "not root; a completion could forge its pass. Get isolation with `apt-get install bubblewrap` "
            "and unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, or on Ubuntu "
            "kernel.apparmor_restrict_unprivileged_userns=0), or a Linux 5.13+ kernel with Landlock "
            "enabled; or, for trusted code only, set task.options.sandbox.unsafe = true"
        )

    def _probe_bwrap(self) -> tuple[bool, str]:
        if shutil.which("bwrap") is None:
            return False, "bwrap not installed"
        res = self._run_once("bwrap", "def f():\n    return 1\n", CHECK_ONE, "f", "", probe=True)
        if res.status == "correct":
            return True, "bubblewrap namespaces work"
        return False, f"bwrap probe failed: {res.status}: {res.detail[:200]}"

    def _probe_confine(self) -> tuple[bool, str]:
        """Whether the child can confine itself here, checked by its effect: with the guard off, a
        confined program cannot open its own ``/proc/self/status``."""
        res = self._run_once(self.isolation, _CONFINE_PROBE, CHECK_ONE, "f", "", probe=True, confine=True)
        if res.status == "correct":
            return True, res.extra.get("confinement", "Landlock + seccomp")
        return False, f"{res.status}: {res.detail[:200]}"

    # ------------------------------------------------------------ one call
    def run(self, source: str, test: str, entry_point: str, prelude: str = "") -> SandboxResult:
        """Run ``check(candidate)`` from ``test`` against ``entry_point`` defined by ``source``."""
        self.code = _code_dir(self.python)
        return self._run_once(self.isolation, source, test, entry_point, prelude)

    def call(self, source: str, entry_point: str) -> SandboxResult:
        """Run ``entry_point()`` defined by ``source`` and bring back the str it returns (a tool's
        output: ``rollwise.envs.python_math``) in ``extra["value"]``, under the same isolation and
        limits as a check; status ``"correct"`` when it returned a str, else the failure."""
        return self.run(source, _CALL_TEST, entry_point)

    def _command(self, isolation: str, workdir: str, token: str) -> list[str]:
        py = ["-I", "-S", "-B"]
        code_dir, harness = self.code
        if isolation == "rlimit":
            return [self.python, *py, str(Path(code_dir) / harness), token]
        lim = self.limits
        # --as-pid-1: the harness itself (non-dumpable) is the namespace's PID 1. bwrap's own reaper
        # would be PID 1 otherwise: a dumpable process of the sandbox's user holding the report pipe,
        # which the completion could open through /proc/1/fd and rewrite
        args = ["bwrap", "--unshare-all", "--as-pid-1", "--die-with-parent", "--new-session"]
        args += ["--ro-bind", "/usr", "/usr"]
        for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
            if os.path.islink(top):
                args += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                args += ["--ro-bind", top, top]
        prefix = _prefix(self.python)
        if not prefix.startswith("/usr/") and prefix != "/usr":
            args += ["--ro-bind", prefix, prefix]
        args += ["--ro-bind", code_dir, INNER_DIR, "--proc", "/proc"]
        for dev in ("/dev/null", "/dev/zero", "/dev/urandom"):
            args += ["--dev-bind", dev, dev]
        args += [
            "--size",
            str(lim.disk_mb * 1024 * 1024),
            "--tmpfs",
            "/work",
            "--chdir",
            "/work",
            "--remount-ro",
            "/",
            "--clearenv",
            "--setenv",
            "PATH",
            "/usr/bin:/bin",
            "--setenv",
            "HOME",
            "/work",
            "--setenv",
            "TMPDIR",
            "/work",
            "--setenv",
            "LANG",
            "C.UTF-8",
            "--setenv",
            MARKER,
            token,
        ]
        return args + [self.python, *py, f"{INNER_DIR}/{harness}", token]  # the token: see marked()

    def _run_once(
        self,
        isolation: str,
        source: str,
        test: str,
        entry_point: str,
        prelude: str,
        probe: bool = False,
        confine: bool | None = None,
    ) -> SandboxResult:
        lim = self.limits
        t0 = time.perf_counter()
        token = secrets.token_hex(8)
        root = os.geteuid() == 0
        uid = _UIDS.take() if root else None
        workdir = None
        proc = None
        try:
            if isolation == "rlimit":
                workdir = tempfile.mkdtemp(prefix="rollwise-sandbox-")
                if uid is not None:
                    os.chown(workdir, uid, uid)
                os.chmod(workdir, 0o700)
            inner_work = "/work" if isolation == "bwrap" else workdir
            nproc = lim.processes if root else _user_tasks(os.geteuid()) + lim.processes
            nonce = secrets.token_hex(16)  # authenticates the harness's report
            job = {
                "prelude": prelude,
                "test": test,
                "source": source,
                "entry_point": entry_point,
                "nonce": nonce,
                "confine": self.confine if confine is None else confine,
                "guard": isolation == "rlimit" and not probe,  # the confinement probe checks the kernel alone
                "workdir": inner_work,
                "max_files": max(1, lim.disk_mb // lim.file_mb) + 1,
                "limits": {
                    "cpu_s": lim.cpu_s,
                    "memory_mb": lim.memory_mb,
                    "nproc": nproc,
                    "file_mb": lim.file_mb,
                    "output_bytes": lim.output_bytes,
                },
            }
            env = {
                "PATH": "/usr/bin:/bin",
                "HOME": inner_work or "/",
                "TMPDIR": inner_work or "/",
                "LANG": "C.UTF-8",
                MARKER: token,
            }
            kw = dict(user=uid, group=uid, extra_groups=[]) if uid is not None else {}
            try:
                proc = subprocess.Popen(
                    self._command(isolation, workdir or "/", token),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    cwd=workdir or "/",
                    env=env,
                    start_new_session=True,
                    close_fds=True,
                    **kw,
                )
            except OSError as e:
                return SandboxResult(
                    "sandbox_error", f"could not start the sandbox: {e}", time.perf_counter() - t0, isolation
                )
            out, err, timed_out, too_big = _communicate(
                proc, json.dumps(job).encode(), lim.wall_s, lim.output_bytes + 8192
            )
            rc = proc.returncode
        finally:
            if proc is not None:
                _kill_session(proc)
            sweep(token)
            if uid is not None:
                _UIDS.give(uid)
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)
        seconds = time.perf_counter() - t0
        if timed_out:
            return SandboxResult(
                "timeout", f"wall-clock limit {lim.wall_s}s", seconds, isolation, extra={"sandbox_id": token}
            )
        if too_big:
            return SandboxResult("sandbox_error", "the harness wrote more than its report", seconds, isolation)
        rep = _report(out, nonce)
        if rep is None:
            # the harness itself was killed (by the completion, or a limit); bwrap reports it as 128 + signal
            sig = -rc if rc is not None and rc < 0 else rc - 128 if rc is not None and rc > 128 else None
            if sig:
                status = "timeout" if sig == signal.SIGXCPU else "killed"
                return SandboxResult(
                    status, f"harness ended by signal {sig}", seconds, isolation, extra={"sandbox_id": token}
                )
            tail = err.decode(errors="replace")[-300:]
            return SandboxResult("sandbox_error", f"no report (exit {rc}): {tail}", seconds, isolation)
        status = rep["status"]
        if status not in FAILURES and status != "correct":  # "harness_error": the check itself could not run
            status = "sandbox_error"
        return SandboxResult(
            status,
            str(rep.get("detail", "")),
            seconds,
            isolation,
            int(rep.get("output_bytes", 0)),
            int(rep.get("calls", 0)),
            {
                "sandbox_id": token,
                **({"value": rep["value"]} if isinstance(rep.get("value"), str) else {}),
                **({"confinement": rep["confinement"]} if isinstance(rep.get("confinement"), str) else {}),
            },
        )


def _report(out: bytes, nonce: str) -> dict | None:
    """The harness's report: the last stdout line that is a JSON object carrying this call's nonce
    (a line without it, from whatever wrote there, is not the harness's)."""
    for line in reversed(out.decode(errors="replace").splitlines()):
        try:
            rep = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(rep, dict) and rep.get("nonce") == nonce and isinstance(rep.get("status"), str):
            return rep
    return None


def _communicate(proc, data: bytes, wall_s: float, cap: int) -> tuple[bytes, bytes, bool, bool]:
    """Write ``data`` to stdin, read stdout/stderr until EOF, the deadline or ``cap`` bytes."""
    deadline = time.monotonic() + wall_s
    try:
        proc.stdin.write(data)
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    bufs = {out_fd: bytearray(), err_fd: bytearray()}
    open_fds = set(bufs)
    timed_out = too_big = False
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        ready, _, _ = select.select(list(open_fds), [], [], left)
        for fd in ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                open_fds.discard(fd)
                continue
            bufs[fd] += chunk
            if len(bufs[fd]) > cap:
                too_big = True
                open_fds.clear()
    if timed_out or too_big:
        _kill_session(proc)
    try:
        proc.wait(timeout=max(0.1, deadline - time.monotonic()) if not (timed_out or too_big) else 2)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_session(proc)
        proc.wait()
    proc.stdout.close()
    proc.stderr.close()
    return bytes(bufs[out_fd]), bytes(bufs[err_fd]), timed_out, too_big


def _kill_session(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        proc.wait(timeout=2)
    except Exception:
        pass
