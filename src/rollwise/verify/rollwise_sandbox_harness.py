"""The trusted half of a sandboxed code check; runs *inside* the sandbox (``rollwise.verify.sandbox``).

Standard library only, Python 3.8+, started as ``python -I -S -B rollwise_sandbox_harness.py``.
The threat model is in ``rollwise.verify.sandbox``'s docstring; this is how the harness keeps it.

Order of events (the point is that the completion's process never holds the test):

1. fork the child, first of all, before this process has read anything: it keeps only its three
   pipes (requests, replies, output; the harness's stdin, which carries the job, is closed in
   it unread) and runs the child program ``rollwise_sandbox_child.py``, whose code the harness
   loaded beforehand (its ``.pyc`` when the caller compiled one);
2. make this process non-dumpable (``prctl``; without it the harness refuses to run: could not
   verify), so the child cannot read ``/proc/<harness>/{mem,environ,fd}`` or ptrace it;
3. read the job from stdin to its end, ``{"limits", "source", "entry_point", "prelude", "test",
   "confine", "guard", "workdir", "max_files", "nonce"}`` (the pipe is empty before any untrusted code runs),
   and lower this process's resource limits (CPU seconds, address space, processes, file size,
   open files, no core dumps);
4. send the child only what it needs: the source, the entry point, its limits, confinement and
   guard settings (it lowers its own limits and confines itself before compiling the source; when
   confinement was asked for and the child cannot confirm it, the harness reports
   ``harness_error``: could not verify, and the source never runs);
5. run the trusted prelude and test here; ``check(candidate)`` calls a proxy that sends each
   call's arguments to the child (``marshal``: trusted plain data) and receives its reply (one
   JSON line, untrusted, checked here), numbered; the verdict is decided here. A test may leave
   a str in its global ``REPORT``, which the report carries back when the check passed (capped at
   ``output_bytes``; ``Sandbox.call`` uses it for a tool's output; the code verifier's tests never set it).

What crosses from the child is refused unless it is the reply to the call just made, of a known
kind, plain data within the reply cap (``output_bytes`` + 4 KiB a line) and 100 levels of nesting,
ints in hex (linear to parse). A refused reply, a return value that is not plain data, and an
exception that ``except Exception`` would not catch (``KeyboardInterrupt``, ``SystemExit``,
``GeneratorExit``) raise :class:`Refused`, a ``BaseException`` the test cannot swallow, and are
recorded, so the verdict is a failure even if the test catches everything. No code of the
completion runs in this process: the tests compare decoded built-ins only.

Report: one JSON line on stdout, ``{"status", "detail", "output_bytes", "calls", "nonce"}``, the
nonce being the one the job brought (the caller drops a line without it). Statuses: ``correct``;
failures ``wrong_answer``, ``exception``, ``syntax_error``, ``no_function``, ``timeout`` (CPU
limit), ``memory``, ``output_limit``, ``killed`` (a signal), ``exited`` (the child ended without
answering); ``harness_error`` (the check itself could not run: could not verify).
"""

import os
import sys

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rollwise_sandbox_child.py")


def child_code():
    """The child program's code object: its ``.pyc`` beside it when the caller wrote one for this
    interpreter (trusted: the sandbox can read that directory, not write it), else its source."""
    import marshal

    try:
        with open(CHILD + "c", "rb") as f:
            data = f.read()
        import _frozen_importlib_external

        if data[:4] == _frozen_importlib_external.MAGIC_NUMBER:
            return marshal.loads(data[16:])
    except (OSError, ImportError, ValueError, EOFError, TypeError):
        pass
    with open(CHILD) as f:
        return compile(f.read(), CHILD, "exec")


def spawn_child():
    """The child, started before this process has read anything: a fork of the harness as it is
    now (the interpreter, ``os`` and ``sys``; no job, no test) that drops every descriptor but its
    three pipes and runs the child program. Returns (pid, request writer, reply reader, output
    reader)."""
    code = child_code()
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(req_r, 0)  # the harness's stdin (the job's pipe) is closed here, unread
            os.dup2(resp_w, 1)
            os.dup2(out_w, 2)
            os.closerange(3, 1 << 16)
            ns = {"__name__": "__rollwise_child__", "__builtins__": __builtins__}
            exec(code, ns)
            ns["run"]()
        finally:
            os._exit(3)
    for fd in (req_r, resp_w, out_w):
        os.close(fd)
    return pid, req_w, resp_r, out_r


if __name__ == "__main__":
    try:
        SPAWNED = spawn_child()  # first of all: it boots while this process imports and reads the job
    except Exception as e:
        SPAWNED = e

import _thread  # noqa: E402
import json  # noqa: E402
import marshal  # noqa: E402
import signal  # noqa: E402

CHUNK = 65536


# ---------------------------------------------------------------- plain-data codec

MAX_DEPTH = 100
LISTS = {"l": list, "t": tuple, "S": set, "F": frozenset}


class BadValue(Exception):
    pass


def plain(x, depth=0):
    """Raise BadValue unless ``x`` (a test's argument) is plain data of exact built-in types."""
    if depth > MAX_DEPTH:
        raise BadValue("nested too deep")
    t = type(x)
    if x is None or t in (bool, int, float, str, bytes):
        return
    if t in (list, tuple, set, frozenset):
        for v in x:
            plain(v, depth + 1)
        return
    if t is dict:
        for k, v in x.items():
            plain(k, depth + 1)
            plain(v, depth + 1)
        return
    raise BadValue("value of type %s is not plain data" % t.__name__)


def dec(e, depth=0):
    """A value in a reply (untrusted) -> plain built-ins, or BadValue. Checks every type and the
    depth; the size is already bounded by the reply line's cap, and ints travel in hex (linear to
    parse, no digit limit), so decoding costs at most linear time in the line."""
    if depth > MAX_DEPTH:
        raise BadValue("nested deeper than %d" % MAX_DEPTH)
    if type(e) is not list or not e or type(e[0]) is not str:
        raise BadValue("malformed value")
    tag = e[0]
    if tag == "0" and len(e) == 1:
        return None
    if len(e) != 2:
        raise BadValue("malformed value")
    v = e[1]
    try:
        if tag == "b" and type(v) is bool:
            return v
        if tag == "i" and type(v) is str:
            return int(v, 16)
        if tag == "f" and type(v) is str and len(v) <= 64:
            return float(v)
        if tag == "s" and type(v) is str:
            return v
        if tag == "z" and type(v) is str:  # a str with lone surrogates, as UTF-8 with surrogatepass
            return bytes.fromhex(v).decode("utf-8", "surrogatepass")
        if tag == "y" and type(v) is str:
            return bytes.fromhex(v)
        if tag in LISTS and type(v) is list:
            return LISTS[tag]([dec(x, depth + 1) for x in v])
        if tag == "d" and type(v) is list:
            out = {}
            for kv in v:
                if type(kv) is not list or len(kv) != 2:
                    raise BadValue("malformed dict item")
                out[dec(kv[0], depth + 1)] = dec(kv[1], depth + 1)
            return out
    except (ValueError, TypeError) as err:  # bad hex or float text, an unhashable key or set member
        raise BadValue("malformed value (%s)" % type(err).__name__)
    raise BadValue("malformed value (tag %r)" % (tag[:10],))


# ---------------------------------------------------------------- limits


def apply_limits(lim):
    import resource

    def setl(which, soft, hard=None):
        if soft is None:
            return
        hard = int(soft) if hard is None else int(hard)
        cur = resource.getrlimit(which)[1]
        if cur != resource.RLIM_INFINITY:
            soft, hard = min(int(soft), cur), min(hard, cur)
        resource.setrlimit(which, (int(soft), hard))

    if lim.get("cpu_s"):
        setl(resource.RLIMIT_CPU, lim["cpu_s"], lim["cpu_s"] + 1)  # SIGXCPU at the soft limit
    if lim.get("memory_mb"):
        setl(resource.RLIMIT_AS, lim["memory_mb"] * 1024 * 1024)
    setl(resource.RLIMIT_NPROC, lim.get("nproc"))
    if lim.get("file_mb"):
        setl(resource.RLIMIT_FSIZE, lim["file_mb"] * 1024 * 1024)
    setl(resource.RLIMIT_NOFILE, 64)
    setl(resource.RLIMIT_CORE, 0)


def not_dumpable():
    """PR_SET_DUMPABLE 0: processes of the same user (the child) cannot open /proc/<pid>/{mem,
    environ,fd} of this process or ptrace it. True when it took effect; the harness refuses to run
    without it (could not verify), since this process holds the test."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
        return libc.prctl(3, 0, 0, 0, 0) == 0  # PR_GET_DUMPABLE = 3
    except Exception:
        return False


# ---------------------------------------------------------------- the trusted side


class ChildGone(BaseException):
    """The child ended (or was killed) without answering; tests cannot catch it."""


class CandidateError(Exception):
    def __init__(self, name, msg):
        Exception.__init__(self, "%s: %s" % (name, msg))
        self.name = name


class Drain:
    """Reads the child's stdout/stderr in a thread; kills the child once it passes the output limit."""

    def __init__(self, fd, cap, pid):
        self.fd, self.cap, self.pid = fd, cap, pid
        self.total, self.head, self.over = 0, b"", False
        self.done = _thread.allocate_lock()
        self.done.acquire()
        _thread.start_new_thread(self.run, ())

    def run(self):
        try:
            while True:
                try:
                    data = os.read(self.fd, CHUNK)
                except OSError:
                    return
                if not data:
                    return
                self.total += len(data)
                if len(self.head) < 400:
                    self.head += data[: 400 - len(self.head)]
                if self.total > self.cap and not self.over:
                    self.over = True
                    try:
                        os.kill(self.pid, signal.SIGKILL)
                    except OSError:
                        pass
        finally:
            self.done.release()

    def join(self, timeout):
        if self.done.acquire(timeout=timeout):
            self.done.release()


LOAD_STATUSES = ("syntax_error", "no_function", "exception", "memory")


class Refused(BaseException):
    """A reply the trusted side will not accept (forged, out of order, malformed, too deep, not
    plain data) or an exception that ``except Exception`` would not catch. A BaseException, so a
    test's ``except Exception`` cannot swallow it; it is also recorded, so even a bare ``except``
    cannot turn it into a pass."""

    def __init__(self, status, detail):
        BaseException.__init__(self, detail)
        self.status, self.detail = status, detail


def frame(obj):
    """A message to the child: 4-byte length + marshal (version 4, readable by any Python 3.4+)."""
    data = marshal.dumps(obj, 4)
    return len(data).to_bytes(4, "big") + data


def main(spawned):
    out = {"status": "harness_error", "detail": "", "output_bytes": 0, "calls": 0, "nonce": ""}
    if isinstance(spawned, Exception):
        out["nonce"] = json.loads(sys.stdin.buffer.read()).get("nonce", "")
        out["detail"] = "could not start the child: %s: %s" % (type(spawned).__name__, spawned)
        return emit(out)
    pid, req_w, resp_r, out_r = spawned
    req = os.fdopen(req_w, "wb", buffering=0)
    resp = os.fdopen(resp_r, "rb")
    dumpable_off = not_dumpable()  # before the job is read: /proc/<harness>/{mem,environ,fd} closed to the child
    job = json.loads(sys.stdin.buffer.read())  # to its end: the pipe is empty before any untrusted code runs
    out["nonce"] = job.get("nonce", "")
    if not dumpable_off:  # the child has run nothing untrusted yet (it waits for its source), and never will
        out["detail"] = "could not make the harness non-dumpable (prctl)"
        return emit(out)
    lim = job.get("limits", {})
    apply_limits(lim)
    reply_bytes = int(lim.get("output_bytes") or 1 << 20)
    reply_cap = reply_bytes + 4096
    drain = Drain(out_r, reply_bytes, pid)
    init = {
        "source": job["source"],
        "entry_point": job["entry_point"],
        "confine": bool(job.get("confine")),
        "guard": bool(job.get("guard")),
        "workdir": job.get("workdir") or ".",
        "max_files": job.get("max_files") or 4,
        "reply_bytes": reply_bytes,
        "limits": {k: lim.get(k) for k in ("cpu_s", "memory_mb", "nproc", "file_mb")},
    }
    try:
        req.write(frame(init))
    except OSError:
        pass  # the child is gone: its status says why
    del init
    state = {"seq": 0, "refused": None}

    def refuse(status, detail):
        if state["refused"] is None:
            state["refused"] = (status, detail[:500])
        raise Refused(*state["refused"])

    def recv():
        line = resp.readline(reply_cap)
        if not line:
            raise ChildGone()
        if not line.endswith(b"\n"):
            drain.over = True
            os.kill(pid, signal.SIGKILL)
            raise ChildGone()
        try:
            return json.loads(line)
        except (ValueError, RecursionError, MemoryError):
            refuse("wrong_answer", "refused a reply that is not a JSON line")

    def candidate(*args, **kwargs):
        if state["refused"] is not None:
            raise Refused(*state["refused"])
        try:
            plain(args), plain(kwargs)
        except BadValue as e:
            raise HarnessError("the test passes an argument that is not plain data: %s" % e)
        state["seq"] += 1
        n = state["seq"]
        try:
            req.write(frame((n, args, kwargs)))
        except OSError:
            raise ChildGone()
        msg = recv()
        if type(msg) is not list or len(msg) < 3 or type(msg[0]) is not int or msg[0] != n:
            refuse("wrong_answer", "refused a reply out of order or malformed (call %d)" % n)
        kind = msg[1]
        if kind == "ok" and len(msg) == 3:
            try:
                return dec(msg[2])
            except BadValue as e:
                refuse("wrong_answer", "refused the return value of call %d: %s" % (n, e))
        if kind == "bad" and len(msg) == 3 and type(msg[2]) is str:
            refuse("wrong_answer", "returned %s" % msg[2][:200])
        if kind == "exc" and len(msg) == 5 and type(msg[2]) is str and type(msg[3]) is str and type(msg[4]) is bool:
            name, text = msg[2][:100], msg[3][:200]
            if not msg[4]:
                refuse("exception", "%s raised by the call (not an Exception, so the test may not see it)" % name)
            raise CandidateError(name, text)
        refuse("wrong_answer", "refused a reply of unknown form (call %d)" % n)

    status, detail = None, ""
    try:
        trusted = {"__name__": "__rollwise_check__"}
        try:
            exec(compile(job.get("prelude") or "", "<prelude>", "exec"), trusted)
            exec(compile(job["test"], "<test>", "exec"), trusted)
            check = trusted["check"]
        except BaseException as e:
            raise HarnessError("test code failed to load: %s: %s" % (type(e).__name__, e))
        trusted[job["entry_point"]] = candidate  # tests may call the function by its name (HumanEval/33)
        try:
            started = recv()
        except ChildGone:
            raise HarnessError("the child interpreter did not start: %s" % (child_status(pid, drain)[1],))
        if started != [0, "started"]:
            refuse("wrong_answer", "refused a first message that is not the child's start")
        first = recv()
        if job.get("confine"):  # sent before any untrusted code ran: the completion cannot forge it
            if type(first) is list and len(first) == 3 and first[:2] == [0, "confine_error"]:
                raise HarnessError("could not confine the completion: %s" % (first[2],))
            if not (type(first) is list and len(first) == 3 and first[:2] == [0, "confined"]):
                raise HarnessError("the child did not confirm its confinement")
            out["confinement"] = str(first[2])[:200]
            first = recv()
        if first == [0, "ready"]:
            check(candidate)
            status = "correct"
        elif (
            type(first) is list
            and len(first) == 4
            and first[:2] == [0, "load_error"]
            and first[2] in LOAD_STATUSES
            and type(first[3]) is str
        ):
            status, detail = first[2], first[3]
        else:
            refuse("wrong_answer", "refused a load message of unknown form")
    except Refused:
        pass  # recorded in state["refused"]
    except ChildGone:
        status, detail = child_status(pid, drain)
    except HarnessError as e:
        status, detail = "harness_error", str(e)
    except CandidateError as e:
        status = "memory" if e.name == "MemoryError" else "exception"
        detail = str(e)
    except AssertionError as e:
        status, detail = "wrong_answer", "assertion failed" + (": %s" % e if str(e) else "")
    except Exception as e:  # the test failed on the candidate's value (e.g. None - 1)
        status, detail = "wrong_answer", "%s: %s" % (type(e).__name__, str(e)[:200])
    if state["refused"] is not None and status != "harness_error":  # even if the test caught it
        status, detail = state["refused"]
    if status is None:
        status, detail = "harness_error", "no verdict"
    if status not in ("killed", "timeout", "exited", "output_limit"):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            os.waitpid(pid, 0)
        except OSError:
            pass
    drain.join(0.5)
    if drain.over:
        status, detail = "output_limit", "output passed %d bytes" % drain.cap
    out.update(status=status, detail=detail[:500], output_bytes=drain.total, calls=state["seq"])
    value = trusted.get("REPORT") if status == "correct" else None
    if type(value) is str:  # a str the trusted test chose to report (``Sandbox.call``), capped like a reply
        out["value"] = value[:reply_bytes]
    return emit(out)


class HarnessError(Exception):
    pass


def child_status(pid, drain):
    try:
        _, st = os.waitpid(pid, 0)
    except OSError:
        return "killed", "child vanished"
    if os.WIFSIGNALED(st):
        sig = os.WTERMSIG(st)
        if drain.over:
            return "output_limit", "output passed %d bytes" % drain.cap
        if sig == signal.SIGXCPU:
            return "timeout", "CPU time limit"
        if sig == signal.SIGXFSZ:
            return "output_limit", "file size limit"
        return "killed", "signal %d (%s)" % (sig, signal.Signals(sig).name)
    return "exited", "exited with code %d without answering" % os.WEXITSTATUS(st)


def emit(out):
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(SPAWNED))
    except SystemExit:
        raise
    except BaseException as e:
        emit(
            {
                "status": "harness_error",
                "detail": "%s: %s" % (type(e).__name__, str(e)[:300]),
                "output_bytes": 0,
                "calls": 0,
            }
        )
