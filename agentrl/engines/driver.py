"""Requests from any event loop, served by one engine thread: the plumbing the continuously
batched engines share (``continuous.py`` for the HF engine, ``vllm_stepper.py`` for vLLM).

A request is queued with the future its caller awaits (on the caller's own loop). One daemon
thread runs ``serve()`` while anything is queued; ``serve`` takes the queue (``take``) as
often as it likes and returns when nothing is queued or running. Results go back to each
request's loop thread-safely; an exception out of ``serve`` fails every request it had taken
or left queued, so no caller hangs. The thread ends after ``idle_exit_s`` without work.

``run_hosted(coro)`` runs a coroutine (a rollout's attempts) on a helper thread while the
*calling* thread serves every driver meanwhile, instead of a thread of each driver's own. The
reason is OpenMP: torch's libgomp gives each thread that runs parallel regions a pool of its
own, and once the pools' threads outnumber the cores (the trainer's main thread has one, a
driver thread a second), every worker sleeps on a futex between regions ("throttled"
spinning), so each parallel op pays a wake-up: on 2 cores a SmolLM2 decode step of 64 rows
took 125 ms on a driver thread against 78 ms on the main thread (benchmarks/README.md). The
rollout's own thread runs no parallel torch op (templates, parsing, tools), so it adds no pool.

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
HOST_WAKE_S = 0.1  # how often a host waiting for requests checks for an interrupt


@dataclass
class BatcherStats:
    """What an engine's driver did since the engine was created (monotone counters)."""

    steps: int = 0  # engine steps (each samples one token for every running request)
    busy_s: float = 0.0  # seconds the driver computed (prefill, sampling, decode steps)
    admit_s: float = 0.0  # of which: admitting requests (their prefill, the join)
    step_s: float = 0.0  # of which: the decode steps' forward passes
    copy_s: float = 0.0  # of admit_s and busy_s: copying the running KV cache (joins, compactions)
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
        return bool(self._queue) and not self._yielding()

    def _yielding(self) -> bool:
        """A host serves from now on: this driver's own thread finishes its rows but takes no
        new request, then exits and hands the queue over (``_run``)."""
        return _host is not None and threading.current_thread().name == self.name

    def pending(self) -> Pending:
        """A ``Pending`` on the calling coroutine's loop."""
        loop = asyncio.get_running_loop()
        return Pending(loop.create_future(), loop)

    async def submit(self, request):
        """Queue ``request`` and await its result."""
        with self._cond:
            self._queue.append(request)
            host = _host
            if host is None:
                self._start_thread()
            self._cond.notify()
        if host is not None:
            host.wake(self)
        return await request.pending.future

    def _start_thread(self) -> None:
        """(Holding ``_cond``.) A thread of its own for queued work, unless it has one."""
        if self._thread is None and (self._queue or self.closing):
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    def _busy_period(self) -> None:
        """``serve()`` once; if it raises, every request it held or left queued fails with it.
        An interrupt (Ctrl-C) of a hosting thread also propagates, to ``run_hosted``."""
        try:
            self.serve()
        except BaseException as err:  # fail every waiter rather than hang them
            with self._cond:
                failed, self._queue = list(self.in_flight()) + self._queue, []
            interrupt = isinstance(err, (KeyboardInterrupt, SystemExit))
            for r in failed:
                r.pending.resolve(error=RuntimeError(f"sampling was interrupted ({type(err).__name__})")
                                  if interrupt else err)
            if interrupt and threading.current_thread().name != self.name:
                raise

    def serve_hosted(self) -> None:
        """One busy period on the calling thread (``run_hosted``'s), unless a thread of its
        own is serving (it was started before the host, or by ``close``)."""
        with self._cond:
            if self._thread is not None or not self._queue or self.closing:
                return
            self._thread = threading.current_thread()  # for ``idle`` and ``close``
        try:
            self._busy_period()
        finally:
            with self._cond:
                self._thread = None

    def take(self) -> list:
        """Everything queued (requests whose caller gave up are dropped); nothing for a driver
        thread that yields to a host."""
        if self._yielding():
            return []
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
        # a host (run_hosted's thread) leaves its busy period at the next step and goes on
        if thread is not None and thread is not threading.current_thread() and thread.name == self.name:
            thread.join(timeout)

    def _run(self) -> None:
        handover, failed = None, []
        while True:
            with self._cond:
                ready = self._cond.wait_for(lambda: self._queue or self.closing or _host is not None,
                                            timeout=self.idle_exit_s)
                if not ready or self.closing or _host is not None:
                    # a host serving from now on takes the queue (this thread's OpenMP pool ends with it)
                    self._thread = None
                    handover = _host if not self.closing and self._queue else None
                    if handover is None:
                        failed, self._queue = self._queue, []
                    break
            self._busy_period()
        if handover is not None:
            handover.wake(self)
        for r in failed + (list(self.in_flight()) if self.closing else []):
            r.pending.resolve(error=RuntimeError("the engine's driver thread was closed (interpreter exit)"))


class _Host:
    """The thread serving the drivers during ``run_hosted``: which drivers have work."""

    def __init__(self):
        self.cond = threading.Condition()
        self.ready: list[DriverThread] = []
        self.done = False

    def wake(self, driver: DriverThread) -> None:
        with self.cond:
            if driver not in self.ready:
                self.ready.append(driver)
            self.cond.notify()


_host: _Host | None = None  # set while a thread serves every driver (run_hosted)
_host_lock = threading.Lock()


def run_hosted(coro):
    """``asyncio.run(coro)``, the coroutine on a helper thread while this thread serves the
    requests it sends to any driver (module docstring: one OpenMP pool, not two). Only the
    main thread hosts, once at a time; elsewhere (a background rollout thread) it is plain
    ``asyncio.run``. An exception here (Ctrl-C) cancels the coroutine, still serving until it
    has unwound, then propagates.

    >>> async def three():
    ...     return 3
    >>> run_hosted(three())
    3
    """
    global _host
    with _host_lock:
        host = _host = _Host() if _host is None and threading.current_thread() is threading.main_thread() else None
    if host is None:
        return asyncio.run(coro)
    outcome: dict = {}
    started = threading.Event()

    async def tracked():
        outcome["loop"], outcome["task"] = asyncio.get_running_loop(), asyncio.current_task()
        started.set()
        return await coro

    def side() -> None:
        try:
            outcome["value"] = asyncio.run(tracked())
        except BaseException as err:
            outcome["error"] = err
        finally:
            started.set()
            with host.cond:
                host.done = True
                host.cond.notify()

    side_thread = threading.Thread(target=side, name="agentrl-rollout-loop", daemon=True)
    side_thread.start()
    interrupted: BaseException | None = None
    try:
        while True:
            try:
                with host.cond:
                    # in slices: a blocked wait would not see an interrupt raised by another thread
                    if not host.cond.wait_for(lambda: host.ready or host.done, timeout=HOST_WAKE_S):
                        continue
                    if host.done and not host.ready:
                        break
                    drivers, host.ready = host.ready, []
                for driver in drivers:
                    driver.serve_hosted()
            except BaseException as err:  # Ctrl-C: cancel the coroutine, serve until it has unwound
                if interrupted is not None:
                    raise
                interrupted = err
                started.wait()
                if "task" in outcome:
                    try:
                        outcome["loop"].call_soon_threadsafe(outcome["task"].cancel)
                    except RuntimeError:  # its loop has closed: the coroutine ended already
                        pass
    finally:
        with _host_lock:
            _host = None
        for driver in list(_LIVE):  # requests queued as the host left get threads of their own
            with driver._cond:
                driver._start_thread()
        side_thread.join()
    if interrupted is not None:
        raise interrupted
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


@atexit.register
def _close_all() -> None:
    for driver in list(_LIVE):
        driver.close()
