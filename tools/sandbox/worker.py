"""A stateful interpreter for one trajectory: variables persist across calls, like a notebook.

The worker is a sandboxed ``child.py worker`` process with its own uid and private /tmp.
Cells go down a command pipe; the worker runs each in one persistent globals dict and writes
one byte on a result pipe when done (its output went to stdout before that byte, so the parent
drains the output pipe and has everything). A timeout kills the worker (the code may ignore
every signal); the next call starts a new one and says the state was lost. Nothing is shared
between trajectories: each has its own worker process, uid and /tmp.

The code runs in the worker itself, so the worker ending (``os._exit``, a signal it sent
itself, a thread it left behind) is the code's outcome, told to the model. Two endings are
not, and raise :class:`agentrl.InfraError`: its launcher, which the code cannot signal, died
of a signal (``sandbox_killed``; not ``retryable`` when the session's variables died with it,
so only the attempt can run again), and a new worker died before it read its first cell
(``sandbox_start_failed``, retryable: no code of the model ever ran in it, nothing was lost).
Either way the next call starts a new worker.

Example::

    from agentrl.tools.sandbox import LocalExecutor
    with LocalExecutor().session() as s:
        s.run("import math; r = 2")
        assert s.run("print(math.pi * r)").output.startswith("6.28")
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from agentrl.types import InfraError

from .capture import OutputCapture
from .local import killed_from_outside, printed, start_failed
from .process import SandboxProcess, pump, unread_bytes
from .result import ExecResult, exit_status

if TYPE_CHECKING:
    from .isolation import Launch
    from .local import LocalExecutor


class StatefulWorker:
    """One per trajectory. Thread-safe: calls of one trajectory run one at a time."""

    def __init__(self, executor: "LocalExecutor") -> None:
        self.executor = executor
        self._lock = threading.Lock()
        self._proc: SandboxProcess | None = None
        self._launch: "Launch | None" = None
        self._lease: tuple[int, int] | None = None
        self._cmd_w = -1
        self._res_r = -1
        self._lost_state = False  # a previous worker of this session died; tell the model once
        self.closed = False

    def __enter__(self) -> "StatefulWorker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        return self._proc is not None and not self._proc.exited

    def _start(self) -> None:
        ex = self.executor
        self._lease = ex.acquire_uid() if ex.isolation.leases else None
        cmd_r = res_w = -1
        try:
            cmd_r, self._cmd_w = os.pipe()
            self._res_r, res_w = os.pipe()
            limits = ex.isolation.limits(ex.config.cpu_seconds_per_worker)
            args = ["worker", limits, str(cmd_r), str(res_w)]
            uid = self._lease[0] if self._lease else None
            self._proc, self._launch = ex.pool.spawn(ex.start, args, uid, None, (cmd_r, res_w))
        except BaseException:
            self._stop()
            raise
        finally:
            for fd in (cmd_r, res_w):
                if fd >= 0:
                    os.close(fd)
        os.set_blocking(self._res_r, False)

    def run(self, code: str) -> ExecResult:
        """Run one cell in this trajectory's interpreter (blocking). Raises :class:`InfraError`
        when the host failed it (see the module docstring)."""
        with self._lock:
            if self.closed:
                raise RuntimeError("this python session is closed (its trajectory ended)")
            had_state = self._proc is not None  # an interpreter holding the session's variables
            try:
                with self.executor.pool.slot():
                    return self._run_locked(code)
            except OSError as exc:  # the trainer's side ran out of descriptors, memory...
                self._stop()  # in doubt mid-protocol: a new worker next time
                self._lost_state = self._lost_state or had_state
                raise start_failed(exc, retryable=not had_state) from exc

    async def arun(self, code: str) -> ExecResult:
        return await self.executor.pool.call(self.run, code)

    def _run_locked(self, code: str) -> ExecResult:
        cfg = self.executor.config
        if self._proc is not None:
            self._proc.mark_exited()  # one waitid: did the interpreter die since the last call?
            if self._proc.exited:
                self._lost_between_calls()
        fresh = self._proc is None
        lost_before = self._lost_state  # what the model has yet to be told, whatever this call does
        if fresh:
            self._start()
        proc = self._proc
        assert proc is not None
        proc.capture = OutputCapture(cfg.max_output_chars)  # a fresh capture per cell
        frame = code.encode("utf-8", "surrogatepass")
        proc.send(self._cmd_w, len(frame).to_bytes(4, "big") + frame, close_after=False)
        done: list[bytes] = []

        def finished() -> None:
            try:
                data = os.read(self._res_r, 1)
            except BlockingIOError:
                return
            if data:
                done.append(data)

        started = proc.elapsed
        reason = pump([proc], lambda: bool(done) or proc.exited, cfg.timeout, cfg.max_output_bytes, watch={self._res_r: finished})
        proc.read_available()
        unsent = bool(proc.pending)
        proc.pending, proc.in_fd = b"", None
        died = reason == "done" and not done
        result = ExecResult(
            output=proc.capture.text(),
            exit_code=0 if done else None,
            timed_out=reason == "timeout",
            output_limited=reason == "output",
            duration_s=proc.elapsed - started,
            timeout_s=cfg.timeout,
            max_output_bytes=cfg.max_output_bytes,
            truncated=proc.capture.cut > 0,
            restarted=self._lost_state,
        )
        self._lost_state = False
        if reason != "done" or died or unsent:
            fault = None
            if died:
                assert self._launch is not None
                result.exit_code, result.worker_exited = exit_status(proc.returncode, self._launch.own_pid_namespace), True
                fault = self._fault(proc, self._launch, fresh, fresh and (unsent or unread_bytes(self._cmd_w) > 0), result)
            self._stop()
            # A worker that never read the cell lost nothing; the call runs again on a new one.
            self._lost_state = lost_before if fault is not None and fault.retryable else True
            if fault is not None:
                raise fault
        return result

    def _fault(self, proc: SandboxProcess, launch: "Launch", fresh: bool, unread: bool,
               result: ExecResult) -> InfraError | None:
        """The infrastructure failure behind a worker that died during a call, if it was one
        (``fresh``: the worker was started for this call, so it held none of the session's state)."""
        if killed_from_outside(proc, launch):
            gone = "it held no earlier state" if fresh else "its variables are gone"
            return InfraError(f"the stateful interpreter was killed from outside while the code ran (its launcher "
                              f"got signal {-(proc.returncode or 0)}); {gone} and the next call starts a new one",
                              cause="sandbox_killed", retryable=fresh)
        if unread:  # a new worker that never read the cell: nothing of the model ran in it
            return InfraError(f"the stateful interpreter exited before it read the code (status {result.exit_code}"
                              f"{printed(result.output)}); the sandbox cannot start here", cause="sandbox_start_failed")
        return None

    def _lost_between_calls(self) -> None:
        """The interpreter died while no call ran: start over, telling the model its state is
        gone; raise :class:`InfraError` when the host killed it (a thread the code left behind
        may have ended it too: that is the code's doing)."""
        proc, launch = self._proc, self._launch
        killed = proc is not None and launch is not None and killed_from_outside(proc, launch)
        status = None if proc is None else proc.returncode
        self._stop()
        self._lost_state = True
        if killed:
            raise InfraError(f"the stateful interpreter was killed from outside between calls (its launcher got "
                             f"signal {-(status or 0)}); its variables are gone and the next call starts a new one",
                             cause="sandbox_killed", retryable=False)

    def _stop(self) -> None:
        if self._proc is not None and self._launch is not None:
            self._proc.kill()
            self.executor.isolation.cleanup(self._launch)
        self._proc = self._launch = None
        for fd in (self._cmd_w, self._res_r):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._cmd_w = self._res_r = -1
        if self._lease is not None and self.executor.isolation.leases is not None:
            self.executor.isolation.leases.release(*self._lease)
        self._lease = None

    def close(self) -> None:
        """Kill the interpreter and free its uid; later calls raise."""
        with self._lock:
            self.closed = True
            self._stop()

