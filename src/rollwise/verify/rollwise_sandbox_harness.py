"""The trusted half of a sandboxed code check; runs *inside* the sandbox (``rollwise.verify.sandbox``).

Standard library only, Python 3.8+, started as ``python -I -S -B rollwise_sandbox_harness.py``
with a JSON job on stdin:

    {"prelude": str,        trusted code run in the harness before the test (e.g. HumanEval's
                            prompt, whose helpers the tests call)
     "test": str,           trusted test code defining ``check(candidate)``
     "source": str,         untrusted code (prompt + completion) that must define ``entry_point``
     "entry_point": str,
     "limits": {"cpu_s", "memory_mb", "nproc", "file_mb", "output_bytes"},
     "guard": bool,         install the in-process audit-hook guard in the untrusted child
     "workdir": str}

and one JSON line on stdout: ``{"status", "detail", "output_bytes", "calls"}``.

Separation: the untrusted source never runs in this process. The harness forks a child that
executes it and then answers calls ``candidate(*args)`` over a pipe, with arguments and return
values encoded as plain data (int, float, str, bool, None, bytes, list, tuple, set, dict). The
tests run here and see only decoded plain values, so a completion cannot monkeypatch the tests,
return an always-equal object, print a fake "passed" line (its stdout is a pipe this process
drains and caps) or reach this process's stdout (the harness is made non-dumpable, so
``/proc/<pid>/fd`` of the harness is closed to the child).

Statuses: ``correct``; failures ``wrong_answer``, ``exception``, ``syntax_error``, ``no_function``,
``timeout`` (CPU limit), ``memory``, ``output_limit``, ``killed`` (a signal), ``exited`` (the
child ended without answering); ``harness_error`` (the check itself could not run: could not verify).
"""

import json
import os
import signal
import sys
import threading

CHUNK = 65536


# ---------------------------------------------------------------- plain-data codec


class BadValue(Exception):
    pass


def enc(x, depth=0):
    if depth > 100:
        raise BadValue("nested too deep")
    t = type(x)
    if x is None:
        return ["0"]
    if t is bool:
        return ["b", x]
    if t is int:
        return ["i", str(x)]
    if t is float:
        return ["f", repr(x)]
    if t is str:
        return ["s", x]
    if t is bytes:
        return ["y", x.hex()]
    if t in (list, tuple, set, frozenset):
        tag = {list: "l", tuple: "t", set: "S", frozenset: "F"}[t]
        return [tag, [enc(v, depth + 1) for v in x]]
    if t is dict:
        return ["d", [[enc(k, depth + 1), enc(v, depth + 1)] for k, v in x.items()]]
    raise BadValue("value of type %s is not plain data" % t.__name__)


def dec(e):
    tag = e[0]
    if tag == "0":
        return None
    if tag == "b":
        return bool(e[1])
    if tag == "i":
        return int(e[1])
    if tag == "f":
        return float(e[1])
    if tag == "s":
        return str(e[1])
    if tag == "y":
        return bytes.fromhex(e[1])
    if tag in ("l", "t", "S", "F"):
        items = [dec(v) for v in e[1]]
        return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
    if tag == "d":
        return {dec(k): dec(v) for k, v in e[1]}
    raise BadValue("unknown tag %r" % (tag,))


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
    """PR_SET_DUMPABLE 0: other processes of the same user cannot open /proc/<pid>/fd or ptrace us."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except Exception:
        pass


# ---------------------------------------------------------------- guard (fallback isolation)


def install_guard(workdir, max_files):
    """Audit hook for the rlimit fallback: writes only under ``workdir`` and to at most
    ``max_files`` distinct files (with RLIMIT_FSIZE this bounds the disk a call can fill); reads
    only there and in the standard library; no sockets, subprocesses, fork, exec, ctypes or
    signals to other processes. A defence in depth, not a security boundary on its own (the OS
    limits still apply)."""
    import sysconfig

    work = os.path.realpath(workdir)
    roots = {work, "/dev/null", "/dev/urandom", "/dev/zero"}
    for key in ("stdlib", "platstdlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            roots.add(os.path.realpath(p))
    roots = tuple(roots)
    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    blocked = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
               "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.call_function", "pty.spawn", "os.setuid",
               "os.putenv", "os.unsetenv", "sys.addaudithook", "sys.settrace", "sys.setprofile", "os.chroot")
    path_events = ("os.mkdir", "os.rename", "os.remove", "os.rmdir", "os.symlink", "os.link", "os.chmod", "os.chown",
                   "os.truncate", "os.utime", "os.mkfifo", "os.mknod", "shutil.rmtree", "shutil.move", "shutil.copyfile",
                   "os.chdir")
    me = os.getpid()
    written = set()

    def inside(path, where):
        try:
            p = os.path.realpath(os.fsdecode(path))
        except Exception:
            return False
        return any(p == r or p.startswith(r.rstrip("/") + "/") for r in where)

    def hook(event, args):
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            if isinstance(path, int):
                return
            write = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (isinstance(flags, int) and flags & writing)
            if not inside(path, (work,) if write else roots):
                raise PermissionError("sandbox guard: %s %r is outside the sandbox" % ("write" if write else "read", path))
            if write and not inside(path, ("/dev/null",)):
                written.add(os.path.realpath(os.fsdecode(path)))
                if len(written) > max_files:
                    raise PermissionError("sandbox guard: more than %d files written" % max_files)
        elif event.startswith("socket.") or event.startswith(blocked):
            raise PermissionError("sandbox guard: %s is not allowed" % event)
        elif event in ("os.kill", "os.killpg"):
            if args and args[0] not in (0, me):
                raise PermissionError("sandbox guard: signals to other processes are not allowed")
        elif event in path_events:
            for a in args:
                if isinstance(a, (str, bytes, os.PathLike)) and not inside(a, (work,)):
                    raise PermissionError("sandbox guard: %s on %r is outside the sandbox" % (event, a))

    sys.addaudithook(hook)


# ---------------------------------------------------------------- the untrusted child


def child_main(job, req_r, resp_w, out_w):
    os.dup2(out_w, 1)
    os.dup2(out_w, 2)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    keep = {0, 1, 2, req_r, resp_w}
    for fd in range(3, 256):
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = sys.stdout
    req = os.fdopen(req_r, "rb")
    resp = os.fdopen(resp_w, "wb", buffering=0)
    write = resp.write  # bound before untrusted code runs

    def send(msg):
        write((json.dumps(msg) + "\n").encode())

    if job.get("guard"):
        install_guard(job["workdir"], int(job.get("max_files") or 4))
    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        code = compile(job["source"], "<completion>", "exec")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
        send(["load_error", "syntax_error", "%s: %s" % (type(e).__name__, e)])
        os._exit(0)
    try:
        exec(code, ns)
        fn = ns.get(job["entry_point"])
        if not callable(fn):
            send(["load_error", "no_function", "no function %r defined" % job["entry_point"]])
            os._exit(0)
        send(["ready"])
    except BaseException as e:
        send(["load_error", "memory" if isinstance(e, MemoryError) else "exception", "%s: %s" % (type(e).__name__, str(e)[:200])])
        os._exit(0)
    while True:
        line = req.readline()
        if not line:
            os._exit(0)
        try:
            msg = json.loads(line)
            args, kwargs = dec(msg[0]), dec(msg[1])
        except Exception as e:
            send(["exc", "HarnessError", str(e)[:200]])
            continue
        try:
            result = fn(*args, **kwargs)
        except BaseException as e:
            try:
                send(["exc", type(e).__name__, str(e)[:200]])
            except BaseException:
                os._exit(3)
            continue
        try:
            reply = ["ok", enc(result)]
        except BadValue as e:
            reply = ["bad", str(e)]
        except BaseException as e:
            reply = ["exc", type(e).__name__, str(e)[:200]]
        send(reply)


# ---------------------------------------------------------------- the trusted parent


class ChildGone(BaseException):
    """The child ended (or was killed) without answering; tests cannot catch it."""


class CandidateError(Exception):
    def __init__(self, name, msg):
        Exception.__init__(self, "%s: %s" % (name, msg))
        self.name = name


class BadReturn(Exception):
    pass


class Drain(threading.Thread):
    """Reads the child's stdout/stderr; kills the child once it passes the output limit."""

    def __init__(self, fd, cap, pid):
        threading.Thread.__init__(self, daemon=True)
        self.fd, self.cap, self.pid = fd, cap, pid
        self.total, self.head, self.over = 0, b"", False

    def run(self):
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


def main():
    job = json.loads(sys.stdin.read())
    lim = job.get("limits", {})
    apply_limits(lim)
    not_dumpable()
    out = {"status": "harness_error", "detail": "", "output_bytes": 0, "calls": 0}
    trusted = {"__name__": "__rollwise_check__"}
    try:
        exec(compile(job.get("prelude") or "", "<prelude>", "exec"), trusted)
        exec(compile(job["test"], "<test>", "exec"), trusted)
        check = trusted["check"]
    except BaseException as e:
        out["detail"] = "test code failed to load: %s: %s" % (type(e).__name__, e)
        return emit(out)

    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    out_r, out_w = os.pipe()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        os.close(req_w), os.close(resp_r), os.close(out_r)
        try:
            child_main(job, req_r, resp_w, out_w)
        finally:
            os._exit(0)
    os.close(req_r), os.close(resp_w), os.close(out_w)
    drain = Drain(out_r, int(lim.get("output_bytes") or 1 << 20), pid)
    drain.start()
    req = os.fdopen(req_w, "wb", buffering=0)
    resp = os.fdopen(resp_r, "rb")
    reply_cap = int(lim.get("output_bytes") or 1 << 20) + 4096
    calls = [0]

    def recv():
        line = resp.readline(reply_cap)
        if not line:
            raise ChildGone()
        if not line.endswith(b"\n"):
            drain.over = True
            os.kill(pid, signal.SIGKILL)
            raise ChildGone()
        return json.loads(line)

    def candidate(*args, **kwargs):
        try:
            payload = json.dumps([enc(args), enc(kwargs)]) + "\n"
        except BadValue as e:
            raise HarnessError("the test passes an argument that is not plain data: %s" % e)
        calls[0] += 1
        try:
            req.write(payload.encode())
        except (BrokenPipeError, OSError):
            raise ChildGone()
        msg = recv()
        if msg[0] == "ok":
            return dec(msg[1])
        if msg[0] == "bad":
            raise BadReturn(msg[1])
        raise CandidateError(msg[1], msg[2])

    trusted[job["entry_point"]] = candidate  # tests may call the function by its name (HumanEval/33)
    status, detail = "harness_error", ""
    try:
        first = recv()
        if first[0] == "load_error":
            status, detail = first[1], first[2]
        else:
            check(candidate)
            status = "correct"
    except ChildGone:
        status, detail = child_status(pid, drain)
    except HarnessError as e:
        status, detail = "harness_error", str(e)
    except CandidateError as e:
        status = "memory" if e.name == "MemoryError" else "exception"
        detail = str(e)
    except BadReturn as e:
        status, detail = "wrong_answer", "returned %s" % e
    except AssertionError as e:
        status, detail = "wrong_answer", "assertion failed" + (": %s" % e if str(e) else "")
    except Exception as e:  # the test failed on the candidate's value (e.g. None - 1)
        status, detail = "wrong_answer", "%s: %s" % (type(e).__name__, str(e)[:200])
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
    out.update(status=status, detail=detail[:500], output_bytes=drain.total, calls=calls[0])
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
        sys.exit(main())
    except SystemExit:
        raise
    except BaseException as e:
        emit({"status": "harness_error", "detail": "%s: %s" % (type(e).__name__, str(e)[:300]), "output_bytes": 0, "calls": 0})
