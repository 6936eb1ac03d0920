"""The untrusted half of a sandboxed code check: the only process in which a completion runs.

Standard library only, Python 3.8+. The harness (``rollwise_sandbox_harness.py``) forks the
process that runs this program first of all, before it has read anything from its stdin: the
child's memory is the harness's as it was then (the interpreter, ``os``, ``sys``, ``marshal``, the
code of the two programs), so it never held the test, the expected values, the job or the
compiled ``check``. Whatever a completion finds in its frames, ``gc``, ``/proc/self/mem``, its
environment, argv or descriptors is its own source, its arguments and these two programs. (Run
as a script, ``python -I -S -B rollwise_sandbox_child.py`` with the same descriptors, it behaves
the same.)

Descriptors at start: 0 = requests (from the harness), 1 = replies (to the harness), 2 = the
capped output pipe. Before any untrusted code runs they are moved: requests and replies to fresh
non-inheritable descriptors, 0 to ``/dev/null``, 1 and 2 to the output pipe (``print`` goes there).
It imports nothing beyond the interpreter's start-up modules (``marshal`` is built in; ``json``
would pull in ``re`` and ``enum``), so starting it costs a fork.

Protocol. Harness -> child (trusted data): 4-byte big-endian length + ``marshal`` (version 4):

- once: ``{"source", "entry_point", "limits", "confine", "guard", "workdir", "max_files",
  "reply_bytes"}``; the child lowers its own resource limits, confines itself (``confine``,
  see :func:`confine`) and installs the guard before compiling the source;
- per call ``n`` (1, 2, ...): ``(n, args, kwargs)``, plain values.

Child -> harness (untrusted, parsed with ``json`` and checked there): one JSON line per message,

- ``[0, "started"]`` before reading anything (the child is running); when asked to confine
  itself, ``[0, "confined", description]`` or ``[0, "confine_error", detail]`` (then it exits
  without running the source: the harness reports that it could not verify); both are sent
  before any untrusted code runs, so the completion cannot forge them; then ``[0, "ready"]`` or
  ``[0, "load_error", status, detail]``;
- per call: ``[n, "ok", value]`` (tagged plain data, see :class:`Encoder`), ``[n, "bad", why]``
  (not plain data, or too large), ``[n, "exc", type name, message, is_exception]``
  (``is_exception``: false for a ``BaseException`` that ``except Exception`` would not catch).

The completion can write to the reply descriptor itself (it lives in this process): that is the
same power as returning a value, and no more. The harness accepts only the next call's number,
only these kinds, only plain data within size and depth limits, and decides the verdict itself.
"""

import marshal
import os
import sys

MAX_DEPTH = 100


class BadValue(Exception):
    pass


class Encoder:
    """Plain data -> tagged JSON-able lists, within ``budget`` bytes (approximate) and MAX_DEPTH.
    Only exact built-in types are accepted, so no method of the completion's classes runs here.

    Tags: ``["0"]`` None, ``["b", bool]``, ``["i", hex]`` int, ``["f", repr]`` float, ``["s", str]``,
    ``["z", hex]`` a str with lone surrogates (its UTF-8 with ``surrogatepass``: JSON would read
    ``"\\ud800\\udfff"`` back as one character), ``["y", hex]`` bytes, ``["l" | "t" | "S" | "F",
    [items]]`` list, tuple, set, frozenset, ``["d", [[key, value], ...]]`` dict."""

    def __init__(self, budget):
        self.left = budget

    def spend(self, n):
        self.left -= n
        if self.left < 0:
            raise BadValue("the return value is larger than the reply limit")

    def enc(self, x, depth=0):
        if depth > MAX_DEPTH:
            raise BadValue("nested deeper than %d" % MAX_DEPTH)
        t = type(x)
        self.spend(8)
        if x is None:
            return ["0"]
        if t is bool:
            return ["b", x]
        if t is int:
            if x.bit_length() > 4 * self.left:
                raise BadValue("the return value is larger than the reply limit")
            h = hex(x)
            self.spend(len(h))
            return ["i", h]
        if t is float:
            return ["f", repr(x)]
        if t is str:
            self.spend(len(x))
            if not x.isascii():
                try:
                    x.encode("utf-8")
                except UnicodeEncodeError:  # lone surrogates: JSON would pair "\ud800\udfff" into one character
                    raw = x.encode("utf-8", "surrogatepass")
                    self.spend(2 * len(raw))
                    return ["z", raw.hex()]
            return ["s", x]
        if t is bytes:
            self.spend(2 * len(x))
            return ["y", x.hex()]
        if t in (list, tuple, set, frozenset):
            self.spend(2 * len(x))
            tag = {list: "l", tuple: "t", set: "S", frozenset: "F"}[t]
            return [tag, [self.enc(v, depth + 1) for v in x]]
        if t is dict:
            self.spend(4 * len(x))
            return ["d", [[self.enc(k, depth + 1), self.enc(v, depth + 1)] for k, v in x.items()]]
        raise BadValue("value of type %s is not plain data" % t.__name__)


# JSON text of the reply structures (lists, str, bool, small int), written by hand so that the
# child needs no ``json`` (whose import pulls in ``re`` and ``enum``). Strings escape quotes,
# backslashes, control characters and lone surrogates; the rest goes as UTF-8.
_ESC = {i: "\\u%04x" % i for i in list(range(32)) + list(range(0xD800, 0xE000))}
_ESC.update({34: '\\"', 92: "\\\\"})


def to_json(x, out):
    t = type(x)
    if t is str:
        out.append('"' + x.translate(_ESC) + '"')
    elif t is list:
        out.append("[")
        for i, v in enumerate(x):
            if i:
                out.append(",")
            to_json(v, out)
        out.append("]")
    elif t is bool:
        out.append("true" if x else "false")
    elif t is int:
        out.append(str(x))
    else:
        raise TypeError("cannot write %s" % t.__name__)


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


# ---------------------------------------------------------------- confinement (rlimit isolation)

# Landlock (Linux 5.13+, no privileges needed): filesystem rights by ABI version, the rights a
# rule on a regular file may carry, network (ABI 4: TCP bind/connect) and scopes (ABI 6:
# abstract UNIX sockets and signals outside the domain).
LL_EXECUTE, LL_WRITE_FILE, LL_READ_FILE, LL_READ_DIR = 1, 2, 4, 8
LL_FS = ((1, (1 << 13) - 1), (2, 1 << 13), (3, 1 << 14), (5, 1 << 15))  # REFER, TRUNCATE, IOCTL_DEV
LL_FILE_RIGHTS = LL_EXECUTE | LL_WRITE_FILE | LL_READ_FILE | (1 << 14) | (1 << 15)
SYS_LANDLOCK = (444, 445, 446)  # create_ruleset, add_rule, restrict_self: one number on every architecture
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
# seccomp: (audit arch, syscalls refused with EPERM). kill, tkill, tgkill, rt_sigqueueinfo,
# rt_tgsigqueueinfo, ptrace, process_vm_readv/writev, perf_event_open, pidfd_send_signal,
# io_uring_setup, pidfd_open, pidfd_getfd, process_madvise, socket (socketpair stays).
SECCOMP_DENY = {
    "x86_64": (0xC000003E, (62, 200, 234, 129, 297, 101, 310, 311, 298, 424, 425, 434, 438, 440, 41)),
    "aarch64": (0xC00000B7, (129, 130, 131, 138, 240, 117, 270, 271, 241, 424, 425, 434, 438, 440, 198)),
}


def confine(workdir):
    """Kernel-enforced confinement of this process and everything it starts, irrevocable once set
    and applied before any untrusted code runs (the completion cannot switch it off, unlike the
    audit-hook guard, whose state lives in Python objects the completion can reach):

    - Landlock: reads only in the standard library (its ``site-packages`` excepted) and the
      directories of the shared libraries already mapped (where ``dlopen`` finds the rest); reads
      and writes only in ``workdir``; no ``execve`` anywhere; nothing in ``/proc`` (no other
      process's descriptors, memory or environment, the trainer's report pipe included), no TCP;
      from ABI 6 no signals and no abstract UNIX sockets outside the domain. Landlock also denies
      ptrace of processes outside the domain.
    - seccomp (x86_64, aarch64): no signals to any process (``kill`` and its kin), no ptrace,
      no cross-process memory calls, no pidfds, no io_uring, no sockets (``socketpair`` stays);
      a system call of another ABI (i386, x32) kills the process.

    Written with ``ctypes`` system calls rather than a package because this interpreter runs
    isolated (``-I -S``, standard library only; it may not be the trainer's). Returns a
    description; raises OSError when the kernel refuses any part (the caller reports the
    sandbox as unable to verify, and the completion never runs)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    sc = libc.syscall
    sc.restype = ctypes.c_long

    def fail(what):
        err = ctypes.get_errno()
        raise OSError(err, "%s: %s" % (what, os.strerror(err)))

    abi = sc(SYS_LANDLOCK[0], None, ctypes.c_size_t(0), ctypes.c_uint32(1))  # LANDLOCK_CREATE_RULESET_VERSION
    if abi < 1:
        fail("Landlock is not available (Linux 5.13+ with Landlock enabled)")
    arch = SECCOMP_DENY.get(os.uname().machine)
    if arch is None:
        raise OSError("no seccomp filter for the %s architecture" % os.uname().machine)
    fs = 0
    for version, rights in LL_FS:
        if abi >= version:
            fs |= rights
    attr = (ctypes.c_uint64 * 3)(fs, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = sc(SYS_LANDLOCK[0], ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        fail("landlock_create_ruleset")

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    def allow(path, rights):
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return  # a path this machine lacks grants nothing
        try:
            if not os.path.isdir(path):
                rights &= LL_FILE_RIGHTS
            rule = PathBeneath(rights & fs, fd)
            if sc(SYS_LANDLOCK[1], ctypes.c_int(ruleset), ctypes.c_int(1), ctypes.byref(rule), ctypes.c_uint32(0)) < 0:
                fail("landlock_add_rule %s" % path)
        finally:
            os.close(fd)

    read = LL_READ_FILE | LL_READ_DIR
    stdlib = os.path.realpath(os.path.dirname(os.__file__))
    for name in os.listdir(stdlib):
        if name not in ("site-packages", "dist-packages"):
            allow(os.path.join(stdlib, name), read)
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/") and ".so" in parts[5]:
                libs.add(os.path.realpath(parts[5].strip()))
    for lib in sorted(libs):
        d = os.path.dirname(lib)
        if d == stdlib or d.startswith(stdlib + "/"):
            continue  # lib-dynload: granted above
        # a directory above the standard library (``<prefix>/lib`` holding libpython) would grant
        # its site-packages too: there, the mapped file alone
        allow(lib if stdlib.startswith(d + "/") else d, read)
    allow("/etc/ld.so.cache", LL_READ_FILE)
    for dev in ("/dev/null", "/dev/zero", "/dev/urandom"):
        allow(dev, LL_READ_FILE | LL_WRITE_FILE)
    allow(os.path.realpath(workdir), fs & ~LL_EXECUTE)

    # seccomp: check the architecture, refuse other ABIs, then the listed calls
    code, deny = arch

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    kill, eperm, allow_all = 0x80000000, 0x00050000 | 1, 0x7FFF0000
    prog = [(ld, 0, 0, 4), (jeq, 1, 0, code), (ret, 0, 0, kill), (ld, 0, 0, 0)]
    if os.uname().machine == "x86_64":
        prog += [(jge, 0, 1, 0x40000000), (ret, 0, 0, kill)]  # x32 system calls
    for nr in deny:
        prog += [(jeq, 0, 1, nr), (ret, 0, 0, eperm)]
    prog.append((ret, 0, 0, allow_all))
    filters = (Filter * len(prog))(*[Filter(*p) for p in prog])
    fprog = Prog(len(prog), filters)

    prctl = libc.prctl
    if prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        fail("prctl(PR_SET_NO_NEW_PRIVS)")
    if sc(SYS_LANDLOCK[2], ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
        fail("landlock_restrict_self")
    os.close(ruleset)
    if prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        fail("prctl(PR_SET_SECCOMP)")
    return "landlock ABI %d + seccomp" % abi


# ---------------------------------------------------------------- guard (rlimit isolation)


def install_guard(workdir, max_files):
    """Audit hook for the rlimit fallback: writes only under ``workdir`` and to at most
    ``max_files`` distinct files (with RLIMIT_FSIZE this bounds the disk a call can fill); reads
    only there and in the standard library; no sockets, subprocesses, fork, exec, ctypes or
    signals to other processes. A defence in depth, not a security boundary on its own (the OS
    limits still apply)."""
    work = os.path.realpath(workdir)
    # the standard library (lib-dynload is inside it), found without importing sysconfig
    roots = (work, "/dev/null", "/dev/urandom", "/dev/zero", os.path.realpath(os.path.dirname(os.__file__)))
    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    blocked = (
        "subprocess.Popen",
        "os.system",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.fork",
        "os.forkpty",
        "ctypes.dlopen",
        "ctypes.dlsym",
        "ctypes.cdata",
        "ctypes.call_function",
        "pty.spawn",
        "os.setuid",
        "os.putenv",
        "os.unsetenv",
        "sys.addaudithook",
        "sys.settrace",
        "sys.setprofile",
        "os.chroot",
    )
    path_events = (
        "os.mkdir",
        "os.rename",
        "os.remove",
        "os.rmdir",
        "os.symlink",
        "os.link",
        "os.chmod",
        "os.chown",
        "os.truncate",
        "os.utime",
        "os.mkfifo",
        "os.mknod",
        "shutil.rmtree",
        "shutil.move",
        "shutil.copyfile",
        "os.chdir",
    )
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
            write = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & writing
            )
            if not inside(path, (work,) if write else roots):
                raise PermissionError(
                    "sandbox guard: %s %r is outside the sandbox" % ("write" if write else "read", path)
                )
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


# ---------------------------------------------------------------- main


def main():
    req_fd, resp_fd = os.dup(0), os.dup(1)  # non-inheritable copies (PEP 446)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
    sys.stderr = sys.stdout
    read, write, loads = os.read, os.write, marshal.loads  # bound before untrusted code runs

    def send(msg):
        parts = []
        to_json(msg, parts)
        parts.append("\n")
        data = memoryview("".join(parts).encode())
        while data:
            data = data[write(resp_fd, data) :]

    def receive():
        head = b""
        while len(head) < 4:
            chunk = read(req_fd, 4 - len(head))
            if not chunk:
                os._exit(0)  # the harness is done
            head += chunk
        size = int.from_bytes(head, "big")
        body = bytearray()
        while len(body) < size:
            chunk = read(req_fd, min(size - len(body), 1 << 20))
            if not chunk:
                os._exit(0)
            body += chunk
        return loads(bytes(body))

    send([0, "started"])
    init = receive()
    source, entry_point, budget = init["source"], init["entry_point"], int(init["reply_bytes"])
    apply_limits(init.get("limits") or {})
    if init.get("confine"):  # before the guard, which refuses ctypes; before any untrusted code
        try:
            send([0, "confined", confine(init["workdir"])])
        except Exception as e:  # noqa: BLE001 - any failure: the completion must not run unconfined
            send([0, "confine_error", "%s: %s" % (type(e).__name__, e)])
            os._exit(0)
    if init.get("guard"):
        install_guard(init["workdir"], int(init.get("max_files") or 4))
    del init
    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        code = compile(source, "<completion>", "exec")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
        send([0, "load_error", "syntax_error", "%s: %s" % (type(e).__name__, e)])
        os._exit(0)
    try:
        exec(code, ns)
        fn = ns.get(entry_point)
        if not callable(fn):
            send([0, "load_error", "no_function", "no function %r defined" % entry_point])
            os._exit(0)
        send([0, "ready"])
    except BaseException as e:
        try:
            send([0, "load_error", "memory" if isinstance(e, MemoryError) else "exception", "%s: %s" % describe(e)])
        finally:
            os._exit(0)
    while True:
        n, args, kwargs = receive()
        try:
            result = fn(*args, **kwargs)
        except BaseException as e:
            name, msg = describe(e)
            send([n, "exc", name, msg, isinstance(e, Exception)])
            continue
        try:
            reply = [n, "ok", Encoder(budget).enc(result)]
        except BadValue as e:
            reply = [n, "bad", str(e)]
        except BaseException as e:  # MemoryError while encoding
            name, msg = describe(e)
            reply = [n, "exc", name, msg, isinstance(e, Exception)]
        send(reply)


def describe(e):
    """(type name, message) of an exception; its ``__str__`` is the completion's code and may raise anything."""
    try:
        name = type(e).__name__
        name = name[:100] if type(name) is str else "?"
    except BaseException:
        name = "?"
    try:
        msg = str(e)
        msg = msg[:200] if type(msg) is str else ""
    except BaseException:
        msg = "(the exception could not be printed)"
    return name, msg


def run():
    try:
        main()
    except BaseException:  # the completion broke this loop (a signal handler, os.close of a pipe, ...)
        os._exit(3)
    os._exit(0)


if __name__ == "__main__":
    run()
