"""A stateful interpreter for one trajectory: variables persist across calls, like a notebook.

The worker is a sandboxed ``child.py worker`` process with its own uid and private /tmp.
Cells go down a command pipe; the worker runs each in one persistent globals dict and writes
one byte on a result pipe when done (its output went to stdout before that byte, so the parent
drains the output pipe and has everything). A timeout kills the worker (the code may ignore
every signal); the next call starts a new one and says the state was lost. Nothing is shared
between trajectories: each has its own worker process, uid and /tmp.

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

from .capture import OutputCapture
from .process import SandboxProcess, pump
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
        leases = ex.isolation.leases
        self._lease = leases.acquire() if leases else None
        cmd_r, self._cmd_w = os.pipe()
        self._res_r, res_w = os.pipe()
        try:
            limits = ex.isolation.limits(ex.config.cpu_seconds_per_worker)
            args = ["worker", limits, str(cmd_r), str(res_w)]
            uid = self._lease[0] if self._lease else None
            self._proc, self._launch = ex.pool.spawn(ex.start, args, uid, None, (cmd_r, res_w))
        except BaseException:
            self._stop()
            raise
        finally:
            os.close(cmd_r)
            os.close(res_w)
        os.set_blocking(self._res_r, False)

    def run(self, code: str) -> ExecResult:
        """Run one cell in this trajectory's interpreter (blocking)."""
        with self._lock:
            if self.closed:
                raise RuntimeError("this python session is closed (its trajectory ended)")
            with self.executor.pool.slot():
                return self._run_locked(code)

    async def arun(self, code: str) -> ExecResult:
        return await self.executor.pool.call(self.run, code)

    def _run_locked(self, code: str) -> ExecResult:
        cfg = self.executor.config
        if not self.alive:
            self._stop()
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
            if died:
                wrapped = self._launch is not None and self._launch.own_pid_namespace
                result.exit_code, result.worker_exited = exit_status(proc.returncode, wrapped), True
            self._stop()
            self._lost_state = True
        return result

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
