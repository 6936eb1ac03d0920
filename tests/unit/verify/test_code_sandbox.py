"""The code sandbox: outcomes, limits, isolation choice, and the hostile corpus contained in
both isolation modes (bubblewrap where it works here, and the rlimit fallback always)."""

import os
import threading

import pytest

from rollwise.registry import UserError
from rollwise.types import Prompt, Verdict
from rollwise.verify import code
from rollwise.verify.hostile import CASES, run_corpus
from rollwise.verify.sandbox import Limits, Sandbox

CHECK = "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(-3) == -6\n"


def _sandbox(isolation, **kw):
    try:
        return Sandbox(Limits(isolation=isolation, **kw))
    except UserError as e:  # bwrap asked for but cannot run on this machine
        pytest.skip(str(e))


@pytest.fixture(scope="module", params=["bwrap", "rlimit"])
def sandbox(request):
    return _sandbox(request.param, wall_s=4.0, cpu_s=1)


def _prompt(test=CHECK, **meta):
    return Prompt(id="t/double", task="t", text="", answer=None, metadata={"entry_point": "f", "test": test, "stop": (), **meta})


@pytest.mark.parametrize("source, reason", [
    ("def f(x):\n    return 2 * x\n", "correct"),
    ("def f(x):\n    return x + 2\n", "wrong_answer"),  # f(2) == 4 holds, f(-3) == -1 does not
    ("def f(x)\n    return 2 * x\n", "syntax_error"),
    ("def g(x):\n    return 2 * x\n", "no_function"),
    ("def f(x):\n    raise ValueError('no')\n", "exception"),
    ("def f(x):\n    return None\n", "wrong_answer"),
    ("def f(x):\n    return [1] * 10 ** 9\n", "memory"),  # 8 GB of pointers > 512 MiB address space
    ("def f(x):\n    while True:\n        pass\n", "timeout"),
])
def test_outcomes(sandbox, source, reason):
    v = code.verify(_prompt(), source, sandbox)
    assert v.reason == reason, v.details
    assert v.score == (1.0 if reason == "correct" else 0.0)
    assert v.details["isolation"] == sandbox.isolation


def test_could_not_verify_is_none_never_zero(sandbox):
    v = code.verify(_prompt(test="def check(candidate:\n"), "def f(x):\n    return 2 * x\n", sandbox)
    assert v.score is None and v.reason == "sandbox_error"
    assert "test code failed to load" in v.details["detail"]
    with pytest.raises(UserError, match="sandbox.python"):  # bad input fails before any call
        Sandbox(Limits(isolation=sandbox.isolation, python="/nonexistent/python3"))


def test_environment_is_clean_and_workdir_empty(sandbox, monkeypatch):
    monkeypatch.setenv("ROLLWISE_TEST_SECRET", "hunter2")
    test = ("def check(candidate):\n    names, files, wrote = candidate()\n"
            "    assert set(names) <= {'PATH', 'HOME', 'TMPDIR', 'LANG', 'ROLLWISE_SANDBOX_ID', 'PWD', 'LC_CTYPE'}, names\n"
            "    assert files == [], files\n    assert wrote == 'ok'\n")
    src = ("import os\ndef f():\n    files = sorted(os.listdir('.'))\n    open('scratch.txt', 'w').write('ok')\n"
           "    return sorted(os.environ), files, open('scratch.txt').read()\n")
    v = code.verify(_prompt(test=test), src, sandbox)
    assert v.reason == "correct", v.details


def test_tests_see_only_plain_values(sandbox):
    # an always-equal object would pass `==` in a shared-process harness; here it is refused
    src = "class E:\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return E()\n"
    v = code.verify(_prompt(), src, sandbox)
    assert v.reason == "wrong_answer" and "not plain data" in v.details["detail"]


def test_hung_completion_is_killed_at_the_wall_clock_limit():
    sb = _sandbox("auto", wall_s=1.0, cpu_s=30)
    v = code.verify(_prompt(), "import time\ndef f(x):\n    time.sleep(100)\n", sb)
    assert v.reason == "timeout" and "wall-clock" in v.details["detail"]
    assert v.details["seconds"] < 1.0 + 3.0  # killed at the limit (plus start-up and clean-up), not after 100 s


def test_isolation_choice_is_reported():
    sb = Sandbox(Limits(isolation="rlimit"))
    assert sb.isolation == "rlimit" and "rlimit" in sb.describe()
    auto = Sandbox(Limits())
    assert auto.isolation in ("bwrap", "rlimit") and auto.why


def test_concurrent_calls_do_not_interfere(sandbox):
    srcs = ["def f(x):\n    return 2 * x\n", "def f(x):\n    return x\n"] * 3
    out = [None] * len(srcs)

    def work(i):
        out[i] = code.verify(_prompt(), srcs[i], sandbox).reason

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(srcs))]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert out == ["correct", "wrong_answer"] * 3


def test_corpus_is_large_enough():
    assert len(CASES) >= 30 and len({c.name for c in CASES}) == len(CASES)


def test_hostile_corpus_is_contained(sandbox, tmp_path):
    results = run_corpus(sandbox, tmp_path / "outside")
    bad = [(r.name, r.reason, r.problems) for r in results if not r.contained]
    assert not bad
    assert all(r.score == 0.0 for r in results)  # every case failed, none "could not verify"
    assert os.getpid() > 0  # and we are still here


def test_verdict_cache_keeps_only_deterministic_outcomes(sandbox):
    cache = code.VerdictCache()
    p = _prompt()
    first = code.verify(p, "def f(x):\n    return 2 * x\n", sandbox, cache)
    again = code.verify(p, "def f(x):\n    return 2 * x\n", sandbox, cache)
    assert (first.details["cached"], again.details["cached"]) == (False, True) and again.reason == "correct"
    hung = "def f(x):\n    while True:\n        pass\n"
    assert code.verify(p, hung, sandbox, cache).reason == "timeout"
    assert (p.id, code.program(p, hung)) not in cache.data  # a timeout may be load, not the program
    assert isinstance(first, Verdict)
