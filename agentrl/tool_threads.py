"""The threads that run synchronous tools: reused when idle, never shared with a hung call.

A sync tool cannot be interrupted (Python cannot kill a thread), so a call that times out keeps
its thread busy. A fixed pool would then fill with hung calls and make every later call time out
while queued; a fresh thread per call avoids that but pays a thread start (~0.4 ms) per call,
more than a search query costs. Here a call takes an idle worker or starts a new one, and a
worker goes back to the idle list only when its call returns: a hung call keeps its own thread
and nothing else waits for it. Workers idle for ``IDLE_S`` seconds exit.

    >>> import threading
    >>> done = threading.Event()
    >>> WORKERS.submit(done.set)
    >>> done.wait(5)
    True
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

IDLE_S = 30.0


class _Worker:
    def __init__(self, pool: "ToolThreads") -> None:
        self.pool = pool
        self.jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="agentrl-tool", daemon=True).start()

    def _loop(self) -> None:
        while True:
            try:
                job = self.jobs.get(timeout=self.pool.idle_s)
            except queue.Empty:
                if self.pool.retire(self):
                    return
                continue  # handed a job just as it timed out: take it
            job()
            self.pool.release(self)


class ToolThreads:
    """Run jobs on reusable daemon threads; a busy worker is never given a second job."""

    def __init__(self, idle_s: float = IDLE_S) -> None:
        self.idle_s = idle_s
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()

    def submit(self, job: Callable[[], None]) -> None:
        """Start ``job`` now on an idle worker or a new one (never queued behind another job)."""
        with self._lock:
            worker = self._idle.pop() if self._idle else None
        (worker or _Worker(self)).jobs.put(job)

    def release(self, worker: _Worker) -> None:
        with self._lock:
            self._idle.append(worker)

    def retire(self, worker: _Worker) -> bool:
        """Whether an idle-timed-out worker may exit (False: it was just handed a job)."""
        with self._lock:
            if worker in self._idle:
                self._idle.remove(worker)
                return True
            return False

    @property
    def idle(self) -> int:
        with self._lock:
            return len(self._idle)


WORKERS = ToolThreads()
