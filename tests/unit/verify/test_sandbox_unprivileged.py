"""The code sandbox with the trainer as an ordinary user (issue #40, item 1).

An ordinary user is the common case, and there the sandbox shares the trainer's uid. The hostile
corpus, the forged-pass attack among it (the guard switched off from inside through ``gc``, then
the trainer's end of the report pipe reached through ``/proc/<pid>/fd``), runs with the trainer
as ``nobody`` in both isolations. When the suite runs as root, the trainer is a subprocess that
drops to ``nobody``; as an ordinary user the suite's own process is that trainer already (and
``test_code_sandbox.py`` runs the corpus there).

Where the kernel's confinement cannot be had, a non-root trainer must refuse to run code unless
asked for unsafe execution: tested by really taking Landlock away from the trainer (a seccomp
filter that answers its system call with ENOSYS, inherited by everything the trainer starts).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pydantic
import pytest

import rollwise
from rollwise.verify.sandbox import _world_traversable

NOBODY = 65534
HERE = Path(__file__).resolve().parent

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="needs root to become nobody (as an ordinary user, "
    "test_code_sandbox.py already runs the corpus unprivileged)",
)

# runs as nobody: the corpus in both isolations, results to a file (never the trainer's stdout,
# a pipe that a hostile case may read)
CORPUS = """
import json, sys, tempfile
from dataclasses import asdict
from pathlib import Path
from rollwise.registry import UserError
from rollwise.verify.hostile import CASES, run_corpus
from rollwise.verify.sandbox import Limits, Sandbox
names = set(sys.argv[2].split(",")) if len(sys.argv) > 2 else None
cases = [c for c in CASES if names is None or c.name in names]
out = {}
for iso in ("bwrap", "rlimit"):
    try:
        sb = Sandbox(Limits(isolation=iso, wall_s=4.0, cpu_s=1))
    except UserError as e:
        out[iso] = {"refused": str(e)}
        continue
    res = run_corpus(sb, Path(tempfile.mkdtemp()) / "outside", cases)
    out[iso] = {"why": sb.why, "confined": sb.confine, "results": [asdict(r) for r in res]}
Path(sys.argv[1]).write_text(json.dumps(out))
"""

# takes Landlock away from this process and all it starts (seccomp: landlock_create_ruleset -> ENOSYS)
NO_LANDLOCK = """
import ctypes, os
class F(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]
class P(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(F))]
prog = [(0x20, 0, 0, 0), (0x15, 0, 1, 444), (0x06, 0, 0, 0x00050000 | 38), (0x06, 0, 0, 0x7FFF0000)]
arr = (F * 4)(*[F(*p) for p in prog])
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0 and libc.prctl(22, 2, ctypes.byref(P(4, arr)), 0, 0) == 0
import json, sys
from rollwise.registry import UserError
from rollwise.verify.sandbox import Limits, Sandbox
out = {}
try:
    Sandbox(Limits(isolation="rlimit"))
    out["default"] = "started"
except UserError as e:
    out["default"] = "refused: " + str(e)
sb = Sandbox(Limits(isolation="rlimit", unsafe=True))
out["unsafe"] = {"describe": sb.describe(), "facts": sb.ledger_facts()}
out["unsafe_run"] = sb.run("def f():\\n    return 1\\n", "def check(c):\\n    assert c() == 1\\n", "f").status
print(json.dumps(out))
"""


def _python_for_nobody() -> str:
    """An interpreter ``nobody`` can run whose version matches this one (the packages on the path
    are this interpreter's)."""
    mine = os.path.realpath(sys.executable)
    if _world_traversable(mine):
        return mine
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(cand) and _world_traversable(os.path.realpath(cand)):
            ver = subprocess.run(
                [cand, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True, timeout=30
            ).stdout.strip()
            if ver == str(tuple(sys.version_info[:2])):
                return cand
    pytest.skip(f"no Python {sys.version_info[0]}.{sys.version_info[1]} that nobody can run")


@pytest.fixture
def home():
    """A directory nobody can use (pytest's own tmp_path lies under a root-only directory)."""
    d = Path(tempfile.mkdtemp(prefix="rollwise-nobody-"))
    os.chmod(d, 0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _as_nobody(tmp_path, code: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    paths = [str(Path(rollwise.__file__).parent.parent), str(Path(pydantic.__file__).parent.parent)]
    for p in paths:
        if not _world_traversable(p):
            pytest.skip(f"{p} is not readable by nobody")
    script = tmp_path / "trainer.py"
    script.write_text(code)
    os.chmod(script, 0o644)
    return subprocess.run(
        [_python_for_nobody(), "-s", str(script), *args],
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "TMPDIR": str(tmp_path),  # its temporary directories inside the one this test removes
            "PYTHONPATH": os.pathsep.join(paths),
            "LANG": "C.UTF-8",
        },
        cwd=tmp_path,
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_hostile_corpus_is_contained_with_an_unprivileged_trainer(home):
    out_file = home / "corpus.json"
    proc = _as_nobody(home, CORPUS, str(out_file), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(out_file.read_text())
    ran = 0
    for iso in ("bwrap", "rlimit"):
        got = out[iso]
        if "refused" in got:  # only where neither namespaces nor the kernel's confinement work
            assert iso == "bwrap" or "unsafe" in got["refused"], got
            continue
        ran += 1
        bad = [(r["name"], r["reason"], r["problems"]) for r in got["results"] if not r["contained"]]
        assert not bad, (iso, got["why"], bad)
        assert all(r["score"] == 0.0 for r in got["results"])
        names = {r["name"] for r in got["results"]}
        assert {"guard_off_forge_report_via_trainer_fd", "guard_off_escape"} <= names
        if iso == "rlimit":  # started as an ordinary user: only because the kernel confines it
            assert got["confined"], got["why"]
    assert ran >= 1


def test_without_confinement_an_unprivileged_trainer_refuses_unless_asked_for_unsafe(home):
    proc = _as_nobody(home, NO_LANDLOCK, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["default"].startswith("refused: "), out
    for need in ("apt-get install bubblewrap", "Landlock", "task.options.sandbox.unsafe"):
        assert need in out["default"]
    assert out["unsafe"]["describe"].startswith("WARNING: UNSAFE CODE EXECUTION")
    assert out["unsafe"]["facts"] == {"sandbox/isolation": "rlimit", "sandbox/confined": False, "sandbox/unsafe": True}
    assert out["unsafe_run"] == "correct"
