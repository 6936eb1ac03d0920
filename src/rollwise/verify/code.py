"""Code verifier: runs a completion against hidden test cases in a sandbox (``rollwise.verify.sandbox``).

``verify(prompt, completion, sandbox=None, cache=None) -> Verdict``

The prompt's metadata says what to run:

- ``entry_point``: the function the tests call;
- ``test``: trusted Python defining ``check(candidate)`` (HumanEval's form); it runs outside the
  completion's process and sees only plain-data return values;
- ``prelude`` (optional): trusted code run before the test in the checking process (HumanEval's
  prompt: its helpers, e.g. ``poly`` or ``encode_cyclic``, are called by some tests);
- ``stop`` (optional): continuation stop sequences (default :data:`STOP`).

The program that runs is built by :func:`program`: a fenced code block (````python ... ````) in
the completion is taken as the answer, appended after ``prompt.text`` (a block that redefines
the entry point replaces the prompt's stub; imports and helpers of the prompt stay); without a
fence the completion is a continuation of ``prompt.text``, cut at the first stop sequence
(the Codex paper's rule, Chen et al. 2021, arXiv 2107.03374).

Outcomes (three, as for every verifier):

- pass: ``Verdict(1.0, "correct")``;
- fail: ``Verdict(0.0, reason)`` with reason ``wrong_answer``, ``exception``, ``syntax_error``,
  ``no_function``, ``timeout``, ``memory``, ``output_limit``, ``killed`` or ``exited``;
- could not verify: ``Verdict(None, "sandbox_error")`` (the sandbox failed or the test itself
  could not run); ``Verdict(None, "bad_reference")`` when the metadata lacks the test.

``details``: ``detail`` (the sandbox's explanation), ``seconds``, ``isolation`` (``bwrap`` /
``rlimit``), ``cached``, ``sandbox_id`` (the call's marker, see ``rollwise.verify.sandbox``), and ``answer`` (the
program, whitespace-normalised, so maj@k votes over identical programs).

``cache`` (a :class:`VerdictCache`) remembers deterministic outcomes by (prompt id, program):
identical completions of one prompt are common in a group, and a tiny model repeats itself.
Timeouts, kills and sandbox errors are never cached.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict

from rollwise.types import Prompt, Verdict
from rollwise.verify.sandbox import Sandbox

STOP = ("\nclass ", "\ndef ", "\n#", "\nif ", "\nprint(")
_FENCE = re.compile(r"```[ \t]*(?:python|py|Python)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
DETERMINISTIC = frozenset({"correct", "wrong_answer", "exception", "syntax_error", "no_function"})

_default: Sandbox | None = None
_default_lock = threading.Lock()


def default_sandbox() -> Sandbox:
    """A process-wide sandbox with default limits (for the registry entry ``code``)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Sandbox()
        return _default


class VerdictCache:
    """Thread-safe LRU of deterministic verdicts keyed by (prompt id, program)."""

    def __init__(self, size: int = 65536):
        self.size, self.lock, self.data = size, threading.Lock(), OrderedDict()
        self.hits = 0

    def get(self, key) -> Verdict | None:
        with self.lock:
            v = self.data.get(key)
            if v is not None:
                self.data.move_to_end(key)
                self.hits += 1
            return v

    def put(self, key, v: Verdict) -> None:
        with self.lock:
            self.data[key] = v
            if len(self.data) > self.size:
                self.data.popitem(last=False)


def program(prompt: Prompt, completion: str) -> str:
    """The Python source that defines the entry point (see the module docstring)."""
    head = prompt.metadata.get("code_prefix", prompt.text)
    block = _FENCE.search(completion)
    if block:
        return head.rstrip("\n") + "\n\n" + block.group(1)
    body = completion
    for stop in prompt.metadata.get("stop", STOP):
        cut = body.find(stop)
        if cut >= 0:
            body = body[:cut]
    return head + body


def verify(
    prompt: Prompt, completion: str, sandbox: Sandbox | None = None, cache: VerdictCache | None = None
) -> Verdict:
    meta = prompt.metadata
    if not meta.get("test") or not meta.get("entry_point"):
        return Verdict(None, "bad_reference", {"error": "prompt.metadata needs 'test' and 'entry_point'"})
    src = program(prompt, completion)
    key = (prompt.id, src)
    if cache is not None:
        hit = cache.get(key)
        if hit is not None:
            return Verdict(hit.score, hit.reason, {**hit.details, "cached": True, "seconds": 0.0})
    sb = sandbox or default_sandbox()
    res = sb.run(src, meta["test"], meta["entry_point"], meta.get("prelude", ""))
    details = {
        "detail": res.detail,
        "seconds": round(res.seconds, 4),
        "isolation": res.isolation,
        "cached": False,
        "answer": " ".join(src.split()),
        "sandbox_id": res.extra.get("sandbox_id"),
    }
    if res.status == "correct":
        v = Verdict(1.0, "correct", details)
    elif res.status == "sandbox_error":
        v = Verdict(None, "sandbox_error", details)
    else:
        v = Verdict(0.0, res.status, details)
    if cache is not None and res.status in DETERMINISTIC:
        cache.put(key, v)
    return v
