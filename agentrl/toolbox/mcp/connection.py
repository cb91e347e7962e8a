"""One live MCP session: a started stdio server or an HTTP session, initialized, its tools listed.

Everything here runs on the MCP loop (:mod:`agentrl.toolbox.mcp.loop`). A connection is opened
once and closed once; a server that died is replaced by a new connection
(:mod:`agentrl.toolbox.mcp.server` decides when). The SDK's context managers must be entered
and left by one task, so :meth:`McpConnection.open` starts a task that holds them until
:meth:`McpConnection.close`.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack
from typing import Any

from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, PaginatedRequestParams

from agentrl.toolbox.mcp.config import McpServerConfig
from agentrl.toolbox.mcp.stdio import ServerProcess, launch_stdio
from agentrl.types import ConfigError, InfraError

MAX_REPLY_BYTES = 8 << 20  # one reply over this is dropped (the model reads that it was)
_LIST_PAGES = 100  # a tools/list that pages on past this is cut there


class ServerGone(Exception):
    """The connection ended under a call (the server died, or the HTTP endpoint went away)."""


class McpConnection:
    """One session with one server; ``open``, then ``call`` any number of times, then ``close``."""

    def __init__(self, spec: McpServerConfig) -> None:
        self.spec = spec
        self.session: ClientSession | None = None
        self.process: ServerProcess | None = None
        self.tools: list[Any] = []  # the server's tools/list entries
        self.calls = 0  # calls made on this connection (an attempt's server is "new" until its first)
        self.start_s = 0.0  # seconds from spawn to the tools listed
        self.wedged = False  # it stopped answering after a call timed out (and was stopped)
        self.check: asyncio.Future[None] | None = None  # the ping that follows a timed-out call
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._ended = False

    @property
    def alive(self) -> bool:
        if self.session is None or self._ended:
            return False
        return self.process is None or self.process.returncode is None

    @property
    def pid(self) -> int | None:
        """The stdio launcher's pid (its process group holds the server); None over HTTP."""
        return None if self.process is None else self.process.pid

    async def open(self) -> list[Any]:
        """Start (or connect), initialize, list the tools. A server that does not get there in
        ``start_timeout`` seconds raises InfraError ``mcp_server_start_failed``."""
        t0 = time.perf_counter()
        ready: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._hold(ready), name=f"mcp-{self.spec.name}")
        try:
            self.tools = await asyncio.wait_for(asyncio.shield(ready), self.spec.start_timeout)
        except asyncio.TimeoutError:
            tail = await self._close_and_describe()
            raise InfraError(f"MCP server {self.spec.name!r} did not answer initialize and tools/list within "
                             f"start_timeout={self.spec.start_timeout:g}s{tail}", cause="mcp_server_start_failed") from None
        except (ConfigError, InfraError, asyncio.CancelledError):  # cancelled: its caller is gone, so is the server
            await self.close()
            raise
        except Exception as exc:
            tail = await self._close_and_describe()
            raise InfraError(f"MCP server {self.spec.name!r} failed to start: {_describe(exc)}{tail}",
                             cause="mcp_server_start_failed") from exc
        self.start_s = time.perf_counter() - t0
        return self.tools

    async def _hold(self, ready: asyncio.Future[list[Any]]) -> None:
        try:
            async with AsyncExitStack() as stack:
                if self.spec.transport == "stdio":
                    read, write, self.process = await stack.enter_async_context(launch_stdio(self.spec, MAX_REPLY_BYTES))
                else:
                    read, write = await stack.enter_async_context(_http_streams(self.spec))
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                tools: list[Any] = []
                cursor = None
                for _ in range(_LIST_PAGES):
                    page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
                    tools.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
                self.session = session
                ready.set_result(tools)
                await self._stop.wait()
        except Exception as exc:
            if not ready.done():
                ready.set_exception(exc)
        except BaseException:  # cancelled (a start past its time limit, or close() during the start)
            if not ready.done():
                ready.cancel()
            raise
        finally:
            self._ended = True
            self.session = None

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        """``tools/call``; raises ServerGone when the connection ended under it, MCPError for an
        error the server answered with, pydantic.ValidationError for a malformed result."""
        session = self.session
        if session is None or not self.alive:
            raise ServerGone(self.describe_end() or "the connection closed")
        self.calls += 1
        try:
            return await session.call_tool(name, arguments)
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED or not self.alive:
                raise ServerGone(self.describe_end() or "the connection closed") from exc
            raise
        except (OSError, EOFError) as exc:  # an HTTP endpoint that went away, a broken pipe
            raise ServerGone(f"{type(exc).__name__}: {exc}") from exc
        except Exception as exc:
            if not self.alive or type(exc).__module__.startswith(("httpx", "anyio")):
                raise ServerGone(f"{type(exc).__name__}: {exc}") from exc
            raise

    def mark_dead(self) -> None:
        """Seen dead by a caller: the next call starts a new server, even before the exit is reaped."""
        self._ended = True

    async def ping(self, timeout: float) -> bool:
        """True when the server answers a ping within ``timeout`` seconds."""
        session = self.session
        if session is None or not self.alive:
            return False
        try:
            await asyncio.wait_for(session.send_ping(), timeout)
            return True
        except Exception:
            return False

    def describe_end(self) -> str:
        """How the server ended, for messages: its exit status and the end of its stderr."""
        parts = []
        if self.process is not None and self.process.returncode is not None:
            parts.append(f"exit status {self.process.returncode}")
        tail = self.process.stderr_tail() if self.process is not None else ""
        if tail:
            parts.append("its stderr ends: " + tail[-500:].replace("\n", " | "))
        return "; ".join(parts)

    async def close(self) -> None:
        """Stop the server (stdin closed, then SIGKILL of its group after a grace second) or end
        the HTTP session. Safe to call twice."""
        self._stop.set()
        task = self._task
        if task is None or task.done():
            return
        if self.session is None:  # still starting: nothing to end politely
            task.cancel()
        await asyncio.wait({task}, timeout=5.0)  # the server's stop has its own bounds (stdio.py)
        if not task.done():
            task.cancel()

    async def _close_and_describe(self) -> str:
        if self.process is not None:  # a moment for a crashing server's exit status and last words
            for _ in range(50):
                if self.process.returncode is not None:
                    break
                await asyncio.sleep(0.01)
        end = self.describe_end() if self.process is not None else ""
        await self.close()
        return f" ({end})" if end else ""


def _http_streams(spec: McpServerConfig) -> Any:
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    client = httpx2.AsyncClient(headers=dict(spec.headers), timeout=httpx2.Timeout(spec.start_timeout, read=None))

    class _Streams:
        async def __aenter__(self) -> Any:
            self._stack = AsyncExitStack()
            await self._stack.enter_async_context(client)
            streams = await self._stack.enter_async_context(streamable_http_client(spec.url, http_client=client))
            return streams[0], streams[1]

        async def __aexit__(self, *exc: Any) -> None:
            await self._stack.aclose()

    return _Streams()


def _describe(exc: BaseException) -> str:
    while getattr(exc, "exceptions", None):  # an exception group (anyio's task groups) wraps the cause
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED:
        return "the server closed the connection before answering initialize"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__
