"""The threads that run synchronous tools: reused when idle, never shared with a hung call.

A sync tool cannot be interrupted (Python cannot kill a thread), so a call that times out keeps
its thread busy. A fixed pool would then fill with hung calls and make every later call time out
while queued; a fresh thread per call avoids that but pays a thread start per call, a
noticeable part of a ~1 ms search query. Here a call takes an idle worker or starts a new one, and a
worker goes back to the idle list only when its call returns: a hung call keeps its own thread
and nothing else waits for it. Workers idle for ``IDLE_S`` seconds exit.

:func:`call_in_worker` is the one hand-off the ToolBox uses per sync call: a single future the
worker fills and a timer expires. It makes no task and no ``asyncio.wait``: those cost about as
much again as the hand-off itself (~30 us each per call on the 2-core test machine).

    >>> import threading
    >>> done = threading.Event()
    >>> WORKERS.submit(done.set)
    >>> done.wait(5)
    True
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
from collections.abc import Callable
from typing import Any

IDLE_S = 30.0


class ToolTimeout(Exception):
    """A tool ran past its time limit (internal; the ToolBox turns it into a ``timeout`` result)."""


class _Worker:
    def __init__(self, pool: "ToolThreads") -> None:
        self.pool = pool
        self.jobs: queue.SimpleQueue[tuple[Callable[[], None], Callable[[], None] | None]] = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="agentrl-tool", daemon=True).start()

    def _loop(self) -> None:
        while True:
            try:
                job, after = self.jobs.get(timeout=self.pool.idle_s)
            except queue.Empty:
                if self.pool.retire(self):
                    return
                continue  # handed a job just as it timed out: take it
            job()
            self.pool.release(self)
            if after is not None:
                after()


class ToolThreads:
    """Run jobs on reusable daemon threads; a busy worker is never given a second job.

    ``started`` counts the threads ever started, so tests can check that calls reuse them.
    """

    def __init__(self, idle_s: float = IDLE_S) -> None:
        self.idle_s = idle_s
        self.started = 0
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()

    def submit(self, job: Callable[[], None], after: Callable[[], None] | None = None) -> None:
        """Start ``job`` now on an idle worker or a new one (never queued behind another job).

        ``after`` runs on the same thread once the worker is back on the idle list. Waking the
        caller there, not in ``job``, matters: a caller that submits its next call at once
        would otherwise find no idle worker and start a thread.
        """
        with self._lock:
            worker = self._idle.pop() if self._idle else None
            self.started += worker is None
        (worker or _Worker(self)).jobs.put((job, after))

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


async def call_in_worker(fn: Callable[..., Any], kwargs: dict[str, Any], timeout: float | None) -> Any:
    """``fn(**kwargs)`` on a worker thread, in a copy of the caller's context variables.

    Raises :class:`ToolTimeout` after ``timeout`` seconds (None: no limit); the worker is then
    abandoned to finish on its own and its result dropped, as it is when the caller is
    cancelled. A ``BaseException`` such as ``SystemExit`` comes back as a RuntimeError: raised
    in a thread it would otherwise vanish, and on the event loop it would stop every rollout.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    ctx = contextvars.copy_context()
    outcome: list[Any] = []  # [ok, value], written by the worker before `after` reads it

    def deliver() -> None:
        if not future.done():  # else timed out or cancelled meanwhile
            ok, value = outcome
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

    def job() -> None:
        try:
            outcome[:] = True, ctx.run(fn, **kwargs)
        except Exception as exc:
            outcome[:] = False, exc
        except BaseException as exc:
            outcome[:] = False, RuntimeError(f"tool exited with {type(exc).__name__}: {exc}")

    def after() -> None:
        try:
            loop.call_soon_threadsafe(deliver)
        except RuntimeError:
            pass  # the event loop is closed: nobody is waiting any more

    # The timer before the hand-off: the woken worker needs the GIL, which this thread holds
    # until the loop goes idle.
    timer = None if timeout is None else loop.call_later(timeout, _expire, future)
    try:
        WORKERS.submit(job, after)
        return await future
    finally:
        if timer is not None:
            timer.cancel()


def _expire(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_exception(ToolTimeout())
