"""The warm fork server that runs inside the sandbox (``child.py server ...`` executes this code
in its own globals, so :func:`set_limits`, :func:`run_cell` and :func:`flush` come from there).

Standard library only. Started once per pool slot by :mod:`.forkserver`, through the same
launch as a fresh interpreter, as root (the fork server is used only when the trainer is root:
calls are kept apart by their leased uids). Under bubblewrap it keeps only CAP_SETUID,
CAP_SETGID and CAP_SYS_ADMIN (for each call's private mounts); ``no_new_privs`` is set first,
so nothing it starts can gain privileges. It imports the modules a tool call typically needs,
freezes them out of the garbage collector (a child's collector would otherwise write to, and
so copy, every page of them), and serves one call at a time on one SOCK_SEQPACKET socket.

A request is one datagram ``uid NUL workdir NUL limits`` carrying the call's descriptors: its
stdin (the code), its stdout/stderr, its control socket, and at the rlimits level a lifeline.
The server never reads the code or the output: what it holds of a call is its uid, limits and
exit status. Per call it forks one child, the *code's process*, ahead of the request (right
after the previous call ended, so the fork is off the next call's critical path), which

- starts its own session and process group; at the namespace levels enters a mount and IPC
  namespace of its own with a fresh, sized ``/tmp`` (working directory and HOME) and
  ``/dev/shm``, which vanish with its last process; then waits for its request;
- keeps only the call's stdio (and, at the rlimits level, its lifeline) open, works in the
  host directory ``workdir`` made for the call at the rlimits level;
- becomes the call's leased uid (no capabilities left), applies the call's rlimits, and runs
  the code, under the server's seccomp filter (inherited) that refuses the kernel keyrings.

The server is a child subreaper: everything the call starts, daemons included, stays its
descendant. When the code's process ends, or the trainer closes the control socket (a kill,
or the trainer's death), the server kills every process of the call's uid and reaps until it
has no child left, so no process of the call survives its status line: ``x CODE`` (exit code),
``s SIGNUM`` (killed by a signal) or ``k`` (stopped by the trainer), then EOF. EOF alone means
the server was lost. A process of one call cannot signal, trace or read the server (root) nor
any other call (another uid, and at the namespace levels another server's pid namespace).
"""

import os
import select
import signal
import socket
import time

# Imported once by the server, so a call finds them already loaded. Chosen by what tool calls
# use and by weight: every page the server maps is copied into each call's page tables and
# unmapped at its exit, so hashlib (libcrypto, +3.7 MB), dataclasses, typing, tempfile or
# subprocess would cost every call more than they save the few that import them.
PRELOAD = (
    "math", "cmath", "json", "re", "random", "itertools", "functools", "collections", "statistics",
    "fractions", "decimal", "datetime", "time", "string", "heapq", "bisect", "operator", "copy",
    "enum", "numbers", "struct", "io", "traceback", "linecache", "threading", "atexit", "contextlib",
    "resource", "_ast",  # used by every call (child.set_limits, child.run_cell)
)
CLONE_NEWNS, CLONE_NEWIPC = 0x00020000, 0x08000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER, MNT_DETACH = 38, 36, 2
_libc = None


def _sys(name, *args):
    """Call a libc function; raise OSError with its errno on failure."""
    import ctypes

    if getattr(_libc, name)(*args) != 0:
        e = ctypes.get_errno()
        raise OSError(e, "%s: %s" % (name, os.strerror(e)))


def _mount(src, target, fstype, flags, data):
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _sys("mount", enc(src), enc(target), enc(fstype), flags, enc(data))


# Kernel keyrings outlive processes and are per uid: a key a call adds to its user keyring
# would be there for a later call that leases the same uid. The code's process may not use
# them (a seccomp filter, as container runtimes do): {machine: (audit arch, add_key,
# request_key, keyctl)}. Any other ABI on the same kernel (i386, x32) is refused whole.
_KEYRING_SYSCALLS = {"x86_64": (0xC000003E, 248, 249, 250), "aarch64": (0xC00000B7, 217, 218, 219)}
_filter = None


def build_filter():
    """The seccomp program (kept alive in the server; every child installs the same one)."""
    import ctypes

    machine = os.uname().machine
    if machine not in _KEYRING_SYSCALLS:
        return None
    arch, add_key, request_key, keyctl = _KEYRING_SYSCALLS[machine]

    class Insn(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Insn))]

    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    deny, allow = 0x00050000 | 1, 0x7FFF0000  # SECCOMP_RET_ERRNO | EPERM, SECCOMP_RET_ALLOW
    code = [(ld, 0, 0, 4), (jeq, 0, 6, arch), (ld, 0, 0, 0), (jge, 4, 0, 0x40000000),
            (jeq, 3, 0, add_key), (jeq, 2, 0, request_key), (jeq, 1, 0, keyctl), (ret, 0, 0, allow), (ret, 0, 0, deny)]
    insns = (Insn * len(code))(*[Insn(*c) for c in code])
    return insns, Prog(len(code), ctypes.cast(insns, ctypes.POINTER(Insn)))


def install_filter():
    if _filter is not None:
        import ctypes

        _sys("prctl", 22, 2, ctypes.byref(_filter[1]), 0, 0)  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER


def private_mounts(disk_bytes, keep):
    """A fresh ``/tmp`` and ``/dev/shm`` for this call only, and its own System V IPC and
    POSIX message queues (all of them vanish with the call's last process). What the host
    view binds under /tmp (a virtualenv's allowed packages) is bound back read-only."""
    _sys("unshare", CLONE_NEWNS | CLONE_NEWIPC)
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None)  # nothing mounted here reaches the server
    opts = "size=%d,mode=1777" % disk_bytes
    _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, opts)
    staged = []
    for j, path in enumerate(keep):
        stage = "/dev/shm/.keep%d" % j
        is_dir = os.path.isdir(path)
        _mount_point(stage, is_dir)
        _mount(path, stage, None, MS_BIND | MS_REC, None)
        staged.append((stage, path, is_dir))
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, opts)
    for stage, path, is_dir in staged:
        _mount_point(path, is_dir)
        _mount(stage, path, None, MS_BIND | MS_REC, None)
        _sys("umount2", stage.encode(), MNT_DETACH)
        os.rmdir(stage) if is_dir else os.unlink(stage)
        _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None)


def _mount_point(path, is_dir):
    """An empty directory, or for a file (a module such as ``six.py``) an empty file."""
    if is_dir:
        os.makedirs(path, 0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(path), 0o755, exist_ok=True)
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))


def code_process(chan, sock_fd, mounts):
    """The next call's process, forked ahead of its request: what does not depend on the call
    (own session, private mounts) is done while the server is idle; then it waits on ``chan``
    for the request and the call's descriptors. Never returns."""
    status = 1
    try:
        os.close(sock_fd)  # the server's socket: only the server talks to the trainer
        os.setsid()
        if mounts is not None:
            private_mounts(*mounts)
        try:
            req, fds, _, _ = socket.recv_fds(chan, 65536, 4)
        except OSError:
            req, fds = b"", []
        if not req or len(fds) not in (3, 4):
            os._exit(0)  # the server is gone (or stopping): there is no call
        uid_s, workdir, limits = req.decode().split("\0")
        uid = int(uid_s)
        os.dup2(fds[0], 0)
        os.dup2(fds[1], 1)
        os.dup2(fds[1], 2)
        if len(fds) == 4:  # the call's own lifeline (rlimits level), watched under its uid (child.guard)
            os.dup2(fds[3], 3)
            limits += ",LIFE=3:all"
        os.closerange(4 if len(fds) == 4 else 3, 1 << 16)  # this channel, the control socket
        os.chdir(workdir or "/tmp")
        if workdir:
            os.environ["HOME"] = os.environ["TMPDIR"] = workdir
        set_limits(limits + ("" if uid < 0 else ",UID=%d" % uid))  # noqa: F821 - from child.py
        import sys

        sys.argv[:] = ["-c"]
        src = sys.stdin.buffer.read().decode("utf-8", "replace")
        try:
            ok = run_cell(src, {"__name__": "__main__", "__builtins__": __builtins__}, catch_exit=False)  # noqa: F821
            status = 0 if ok else 1
        except SystemExit as exc:
            status = _exit_code(exc.code)
        _shutdown()
    except SystemExit as exc:  # from an atexit handler
        status = _exit_code(exc.code)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        flush()  # noqa: F821 - from child.py
        os._exit(status)


def _exit_code(code):
    """The process exit status Python gives ``sys.exit(code)``."""
    if code is None:
        return 0
    if type(code) is int:
        return code & 0xFF
    import sys

    sys.stderr.write("%s\n" % (code,))
    return 1


def _shutdown():
    """What interpreter exit does before the process ends: join non-daemon threads, run atexit."""
    import atexit
    import sys

    if "threading" in sys.modules:
        sys.modules["threading"]._shutdown()
    atexit._run_exitfuncs()


def prefork(sock_fd, mounts):
    """Fork the next call's process now; returns ``(pid, channel)``."""
    chan, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        chan.close()
        code_process(theirs, sock_fd, mounts)
    theirs.close()
    return pid, chan


def run_call(req, fds, child):
    """Hand the request to the forked-ahead ``child``, supervise it, write the call's status
    line on its control socket."""
    pid, chan = child
    uid = int(req.split(b"\0", 1)[0])
    ctl_fd = fds[2]
    try:
        socket.send_fds(chan, [req], fds)
    except OSError:  # the child forked for this call died before it: no status, the trainer replaces us
        os.waitpid(pid, 0)
        return
    finally:
        chan.close()
    pidfd = os.pidfd_open(pid)
    try:
        ready = select.select([ctl_fd, pidfd], [], [])[0]
    finally:
        os.close(pidfd)
    killed = pidfd not in ready
    if killed:  # the trainer closed its end (a kill, or its own death); we lack CAP_KILL: kill as the call's uid
        kill_uid_from_inside(uid)
    st = os.waitpid(pid, 0)[1]
    if not clear(uid):
        return  # something of the call would not die: no status, the trainer replaces this server
    if killed:
        status = b"k\n"
    elif os.WIFSIGNALED(st):
        status = b"s %d\n" % os.WTERMSIG(st)
    else:
        status = b"x %d\n" % os.WEXITSTATUS(st)
    try:
        os.write(ctl_fd, status)
    except OSError:
        pass


def clear(uid, grace_s=2.0):
    """Kill and reap every process the call left (all are our descendants: we are a subreaper);
    True once we have no child left."""
    deadline = time.monotonic() + grace_s
    next_kill = 0.0
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] != 0:
                continue  # reaped one; look again
        except ChildProcessError:
            return True
        now = time.monotonic()
        if now > deadline:
            return False
        if now >= next_kill:
            kill_uid_from_inside(uid)
            next_kill = now + 0.05
        time.sleep(0.0005)


def kill_uid_from_inside(uid):
    """SIGKILL every process of ``uid``: a helper becomes that uid and signals -1 (everything it
    may signal, which is exactly that uid's processes). The helper is reaped by :func:`clear`."""
    if uid < 0:
        return
    if os.fork() == 0:
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)


def serve(sock_fd, namespaces, disk_bytes, keep):
    """Preimport, then run one call at a time until the trainer closes the socket."""
    global _libc, _filter
    import ctypes
    import gc
    import importlib

    _libc = ctypes.CDLL(None, use_errno=True)
    _filter = build_filter()
    install_filter()  # inherited by every child: the code's process runs under it at no cost per call
    for name in ("mount", "umount2", "unshare", "prctl"):  # resolved once, not in every child
        getattr(_libc, name)
    _sys("prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    _sys("prctl", PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    os.environ.pop("AGENTRL_SANDBOX_RUN", None)  # the launcher's marker; the code's environment is the allow-list
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    gc.collect()
    gc.freeze()
    mounts = (disk_bytes, keep) if namespaces else None
    sock = socket.socket(fileno=sock_fd)
    child = prefork(sock_fd, mounts)
    while True:
        try:
            req, fds, _, _ = socket.recv_fds(sock, 65536, 4)
        except InterruptedError:
            continue
        if not req:
            return  # the trainer closed the socket (the child waiting for a call sees its channel close)
        served = len(fds) in (3, 4)
        try:
            if served:
                run_call(req, fds, child)
        finally:
            for fd in fds:
                os.close(fd)
        if served:
            child = prefork(sock_fd, mounts)  # off the next call's critical path, holding no fd of the last call
