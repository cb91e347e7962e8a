"""The local backend: run Python code in a fresh sandboxed interpreter, or open a stateful session.

What the code does is the model's outcome, described by the :class:`ExecResult` (it raised, ran
past the time limit, printed too much, exited, killed its own process). What the host does to
the sandbox raises :class:`agentrl.InfraError` instead, so it is never scored as the model's
failure: a sandbox that could not start (``sandbox_start_failed``: no file descriptors,
processes or free sandbox uid, or it exited before it read the code, so none of the code ran),
and a sandbox killed from outside mid-call (``sandbox_killed``: its launcher, which the code
cannot signal, died of a signal; the fork server's faults are in :mod:`.forkpool`, the
stateful interpreter's in :mod:`.worker`). The next call starts a new sandbox. A fresh call keeps nothing, so these are ``retryable``:
the ToolBox runs the same call again in place.

Example::

    from agentrl.tools.sandbox import LocalExecutor, SandboxConfig
    ex = LocalExecutor(SandboxConfig(timeout=5))
    assert ex.run("print(6 * 7)").output == "42\\n"
    with ex.session() as s:
        s.run("x = 2")
        assert s.run("x + 1").output == "3\\n"
"""

from __future__ import annotations

import os
import secrets
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

from agentrl.types import InfraError

from .config import SandboxConfig
from .forkpool import ForkServers
from .isolation import Isolation, Launch
from .pool import ExecPool, shared_pool
from .process import SandboxProcess, pump
from .result import ExecResult, exit_status

if TYPE_CHECKING:
    from .worker import StatefulWorker


class LocalExecutor:
    """Sandboxed local runs under one configuration; ``isolation_level`` says how strongly."""

    def __init__(self, config: SandboxConfig | None = None, pool: ExecPool | None = None) -> None:
        self.config = config or SandboxConfig()
        self.isolation = Isolation.for_config(self.config)
        self.pool = pool or shared_pool(self.config.max_concurrency)
        # Fresh-mode calls fork from warm servers where every call can have a uid of its own.
        self.forkservers: ForkServers | None = None
        if self.config.fork_server and self.isolation.leases is not None:
            self.forkservers = ForkServers(self)

    @property
    def uses_fork_server(self) -> bool:
        return self.forkservers is not None

    def close(self) -> None:
        """Stop this executor's fork servers (also done when it is collected, and at exit)."""
        if self.forkservers is not None:
            self.forkservers.close()

    @property
    def isolation_level(self) -> str:
        return self.isolation.level

    @contextmanager
    def lease_uid(self, reuse: bool = False) -> Iterator[int | None]:
        """An unprivileged uid of its own for one sandbox (None when not root); ``reuse``: see
        :meth:`.uids.UidLeases.acquire`."""
        leases = self.isolation.leases
        if leases is None:
            yield None
            return
        uid, fd = self.acquire_uid(reuse)
        try:
            yield uid
        finally:
            leases.release(uid, fd)

    def acquire_uid(self, reuse: bool = False) -> tuple[int, int]:
        """Lease a uid (``(uid, lock_fd)``, release with ``isolation.leases.release``); raises
        :class:`InfraError` when none can be had (all in use, or no descriptor for its lock)."""
        assert self.isolation.leases is not None
        try:
            return self.isolation.leases.acquire(reuse)
        except (OSError, RuntimeError) as exc:
            raise InfraError(f"no sandbox uid could be leased: {exc}", cause="sandbox_start_failed") from exc

    def start(self, child_args: list[str], uid: int | None, stdin: bytes | None, pass_fds: tuple[int, ...] = (),
              server: bool = False) -> tuple[SandboxProcess, Launch]:
        """Launch ``child.py`` with ``child_args`` in the sandbox (the caller must :meth:`finish` it).

        The child gets the read end of a lifeline pipe whose write end only this process holds
        (closed by :meth:`SandboxProcess.kill`, or by the kernel when this process dies): its
        watcher then kills the whole sandbox (see ``child.guard``). Raises :class:`InfraError`
        when the host cannot start it (no descriptors, processes or memory left)."""
        try:
            return self._start(child_args, uid, stdin, pass_fds, server)
        except OSError as exc:
            raise start_failed(exc) from exc

    def _start(self, child_args: list[str], uid: int | None, stdin: bytes | None, pass_fds: tuple[int, ...],
               server: bool) -> tuple[SandboxProcess, Launch]:
        life_r, life_w = os.pipe()
        # kill(-1) reaches exactly the sandbox in its own pid namespace or under its leased uid;
        # otherwise (rlimits level, not root) the watcher kills its process group only.
        scope = "all" if (uid is not None or self.isolation.level != "rlimits") else "group"
        detach = ":detach" if server else ""  # a fork server counts its children: the watcher is not one
        child_args = [child_args[0], f"{child_args[1]},LIFE={life_r}:{scope}{detach}", *child_args[2:]]
        try:
            launch = self.isolation.launch(child_args, uid, server)
            marker = None if (uid is not None or launch.own_pid_namespace) else secrets.token_hex(8)
            try:
                proc = SandboxProcess(
                    launch.argv, launch.env, launch.cwd, self.config.max_output_chars,
                    stdin=stdin, pass_fds=(*pass_fds, life_r), uid=None if launch.own_pid_namespace else uid,
                    marker=marker, lifeline=life_w,
                )
            except BaseException:
                self.isolation.cleanup(launch)
                raise
        except BaseException:
            os.close(life_w)
            raise
        finally:
            os.close(life_r)
        return proc, launch

    def finish(self, proc: SandboxProcess, launch: Launch, reason: str, timeout_s: float) -> ExecResult:
        """Kill what is left of a run, clean its directory, and describe it (``unstarted``: it
        exited before it read its input, so nothing of the code ran: a launch that failed)."""
        unstarted = reason == "done" and proc.returncode != 0 and proc.input_unread()
        proc.kill()
        self.isolation.cleanup(launch)
        cap = proc.capture
        return ExecResult(
            output=cap.text(),
            exit_code=None if reason != "done" else exit_status(proc.returncode, wrapped=launch.own_pid_namespace),
            timed_out=reason == "timeout",
            output_limited=reason == "output",
            duration_s=proc.elapsed,
            timeout_s=timeout_s,
            max_output_bytes=self.config.max_output_bytes,
            truncated=cap.cut > 0,
            unstarted=unstarted,
        )

    def run(self, code: str) -> ExecResult:
        """Run ``code`` in a fresh process and wait (blocking; bounded by the pool and timeout):
        a child forked from a warm server (:mod:`.forkpool`), or a new interpreter when the
        fork server is off or not available here. Raises :class:`InfraError` when the host
        failed the call (see the module docstring)."""
        try:
            return self._run(code)
        except OSError as exc:  # the trainer's side of the call ran out of descriptors, memory...
            raise start_failed(exc) from exc

    def _run(self, code: str) -> ExecResult:
        cfg = self.config
        with self.pool.slot(), self.lease_uid(reuse=self.forkservers is not None) as uid:
            if self.forkservers is not None:
                return self.forkservers.run(code, uid)
            proc, launch = self.start(["run", self.isolation.limits(cfg.cpu_seconds_per_call)], uid, code.encode("utf-8", "surrogatepass"))
            reason = "error"
            try:
                reason = pump([proc], lambda: proc.exited, cfg.timeout, cfg.max_output_bytes)
            finally:
                result = self.finish(proc, launch, reason, cfg.timeout)
            if result.unstarted:
                raise InfraError(f"the sandbox exited before it read the code (status {result.exit_code}"
                                 f"{printed(result.output)}); it cannot start here", cause="sandbox_start_failed")
            if reason == "done" and killed_from_outside(proc, launch):
                raise InfraError(f"the sandbox was killed from outside while the code ran (its launcher got signal "
                                 f"{-(proc.returncode or 0)}); the next call starts a new one", cause="sandbox_killed")
            return result

    async def arun(self, code: str) -> ExecResult:
        """:meth:`run` without blocking the event loop."""
        return await self.pool.call(self.run, code)

    def session(self) -> "StatefulWorker":
        """A stateful interpreter (started on first use); close it when the trajectory ends."""
        from .worker import StatefulWorker

        return StatefulWorker(self)


def killed_from_outside(proc: SandboxProcess, launch: Launch) -> bool:
    """Whether the sandbox's launcher itself died of a signal. With a pid namespace the code
    runs under a launcher (bubblewrap, unshare + sh) that it cannot signal: another uid, outside
    its namespace. Code that kills itself (``os.kill(os.getpid(), 9)``, ``os.killpg(0, 9)``)
    makes the launcher *exit* with 128 + N instead. Without a launcher (rlimits level) the two
    cannot be told apart, and the death counts as the code's own."""
    return launch.own_pid_namespace and proc.returncode is not None and proc.returncode < 0


def printed(output: str) -> str:
    """What a sandbox that failed to start printed (the launcher's error), for a message."""
    text = " ".join(output.split())
    return f"; it printed: {text[-300:]}" if text else ""


def start_failed(exc: OSError, retryable: bool = True) -> InfraError:
    """The error for a sandbox the host could not start or serve (``sandbox_start_failed``)."""
    return InfraError(f"the host could not start or serve the sandbox ({type(exc).__name__}: {exc}); "
                      "free descriptors, processes or memory on this machine", cause="sandbox_start_failed",
                      retryable=retryable)
