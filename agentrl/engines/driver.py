"""Requests from any event loop, served by one engine thread: the plumbing the continuously
batched engines share (``continuous.py`` for the HF engine, ``vllm_stepper.py`` for vLLM).

A request is queued with the future its caller awaits (on the caller's own loop). One daemon
thread runs ``serve()`` while anything is queued; ``serve`` takes the queue (``take``) as
often as it likes and returns when nothing is queued or running. Results go back to each
request's loop thread-safely; an exception out of ``serve`` fails every request it had taken
or left queued, so no caller hangs. The thread ends after ``idle_exit_s`` without work.

At interpreter exit every driver is closed and joined (``atexit``): ``serve`` sees ``closing``
and returns at its next step. Without that, a daemon thread still inside a torch call when
the interpreter finalizes is killed as it takes the GIL back, and the process aborts
("terminate called without an active exception", exit status 134) after a script that
ended with requests in flight.
"""

from __future__ import annotations

import asyncio
import atexit
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass

_LIVE: "weakref.WeakSet[DriverThread]" = weakref.WeakSet()
CLOSE_TIMEOUT_S = 30.0  # at exit, how long one driver may take to finish its current step


@dataclass
class BatcherStats:
    """What an engine's driver did since the engine was created (monotone counters)."""

    steps: int = 0  # engine steps (each samples one token for every running request)
    busy_s: float = 0.0  # seconds the driver computed (prefill, sampling, decode steps)
    admitted: int = 0  # requests that joined a running batch or started one
    joins: int = 0  # admissions while other requests were running
    max_rows: int = 0  # the most requests it ran at once


@dataclass
class Pending:
    """The awaiting side of one request."""

    future: asyncio.Future
    loop: asyncio.AbstractEventLoop

    @property
    def cancelled(self) -> bool:
        return self.future.cancelled()

    def notify(self, callback: Callable[..., None], *args) -> None:
        """Call ``callback(*args)`` on the requester's loop, from any thread (before a later
        ``resolve``: the loop runs its callbacks in order)."""
        try:
            self.loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # that loop is closed: nobody listens any more
            pass

    def resolve(self, result=None, error: BaseException | None = None) -> None:
        """Set the result (or the error) on the requester's loop; from any thread."""

        def settle() -> None:
            if self.future.done():  # cancelled meanwhile
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)

        try:
            self.loop.call_soon_threadsafe(settle)
        except RuntimeError:  # that loop is closed: nobody waits any more
            pass


class DriverThread:
    """One thread serving queued requests (see the module docstring).

    ``serve()`` does the work; after it raised, ``in_flight()`` returns (and forgets) the
    requests it held, which are failed with its error.
    Requests are any objects with a ``pending: Pending`` attribute.
    """

    def __init__(self, name: str, serve: Callable[[], None], in_flight: Callable[[], list],
                 idle_exit_s: float = 2.0):
        self.name, self.serve, self.in_flight, self.idle_exit_s = name, serve, in_flight, idle_exit_s
        self._queue: list = []
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self.closing = False  # set at interpreter exit: serve() returns at its next step
        _LIVE.add(self)

    @property
    def idle(self) -> bool:
        with self._cond:
            return self._thread is None and not self._queue

    @property
    def queued(self) -> bool:
        return bool(self._queue)

    def pending(self) -> Pending:
        """A ``Pending`` on the calling coroutine's loop."""
        loop = asyncio.get_running_loop()
        return Pending(loop.create_future(), loop)

    async def submit(self, request):
        """Queue ``request`` and await its result."""
        with self._cond:
            self._queue.append(request)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._cond.notify()
        return await request.pending.future

    def take(self) -> list:
        """Everything queued (requests whose caller gave up are dropped)."""
        with self._cond:
            out, self._queue = [r for r in self._queue if not r.pending.cancelled], []
        return out

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Stop serving: the thread leaves its busy period at the next step and exits; requests
        still queued or running are failed. Called for every driver at interpreter exit."""
        with self._cond:
            self.closing = True
            thread = self._thread
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                ready = self._cond.wait_for(lambda: self._queue or self.closing, timeout=self.idle_exit_s)
                if not ready or self.closing:
                    self._thread = None
                    failed, self._queue = self._queue, []
                    break
            try:
                self.serve()
            except BaseException as err:  # fail every waiter rather than hang them
                with self._cond:
                    failed, self._queue = list(self.in_flight()) + self._queue, []
                for r in failed:
                    r.pending.resolve(error=err)
        for r in failed + (list(self.in_flight()) if self.closing else []):
            r.pending.resolve(error=RuntimeError("the engine's driver thread was closed (interpreter exit)"))


@atexit.register
def _close_all() -> None:
    for driver in list(_LIVE):
        driver.close()
