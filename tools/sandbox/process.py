"""Start sandboxed processes, pump their pipes until a deadline, and kill everything they left.

The parent enforces the wall clock (the child's own alarms can be ignored by the code), reads
output while the child runs (a full pipe never blocks it; the capture keeps head and tail),
stops a child that prints more than the byte budget, and on the way out kills the whole
process group, then any straggler: with a pid namespace, killing the launcher takes the
namespace down; without one, every process of the sandbox's uid (or, when not root, every
own process carrying the run's marker variable) is killed.

Example::

    from agentrl.tools.sandbox.process import SandboxProcess, pump
    p = SandboxProcess(["sh", "-c", "echo hi"], env={}, cwd="/", max_chars=100)
    pump([p], until=lambda: p.exited, deadline_s=5, max_bytes=1000)
    p.kill()
    assert p.capture.text() == "hi\\n" and p.returncode == 0
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from typing import Callable

from .capture import OutputCapture

_CHUNK = 65536


class PipePump:
    """The parent's side of a run's pipes, pumped without blocking by :func:`pump`: output into
    ``capture``, ``pending`` bytes into ``in_fd`` as fast as the child reads them. Used by a
    sandboxed process and by a call forked from a warm server alike."""

    capture: OutputCapture
    stdout_fd: int
    stdout_open: bool
    in_fd: int | None
    pending: bytes

    def read_available(self) -> None:
        """Read what the pipe holds now (non-blocking) into the capture."""
        while self.stdout_open:
            try:
                data = os.read(self.stdout_fd, _CHUNK)
            except BlockingIOError:
                return
            if not data:
                self.stdout_open = False
                return
            self.capture.feed(data)

    def write_pending(self) -> None:
        if self.in_fd is None:
            return
        try:
            n = os.write(self.in_fd, self.pending[:_CHUNK]) if self.pending else 0
        except BlockingIOError:
            return
        except OSError:  # the child closed its end: what it did not read is dropped
            n = len(self.pending)
        self.pending = self.pending[n:]
        if not self.pending:
            self.close_input()
            self.in_fd = None

    def close_input(self) -> None:
        """All input written: end it (the child reads EOF)."""
        os.close(self.in_fd)


class SandboxProcess(PipePump):
    """One child: stdout and stderr merged into one capped capture, stdin fed from bytes."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        max_chars: int,
        stdin: bytes | None = None,
        pass_fds: tuple[int, ...] = (),
        uid: int | None = None,
        marker: str | None = None,
        lifeline: int | None = None,
    ) -> None:
        self.uid = uid
        self.marker = marker
        self.lifeline = lifeline  # write end of the sandbox's lifeline pipe; closed by kill()
        self.started = time.perf_counter()
        # The child's stdin is a pipe whose read end we keep too (reading EOF needs only the
        # write end closed): after the run it still holds what the child did not read, so
        # :meth:`input_unread` can tell a sandbox that died before it read its code.
        self.stdin_r, stdin_w = os.pipe() if stdin is not None else (-1, -1)
        try:
            self.popen = subprocess.Popen(
                argv,
                stdin=self.stdin_r if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env={**env, "AGENTRL_SANDBOX_RUN": marker} if marker else env,
                cwd=cwd,
                start_new_session=True,  # own process group, so one killpg reaches every descendant that stays in it
                pass_fds=pass_fds,
                close_fds=True,
            )
        except BaseException:
            for fd in (self.stdin_r, stdin_w):
                if fd >= 0:
                    os.close(fd)
            raise
        self.pid = self.popen.pid
        self.capture = OutputCapture(max_chars)
        self.stdout_fd = self.popen.stdout.fileno()  # type: ignore[union-attr]
        os.set_blocking(self.stdout_fd, False)
        self.in_fd: int | None = None
        self.pending = b""
        self._close_in = False
        if stdin_w >= 0:
            self.send(stdin_w, stdin or b"", close_after=True)
        self.pidfd = os.pidfd_open(self.pid)
        self.exited = False
        self.stdout_open = True
        self.returncode: int | None = None
        self.killed = False

    def send(self, fd: int, data: bytes, close_after: bool) -> None:
        """Queue ``data`` for ``fd`` (written by :func:`pump` as the child reads it)."""
        os.set_blocking(fd, False)
        self.in_fd, self.pending, self._close_in = fd, data, close_after
        if not data:
            self.write_pending()

    def close_input(self) -> None:
        if self._close_in:
            os.close(self.in_fd)  # type: ignore[arg-type]

    def input_unread(self) -> bool:
        """Whether the child's stdin still holds (or never got) some of what was sent: a child
        that has exited without reading its code never ran it. Call before :meth:`kill`."""
        return bool(self.pending) or (self.stdin_r >= 0 and unread_bytes(self.stdin_r) > 0)

    def mark_exited(self) -> None:
        """Note the launcher's exit status *without reaping it*: while it is a zombie its pid
        (the process group id) cannot be reused, so the later killpg cannot hit a stranger."""
        if self.exited or self.pidfd < 0:
            return
        try:
            info = os.waitid(os.P_PIDFD, self.pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            info = None
        if info is None or info.si_pid == 0:
            return
        self.exited = True
        self.returncode = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status

    def kill(self) -> None:
        """SIGKILL the process group and every straggler, reap the launcher, close the pipes."""
        if not self.exited:
            self.killed = True
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.lifeline is not None:
            os.close(self.lifeline)  # the sandbox's watcher kills what the group kill missed
            self.lifeline = None
        if self.uid is not None:
            kill_uid(self.uid)
        elif self.marker is not None:
            kill_marked(self.marker)
        self.mark_exited()
        try:
            self.popen.wait(timeout=5)  # reap, only now
        except subprocess.TimeoutExpired:
            pass
        if not self.exited and self.popen.returncode is not None:
            self.exited, self.returncode = True, self.popen.returncode
        for f in (self.popen.stdin, self.popen.stdout):
            if f is not None and not f.closed:
                try:
                    f.close()
                except OSError:
                    pass
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1
        if self.stdin_r >= 0:
            os.close(self.stdin_r)
            self.stdin_r = -1
        if self._close_in and self.in_fd is not None:  # input the child never took
            os.close(self.in_fd)
            self.in_fd, self.pending = None, b""

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started


def pump(
    procs: list[SandboxProcess],
    until: Callable[[], bool],
    deadline_s: float,
    max_bytes: int,
    watch: dict[int, Callable[[], None]] | None = None,
) -> str:
    """Move bytes until ``until()`` holds ("done"), the wall clock passes ``deadline_s``
    ("timeout"), or a child's output passes ``max_bytes`` ("output"). ``watch`` maps extra
    file descriptors to callbacks run when they become readable. An exited child's pipe is
    drained of what it already holds, never waited on: an orphan may keep it open."""
    deadline = time.perf_counter() + deadline_s
    sel = selectors.DefaultSelector()
    try:
        for p in procs:
            if p.stdout_open:
                sel.register(p.stdout_fd, selectors.EVENT_READ, ("out", p))
            if p.in_fd is not None:
                sel.register(p.in_fd, selectors.EVENT_WRITE, ("in", p))
            if not p.exited:
                sel.register(p.pidfd, selectors.EVENT_READ, ("exit", p))
        for fd, fn in (watch or {}).items():
            sel.register(fd, selectors.EVENT_READ, ("watch", fn))
        while True:
            if until():
                return "done"
            if any(p.capture.total > max_bytes for p in procs):
                return "output"
            left = deadline - time.perf_counter()
            if left <= 0:
                return "timeout"
            for key, _ in sel.select(left):
                kind, obj = key.data
                if kind == "out":
                    obj.read_available()
                    if not obj.stdout_open:
                        sel.unregister(key.fd)
                elif kind == "in":
                    obj.write_pending()
                    if obj.in_fd is None:
                        sel.unregister(key.fd)
                elif kind == "exit":
                    sel.unregister(key.fd)
                    obj.mark_exited()
                    obj.read_available()
                    if obj.stdout_open:
                        sel.unregister(obj.stdout_fd)
                        obj.stdout_open = False
                else:
                    obj()
    finally:
        sel.close()


def unread_bytes(fd: int) -> int:
    """Bytes written to the pipe ``fd`` and not read yet (FIONREAD works on either end)."""
    import fcntl
    import termios

    buf = bytearray(4)
    try:
        fcntl.ioctl(fd, termios.FIONREAD, buf)
    except OSError:
        return 0
    return int.from_bytes(buf, sys.byteorder)


def kill_uid(uid: int) -> int:
    """SIGKILL every process whose owner is ``uid``; repeat until none is left (a fork bomb
    forks while being killed). Returns how many were signalled."""
    return _sweep(lambda pid: os.stat(f"/proc/{pid}").st_uid == uid and _alive(pid))


def kill_marked(marker: str) -> int:
    """SIGKILL own processes whose environment carries ``AGENTRL_SANDBOX_RUN=marker`` (best
    effort when not root: code that scrubs its environment escapes this net)."""
    needle = f"AGENTRL_SANDBOX_RUN={marker}".encode()
    uid, me = os.getuid(), os.getpid()

    def marked(pid: str) -> bool:
        if int(pid) == me or os.stat(f"/proc/{pid}").st_uid != uid or not _alive(pid):
            return False
        with open(f"/proc/{pid}/environ", "rb") as f:
            return needle in f.read()

    return _sweep(marked)


def _sweep(match: Callable[[str], bool]) -> int:
    """SIGKILL every process whose pid ``match``es, rescanning /proc until a pass finds none."""
    total = 0
    for _ in range(50):
        found = 0
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                if match(name):
                    os.kill(int(name), signal.SIGKILL)
                    found += 1
            except (OSError, ProcessLookupError):
                pass
        total += found
        if not found:
            break
        time.sleep(0.002)
    return total


def _alive(pid: str) -> bool:
    """False for zombies (already dead, waiting to be reaped by someone else)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        state = f.read().rsplit(b")", 1)[-1][1:2]
    return state not in (b"Z", b"X")
