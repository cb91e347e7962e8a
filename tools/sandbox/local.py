"""The local backend: run Python code in a fresh sandboxed interpreter, or open a stateful session.

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
        if self.isolation.leases is None:
            yield None
            return
        with self.isolation.leases.lease(reuse) as uid:
            yield uid

    def start(self, child_args: list[str], uid: int | None, stdin: bytes | None, pass_fds: tuple[int, ...] = (),
              server: bool = False) -> tuple[SandboxProcess, Launch]:
        """Launch ``child.py`` with ``child_args`` in the sandbox (the caller must :meth:`finish` it).

        The child gets the read end of a lifeline pipe whose write end only this process holds
        (closed by :meth:`SandboxProcess.kill`, or by the kernel when this process dies): its
        watcher then kills the whole sandbox (see ``child.guard``)."""
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
        """Kill what is left of a run, clean its directory, and describe it."""
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
        )

    def run(self, code: str) -> ExecResult:
        """Run ``code`` in a fresh process and wait (blocking; bounded by the pool and timeout):
        a child forked from a warm server (:mod:`.forkpool`), or a new interpreter when the
        fork server is off or not available here."""
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
            return result

    async def arun(self, code: str) -> ExecResult:
        """:meth:`run` without blocking the event loop."""
        return await self.pool.call(self.run, code)

    def session(self) -> "StatefulWorker":
        """A stateful interpreter (started on first use); close it when the trajectory ends."""
        from .worker import StatefulWorker

        return StatefulWorker(self)
