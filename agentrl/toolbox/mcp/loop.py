"""The event loop every MCP session of the process lives on, in a daemon thread of its own.

A rollout runs its attempts in ``asyncio.run`` (a new loop per batch) and the trainer may sample
from a second thread (``train.max_staleness``), while an MCP session (the SDK's anyio task
groups and streams) belongs to the loop it was opened on and must outlive every batch. So all
sessions run here, and callers on any loop or thread hand coroutines over:

    >>> import asyncio
    >>> async def two() -> int:
    ...     return 2
    >>> run_sync(two()), asyncio.run(on_mcp_loop(two()))
    (2, 2)

A caller that is cancelled (a tool call past its time limit) cancels the coroutine here too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Coroutine, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def mcp_loop() -> asyncio.AbstractEventLoop:
    """The loop (started on first use; a daemon thread, so it never holds up the exit)."""
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="agentrl-mcp", daemon=True).start()
            _loop = loop
        return _loop


def submit(coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Run ``coro`` on the MCP loop; its future, for any thread."""
    return asyncio.run_coroutine_threadsafe(coro, mcp_loop())


async def on_mcp_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` on the MCP loop from any loop (directly when already on it)."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is not None and running is _loop:
        return await coro
    return await asyncio.wrap_future(submit(coro))


def run_sync(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Block this thread until ``coro`` is done on the MCP loop (never call it on that loop)."""
    future = submit(coro)
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise
