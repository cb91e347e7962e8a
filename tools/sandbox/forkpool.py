"""Fork servers leased per pool slot: fresh-mode calls without starting an interpreter.

A call holds a pool slot, so at most ``pool.size`` servers exist per executor; an idle one is
reused, else one is started (tens of milliseconds, once). A server is replaced after
``SandboxConfig.fork_server_calls`` calls and after any anomaly (a call that had to be
stopped, a supervisor that did not report, a server found dead), so a call never lands on a
server whose state is in doubt. A server that was found dead before it took the call costs
nothing: the call is retried once on a new server. A server that dies *during* a call was
killed from outside (the code cannot signal it): the call raises :class:`agentrl.InfraError`
(``sandbox_server_died``) and the next call gets a new server; two servers in a row that
cannot take the call raise it too (``sandbox_start_failed``). :meth:`ForkServers.close` stops them all;
it runs when the executor is closed or collected and at interpreter exit, and a SIGKILLed
trainer takes them with it through their lifelines.

Example::

    from agentrl.tools.sandbox import LocalExecutor, SandboxConfig
    ex = LocalExecutor(SandboxConfig(timeout=5))          # fork_server=True by default
    assert ex.run("print(6 * 7)").output == "42\\n"
    ex.close()
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING

from agentrl.types import InfraError

from .forkserver import ForkServer, ServerLost
from .result import ExecResult

if TYPE_CHECKING:
    from .local import LocalExecutor


class ForkServers:
    """The idle servers of one executor, and every server it started."""

    def __init__(self, executor: "LocalExecutor") -> None:
        self.executor = executor
        self.max_calls = executor.config.fork_server_calls
        self._lock = threading.Lock()
        self._idle: list[ForkServer] = []
        self._live: set[ForkServer] = set()
        self.started = 0  # servers started so far (tests and benchmarks read it)
        self.replaced: list[str] = []  # why servers were replaced, oldest first
        self.closed = False
        live, lock = self._live, self._lock
        # Runs when the executor is collected, on close(), or at interpreter exit. The servers do
        # not refer back to the executor, so holding them here does not keep it alive.
        self._finalizer = weakref.finalize(self, _stop_all, live, lock)

    def run(self, code: str, uid: int | None) -> ExecResult:
        """Run ``code`` as ``uid`` in a fresh child of a leased server (the caller holds a pool slot)."""
        for attempt in (1, 2):
            server = self._take()
            try:
                outcome = server.call(code, uid)
            except ServerLost as exc:
                self._retire(server, f"found dead: {exc}")
                if attempt == 2:
                    raise InfraError(f"the sandbox fork server could not take the call, twice in a row ({exc}): "
                                     "a new server dies before its first call", cause="sandbox_start_failed") from exc
                continue
            except BaseException:
                self._retire(server, "the call raised in the trainer")
                raise
            self._give_back(server, outcome.anomaly)
            if outcome.server_died:  # retired above: the next call starts a new server
                raise InfraError(f"{outcome.server_died}; the next call starts a new one", cause="sandbox_server_died")
            return outcome.result
        raise AssertionError("unreachable")

    def _take(self) -> ForkServer:
        with self._lock:
            if self.closed:
                raise RuntimeError("this sandbox executor is closed")
            while self._idle:
                server = self._idle.pop()
                if server.alive:
                    return server
                self._live.discard(server)
                self.replaced.append("found dead while idle")
                server.stop()
        server = ForkServer(self.executor)
        with self._lock:
            self.started += 1
            self._live.add(server)
            if self.closed:  # closed while it started
                self._live.discard(server)
                server.stop()
                raise RuntimeError("this sandbox executor is closed")
        return server

    def _give_back(self, server: ForkServer, anomaly: str | None) -> None:
        if anomaly is None and server.calls >= self.max_calls:
            anomaly = f"served {server.calls} calls"
        if anomaly is not None or not server.alive:
            self._retire(server, anomaly or "died during the call")
            return
        with self._lock:
            if not self.closed:
                self._idle.append(server)
                return
        self._retire(server, "executor closed")

    def _retire(self, server: ForkServer, why: str) -> None:
        with self._lock:
            self._live.discard(server)
            if server in self._idle:
                self._idle.remove(server)
            self.replaced.append(why)
        server.stop()

    @property
    def live(self) -> list[ForkServer]:
        with self._lock:
            return list(self._live)

    def close(self) -> None:
        """Stop every server; later calls raise."""
        with self._lock:
            self.closed = True
            self._idle.clear()
        self._finalizer()


def _stop_all(live: set[ForkServer], lock: threading.Lock) -> None:
    with lock:
        servers = list(live)
        live.clear()
    for server in servers:
        try:
            server.stop()
        except Exception:  # noqa: BLE001 - at exit: stop the others regardless
            pass
