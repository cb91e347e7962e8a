"""One warm fork server (trainer side): start it inside the sandbox, hand it one call at a time,
pump the call's output until its status line, and stop it.

The server (:mod:`.serve`) is a ``child.py server`` process started through the same launch
as a fresh interpreter (bubblewrap, unshare or rlimits; lifeline pipe; parent-death signal),
so it lives inside the same namespaces and read-only root. A call is three descriptors sent
over the server's socket: a pipe carrying the code, a pipe for stdout+stderr, and a control
socket on which the call's supervisor writes one status line when the call is over. Closing
our side of the control socket is the kill (the supervisor kills the call's pid namespace);
this process dying closes it too.

The server runs as root and the code as a leased uid, so the code cannot signal it: a control
socket that closes without a status line while the server process has exited means the host
killed the server (``CallOutcome.server_died``), never the code's own doing.

Example::

    from agentrl.tools.sandbox import LocalExecutor, SandboxConfig
    from agentrl.tools.sandbox.forkserver import ForkServer
    ex = LocalExecutor(SandboxConfig(timeout=5))
    server = ForkServer(ex)
    with ex.lease_uid() as uid:
        outcome = server.call("print(6 * 7)", uid)
    assert outcome.result.output == "42\\n" and not outcome.anomaly
    server.stop()
"""

from __future__ import annotations

import marshal
import os
import select
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .capture import OutputCapture
from .isolation import _under_private_tmp, remove_tree
from .process import PipePump, kill_uid, pump
from .result import ExecResult

if TYPE_CHECKING:
    from .local import LocalExecutor

SERVER_CODE = marshal.dumps(compile(Path(__file__).with_name("serve.py").read_text(), "<sandbox-server>", "exec")).hex()
# How long a stopped call's supervisor may take to report (it kills a pid namespace: microseconds
# normally); past it the call is treated as an anomaly and its uid swept from here.
_STOP_GRACE_S = 5.0
# How long the server's launcher may take to exit once its control socket closed without a
# status (the server's death reaches bubblewrap's init, then bubblewrap: milliseconds).
_DEATH_GRACE_S = 2.0
# World-writable directories the code can write at the rlimits level (no private mounts there):
# what the call's uid left at their top level is removed after the call.
_SHARED_TMP = ("/tmp", "/dev/shm", "/var/tmp")


class ServerLost(RuntimeError):
    """The server could not take the call (it had died); nothing of the call ran."""


@dataclass(frozen=True)
class CallOutcome:
    """A call's result, and whether the server must be replaced before the next call."""

    result: ExecResult
    anomaly: str | None  # why the server is no longer trusted, or None
    server_died: str | None = None  # the server process died during the call (the host killed it): why


class ForkedCall(PipePump):
    """One call in flight, shaped for :func:`.process.pump` (``pidfd`` is the control socket:
    readable once the status line, or EOF, arrives)."""

    def __init__(self, out_fd: int, in_fd: int, ctl: socket.socket, code: bytes, max_chars: int) -> None:
        self.started = time.perf_counter()
        self.capture = OutputCapture(max_chars)
        self.stdout_fd, self.stdout_open = out_fd, True
        self.in_fd: int | None = in_fd
        self.pending = code
        self.ctl = ctl
        self.pidfd = ctl.fileno()
        self.exited = False
        self.status = b""
        os.set_blocking(out_fd, False)
        os.set_blocking(in_fd, False)
        ctl.setblocking(False)
        self.write_pending()

    def mark_exited(self) -> None:
        """Read the status line; the call is over at its newline or at EOF (then it was lost)."""
        deadline = time.monotonic() + 1.0
        while not self.exited:
            try:
                data = self.ctl.recv(64)
            except BlockingIOError:
                if not self.status or time.monotonic() > deadline:  # nothing yet, or a torn line
                    return
                time.sleep(0.001)
                continue
            except OSError:
                data = b""
            self.status += data
            self.exited = not data or self.status.endswith(b"\n")

    def stop(self) -> None:
        """Ask the supervisor to kill the call, and wait (bounded) for its report."""
        try:
            self.ctl.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self.ctl.setblocking(True)
        self.ctl.settimeout(_STOP_GRACE_S)
        try:
            while not self.exited:
                data = self.ctl.recv(64)
                self.status += data
                self.exited = not data or self.status.endswith(b"\n")
        except OSError:  # timed out: the caller sweeps the uid
            pass

    def close(self) -> None:
        for fd in (self.in_fd, self.stdout_fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.in_fd = None
        self.ctl.close()

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started


class ForkServer:
    """A started server and the calls it has taken; one call at a time (the pool leases it)."""

    def __init__(self, executor: "LocalExecutor") -> None:
        self.config, self.isolation = cfg, iso = executor.config, executor.isolation
        self.calls = 0
        namespaces = iso.level != "rlimits"
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        keep = ":".join(_under_private_tmp(iso.exposed)) if namespaces else ""
        args = ["server", "", str(theirs.fileno()), "1" if namespaces else "0", str(cfg.disk_mb << 20), keep, SERVER_CODE]
        try:
            # Started on the pool's persistent thread: the parent-death signal follows the thread.
            self.proc, self.launch = executor.pool.spawn(executor.start, args, None, None, (theirs.fileno(),), True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.sock = ours
        self.level = iso.level

    @property
    def alive(self) -> bool:
        self.proc.mark_exited()
        self.proc.read_available()  # the server prints nothing unless it fails: keep its pipe drained
        return not self.proc.exited

    def exits_within(self, seconds: float) -> bool:
        """Whether the server's launcher has exited, or does within ``seconds``."""
        deadline = time.monotonic() + seconds
        while self.alive:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            select.select([self.proc.pidfd], [], [], left)
        return True

    def call(self, code: str, uid: int | None) -> CallOutcome:
        """Run ``code`` in a fresh child of this server as ``uid``; raises :class:`ServerLost`
        when the server could not take the call."""
        cfg, iso = self.config, self.isolation
        workdir = ""
        if self.level == "rlimits":  # no private /tmp: a host directory of the call's own, as for a fresh interpreter
            workdir = _make_workdir(iso.base_dir, uid)
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        ctl, ctl_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # Without a pid namespace the call gets a lifeline of its own, watched under its uid: a
        # SIGKILLed trainer takes the server (parent-death signal) before it could end the call.
        life_r, life_w = os.pipe() if workdir else (-1, -1)
        request = f"{-1 if uid is None else uid}\0{workdir}\0{iso.limits(cfg.cpu_seconds_per_call)}".encode()
        try:
            socket.send_fds(self.sock, [request], [in_r, out_w, ctl_theirs.fileno(), *([life_r] if workdir else [])])
        except OSError as exc:
            for fd in (in_w, out_r, life_w):
                if fd >= 0:
                    os.close(fd)
            ctl.close()
            if workdir:
                remove_tree(workdir)
            raise ServerLost(str(exc)) from exc
        finally:
            for fd in (in_r, out_w, life_r):
                if fd >= 0:
                    os.close(fd)
            ctl_theirs.close()
        self.calls += 1
        call = ForkedCall(out_r, in_w, ctl, code.encode("utf-8", "surrogatepass"), cfg.max_output_chars)
        reason = "error"
        try:
            reason = pump([call], lambda: call.exited, cfg.timeout, cfg.max_output_bytes)  # type: ignore[list-item]
        finally:
            if reason != "done":
                call.stop()
            call.read_available()
            call.close()
            if life_w >= 0:
                os.close(life_w)  # the call's watcher kills what its uid left running
            anomaly = _status_anomaly(call.status, reason)
            if uid is not None and anomaly:
                kill_uid(uid)  # the server did not vouch that nothing of the call is left
            if workdir:
                remove_tree(workdir)
                _remove_owned(uid)
        why = None
        # No status line: the server died (the host's doing), or it is alive and withheld the
        # status because the call's processes would not die (the call's doing).
        if reason == "done" and not call.status.endswith(b"\n") and self.exits_within(_DEATH_GRACE_S):
            why = ("the sandbox's fork server died while the code ran: killed from outside (the code runs as "
                   f"another uid and cannot signal it; launcher status {self.proc.returncode})")
        return CallOutcome(_result(call, reason, cfg.timeout, cfg.max_output_bytes), anomaly, why)

    def stop(self) -> None:
        """Close the socket (the server exits on its own, normally within milliseconds), then
        kill whatever is left of its sandbox."""
        self.sock.close()
        deadline = time.monotonic() + _STOP_GRACE_S / 5
        while not self.proc.exited and time.monotonic() < deadline:
            select.select([self.proc.pidfd], [], [], max(0.0, deadline - time.monotonic()))
            self.proc.mark_exited()
        self.proc.kill()
        self.isolation.cleanup(self.launch)


def _status_anomaly(status: bytes, reason: str) -> str | None:
    """Why the server can no longer be trusted after this call, if it cannot."""
    if not status.endswith(b"\n"):
        return "the call's supervisor did not report (the server or the call was lost)"
    if reason != "done":
        return f"the call was stopped ({reason})"  # conservative: a fresh server after any kill
    return None


def _result(call: ForkedCall, reason: str, timeout_s: float, max_bytes: int) -> ExecResult:
    kind, _, value = call.status.decode(errors="replace").strip().partition(" ")
    lost = reason == "done" and kind not in ("x", "s")
    code: int | None = None
    if reason == "done" and kind == "x":
        code = int(value)
    elif reason == "done" and kind == "s":
        code = -int(value)
    return ExecResult(
        output=call.capture.text(), exit_code=code, timed_out=reason == "timeout",
        output_limited=reason == "output", duration_s=call.elapsed, timeout_s=timeout_s,
        max_output_bytes=max_bytes, truncated=call.capture.cut > 0, server_lost=lost,
    )


def _make_workdir(base_dir: str | None, uid: int | None) -> str:
    import tempfile

    workdir = tempfile.mkdtemp(prefix="run-", dir=base_dir)
    if uid is not None:
        os.chown(workdir, uid, uid)
    return workdir


def _remove_owned(uid: int | None) -> None:
    """Remove what ``uid`` left at the top of the shared temporary directories (rlimits level)."""
    if uid is None:
        return
    for top in _SHARED_TMP:
        try:
            names = os.listdir(top)
        except OSError:
            continue
        for name in names:
            path = os.path.join(top, name)
            try:
                if os.lstat(path).st_uid == uid:
                    remove_tree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
            except OSError:
                pass

