"""The program that runs inside the sandbox: ``python -I -S -u -c <this file> MODE LIMITS PATH ...``.

Standard library only, and as few imports as possible on the fresh path: the interpreter
starts thousands of times per training step. It first lowers its own rlimits (soft = hard,
so the code it runs cannot raise them back), then does one of:

- ``run``: execute the code read from stdin once (fresh mode);
- ``worker CMD_FD RES_FD``: a stateful interpreter; cells arrive length-prefixed on CMD_FD,
  one byte on RES_FD says a cell finished (its output went to stdout/stderr before it);
- ``server SOCK_FD ...``: the warm fork server of fresh mode (its code, :mod:`serve`, travels
  as one more argument and runs in these globals);
- ``candidate`` / ``harness``: the two halves of the hidden-test checker (see
  :mod:`agentrl.envs.code_check`). The candidate process holds the solution; the harness
  process holds the tests and calls the solution through a pipe, receiving only plain values
  rebuilt from a strict wire format, so an object with a lying ``__eq__`` or a monkeypatch
  in the candidate's process cannot reach the tests. The harness prints the secret completion
  token only after ``check`` returned.

Like a notebook, a cell whose last statement is an expression prints that value's repr.

Before anything else the child confines its view of the host's files where the launch says so
(``VIEW=`` in the spec; see :mod:`.isolation`): at the unshare level it builds the sandbox's
root and pivots into it (:func:`enter_root`), at the rlimits level it applies Landlock rules.
"""

import posix as os  # the os module costs ~1 ms of start-up; posix has read/write, all we need
import sys

CELL = "<cell>"


def guard(fd, scope, detach=False):
    """Tie this sandbox to the trainer: fork a watcher that blocks on the lifeline pipe, whose
    only write end the trainer holds. EOF means the trainer closed it (the run is over) or died
    (even by SIGKILL, which no launcher reliably forwards: privileged bubblewrap drops its
    parent-death signal when it changes credentials). Then the watcher kills every process it
    may (``all``: the sandbox's own pid namespace or leased uid) or its process group.
    ``detach``: the watcher is not our child (the fork server counts its children to know that
    a call left nothing behind)."""
    pid = os.fork()
    if pid:
        os.close(fd)  # the code never sees the lifeline
        if detach:
            os.waitpid(pid, 0)
        return
    if detach and os.fork():
        os._exit(0)
    os.closerange(0, fd)  # hold no pipe of the run open: its output ends when the code ends
    os.closerange(fd + 1, 1 << 16)
    try:
        os.read(fd, 1)
    except OSError:
        pass
    try:
        os.kill(-1, 9) if scope == "all" else os.killpg(0, 9)
    except OSError:
        pass
    os._exit(0)


def set_limits(spec):
    """Apply ``NAME=value,...`` rlimits with soft == hard (never above the current hard limit);
    ``VIEW=hex`` first confines the view of the host's files (:func:`confine`);
    ``LIFE=fd:scope[:detach]`` starts the :func:`guard`; if the spec has ``UID=n``, become uid/gid n with no supplementary groups (used under
    privileged bubblewrap, which already set no_new_privs and left only CAP_SETUID/CAP_SETGID:
    after the switch the process has no capabilities and cannot regain any)."""
    import resource

    uid = life = None
    for item in spec.split(","):
        if item.startswith("VIEW="):
            confine(item[5:])
    for item in spec.split(","):
        if not item or item.startswith("VIEW="):
            continue
        name, _, value = item.partition("=")
        if name == "UID":
            uid = int(value)
            continue
        if name == "LIFE":
            life = value
            continue
        which = getattr(resource, "RLIMIT_" + name)
        want = int(value)
        hard = resource.getrlimit(which)[1]
        if hard != resource.RLIM_INFINITY and want > hard:
            want = hard
        resource.setrlimit(which, (want, want))
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    if life is not None:
        fd, scope, *detach = life.split(":")
        guard(int(fd), scope, detach=bool(detach))


def confine(hexspec):
    """``("root", top, mounts)``: :func:`enter_root`; ``("landlock", code, rules, handled)``:
    run the Landlock module's code (it travels with the launch) and restrict this process."""
    import marshal

    kind, *spec = marshal.loads(bytes.fromhex(hexspec))
    if kind == "root":
        enter_root(*spec)
    else:
        code, rules, handled = spec
        scope = {"__builtins__": __builtins__}
        exec(code, scope)
        scope["restrict"](rules, handled)


# mount(2) flags; and the statvfs flags a bind keeps from its source, which a user namespace
# locks, so its read-only remount must repeat them: noexec, noatime, nodiratime, relatime.
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
_KEPT_FLAGS = ((8, 8), (1024, 1024), (2048, 2048), (4096, 1 << 21))


def enter_root(top, mounts, pivot_root):
    """Unshare level, as (namespace) root: build the sandbox's root at the empty directory
    ``top`` from ``mounts`` (``(kind, path, arg)``: ``ro``/``bind`` a host path, ``link`` to
    ``arg``, ``tmpfs`` with ``arg`` = ``SIZE:MODE``; the first is the root's own tmpfs), make it
    read-only, pivot into it (syscall number ``pivot_root``) and detach the host's root:
    detached, not covered, so not even a root inside the sandbox can unmount its way back.
    Then sets no_new_privs."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    def check(ret, what):
        if ret != 0:
            e = ctypes.get_errno()
            raise OSError(e, "sandbox root: %s: %s (use isolation='bwrap')" % (what, os.strerror(e)))

    def mount(src, dst, fstype, flags, data=None):
        enc = lambda v: None if v is None else v.encode()  # noqa: E731
        check(libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)), "mount " + dst)

    def makedirs(path):
        try:
            os.lstat(path)
        except OSError:
            makedirs(path.rsplit("/", 1)[0])
            os.mkdir(path, 0o755)

    mount(None, "/", None, MS_REC | MS_PRIVATE)
    makedirs(top)  # a /tmp cleaner may have removed it since the trainer made it
    readonly = []
    for kind, path, arg in mounts:
        dst = top + path
        if kind == "link":
            makedirs(dst.rsplit("/", 1)[0])
            os.symlink(arg, dst)
            continue
        if kind == "tmpfs":
            size, mode = arg.split(":")
            makedirs(dst)
            mount("tmpfs", dst, "tmpfs", MS_NOSUID | MS_NODEV, "mode=%s" % mode + (",size=" + size if size != "0" else ""))
            if mode != "1777" and path != "/dev":
                readonly.append(dst)  # the root, or a hidden directory: empty for good
            continue
        if os.stat(path).st_mode & 0o170000 == 0o040000:
            makedirs(dst)
        else:  # a file (a device, pyvenv.cfg): the mount point is an empty file
            makedirs(dst.rsplit("/", 1)[0])
            os.close(os.open(dst, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
        mount(path, dst, None, MS_BIND | MS_REC)
        if kind == "ro":
            readonly.append(dst)
    for dst in reversed(readonly):  # innermost first, once nothing more is created inside
        kept = os.statvfs(dst).f_flag
        extra = sum(ms for st, ms in _KEPT_FLAGS if kept & st)
        mount(None, dst, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | extra)
    os.chdir(top)
    check(libc.syscall(pivot_root, b".", b"."), "pivot_root")  # the host's root now lies on top of ours ...
    check(libc.umount2(b".", 2), "detach the host's root")  # ... and is gone (MNT_DETACH)
    os.chdir("/tmp")
    check(libc.prctl(38, 1, 0, 0, 0), "no_new_privs")  # PR_SET_NO_NEW_PRIVS


def report(exc, src):
    """Print a traceback that starts at the user's code, with its source lines."""
    import linecache
    import traceback

    linecache.cache[CELL] = (len(src), None, src.splitlines(True), CELL)
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != CELL:
        tb = tb.tb_next
    try:
        text = "".join(traceback.format_exception(type(exc), exc, tb))
    except BaseException:
        text = "Traceback unavailable: %s\n" % type(exc).__name__
    sys.stderr.write(text)


def run_cell(src, g, catch_exit):
    """Execute one cell in globals ``g``; echo the value of a trailing expression. Returns ok."""
    import _ast

    try:
        tree = compile(src, CELL, "exec", _ast.PyCF_ONLY_AST)
        last = None
        if tree.body and type(tree.body[-1]) is _ast.Expr:
            last = _ast.Expression(tree.body.pop().value)
        exec(compile(tree, CELL, "exec"), g)
        if last is not None:
            value = eval(compile(last, CELL, "eval"), g)
            if value is not None:
                sys.stdout.write(repr(value) + "\n")
        return True
    except SystemExit as exc:
        if not catch_exit:
            raise
        sys.stderr.write("SystemExit: %s\n" % (exc.code,))
        return False
    except BaseException as exc:
        report(exc, src)
        return False


def read_exact(fd, n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def read_frame(fd):
    head = read_exact(fd, 4)
    if head is None:
        return None
    return read_exact(fd, int.from_bytes(head, "big"))


def write_frame(fd, data):
    data = len(data).to_bytes(4, "big") + data
    while data:
        data = data[os.write(fd, data):]


def flush():
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except BaseException:
            pass


def worker(cmd_fd, res_fd):
    g = {"__name__": "__main__", "__builtins__": __builtins__}
    while True:
        frame = read_frame(cmd_fd)
        if frame is None:
            return
        run_cell(frame.decode("utf-8", "replace"), g, catch_exit=True)
        flush()
        os.write(res_fd, b"\n")


# ---- the checker's wire format: plain values only, rebuilt on the receiving side ----

_SCALARS = (type(None), bool, int, float, str)


def encode(v, depth=0):
    """A JSON-able form of ``v`` built from exact builtin types (subclasses are refused)."""
    t = type(v)
    if depth > 200:
        raise TypeError("value nested too deeply")
    if t in _SCALARS:
        return v
    if t is list or t is tuple or t is set or t is frozenset:
        tag = {list: "l", tuple: "t", set: "s", frozenset: "f"}[t]
        return {"t": tag, "v": [encode(x, depth + 1) for x in v]}
    if t is dict:
        return {"t": "d", "v": [[encode(k, depth + 1), encode(x, depth + 1)] for k, x in v.items()]}
    if t is bytes:
        return {"t": "b", "v": v.decode("latin-1")}
    if t is complex:
        return {"t": "c", "v": [v.real, v.imag]}
    raise TypeError("cannot pass a value of type %s between solution and tests" % t.__name__)


def decode(v, depth=0):
    """Inverse of :func:`encode`; anything else is rejected."""
    t = type(v)
    if depth > 200:
        raise TypeError("value nested too deeply")
    if t in _SCALARS:
        return v
    if t is not dict or set(v) != {"t", "v"}:
        raise TypeError("malformed value on the wire")
    tag, p = v["t"], v["v"]
    if tag in ("l", "t", "s", "f") and type(p) is list:
        items = [decode(x, depth + 1) for x in p]
        return {"l": list, "t": tuple, "s": set, "f": frozenset}[tag](items)
    if tag == "d" and type(p) is list:
        out = {}
        for pair in p:
            if type(pair) is not list or len(pair) != 2:
                raise TypeError("malformed dict on the wire")
            out[decode(pair[0], depth + 1)] = decode(pair[1], depth + 1)
        return out
    if tag == "b" and type(p) is str:
        return p.encode("latin-1")
    if tag == "c" and type(p) is list and len(p) == 2 and all(type(x) is float for x in p):
        return complex(p[0], p[1])
    raise TypeError("malformed value on the wire")


def send(fd, obj):
    import json

    write_frame(fd, json.dumps(obj).encode())


def receive(fd):
    import json

    frame = read_frame(fd)
    if frame is None:
        raise EOFError("the solution's process ended")
    return json.loads(frame)


def candidate(job):
    """Load the solution, then answer calls until the harness closes the pipe."""
    req, resp = job["req_fd"], job["resp_fd"]
    g = {"__name__": "candidate", "__builtins__": __builtins__}
    ok = run_cell(job["program"], g, catch_exit=True)
    fn = g.get(job["entry_point"])
    if not ok or not callable(fn):
        send(resp, {"load_error": "the solution did not define %s()" % job["entry_point"]})
        return
    send(resp, {"ready": True})
    while True:
        try:
            call = receive(req)
        except EOFError:
            return
        try:
            args = [decode(a) for a in call["a"]]
            kwargs = {k: decode(x) for k, x in call["k"].items()}
            reply = {"r": encode(fn(*args, **kwargs))}
        except BaseException as exc:
            reply = {"e": [type(exc).__name__, str(exc)[:2000]]}
        send(resp, reply)


def harness(job):
    """Run the hidden tests against the solution behind a pipe; print the token if all pass."""
    import builtins

    if job.get("undumpable"):
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE: keep same-uid readers out of our memory
    req, resp = job["req_fd"], job["resp_fd"]
    g = {"__name__": "tests", "__builtins__": __builtins__}
    exec(compile(job["prelude"], "<prompt>", "exec"), g)
    hello = receive(resp)
    if "ready" not in hello:
        sys.stderr.write("solution failed to load: %s\n" % hello.get("load_error"))
        sys.exit(1)

    class SolutionError(Exception):
        pass

    def solution(*args, **kwargs):
        send(req, {"a": [encode(a) for a in args], "k": {k: encode(x) for k, x in kwargs.items()}})
        reply = receive(resp)
        if type(reply) is dict and "r" in reply:
            return decode(reply["r"])
        if type(reply) is dict and "e" in reply:
            name, message = reply["e"]
            cls = getattr(builtins, str(name), None)
            if not (isinstance(cls, type) and issubclass(cls, Exception)):
                cls = SolutionError
            raise cls(message)
        raise TypeError("malformed reply from the solution")

    g[job["entry_point"]] = solution
    exec(compile(job["tests"], "<tests>", "exec"), g)
    g[job.get("check", "check")](solution)
    flush()
    os.write(1, ("\n%s\n" % job["token"]).encode())


def main():
    mode, limits = sys.argv[1], sys.argv[2]
    set_limits(limits)
    if len(sys.argv) > 3 and sys.argv[3]:
        sys.path.extend(sys.argv[3].split(":"))
    import builtins
    import faulthandler

    faulthandler.enable()
    if not hasattr(builtins, "exit"):  # -S skips site, which defines exit() and quit()
        builtins.exit = builtins.quit = sys.exit
    if mode == "run":
        src = sys.stdin.buffer.read().decode("utf-8", "replace")
        ok = run_cell(src, {"__name__": "__main__", "__builtins__": __builtins__}, catch_exit=False)
        flush()
        sys.exit(0 if ok else 1)
    if mode == "worker":
        worker(int(sys.argv[4]), int(sys.argv[5]))
        return
    if mode == "server":  # SOCK_FD NAMESPACES DISK_BYTES KEEP SERVER_CODE (see serve.py)
        import marshal

        exec(marshal.loads(bytes.fromhex(sys.argv.pop())), globals())
        keep = [p for p in sys.argv[7].split(":") if p]
        serve(int(sys.argv[4]), sys.argv[5] == "1", int(sys.argv[6]), keep)  # noqa: F821 - defined by serve.py
        return
    import json

    job = json.loads(sys.stdin.buffer.read())
    if mode == "candidate":
        candidate(job)
    elif mode == "harness":
        harness(job)
    else:
        sys.exit("unknown mode %r" % mode)


if __name__ == "__main__":
    main()
