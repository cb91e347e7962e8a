"""An MCP server as a source of tools: its lifecycle, and how each call's failure is classified.

``ToolBox([add, McpServer(name="time", command="mcp-server-time")])`` starts the server, lists
its tools and gives them to the ToolBox beside ``add``. Then (docs/mcp.md):

- lifecycle ``run``: that one server serves every attempt. One that died (between calls, or
  under one: InfraError ``mcp_server_died``, retryable, so the ToolBox calls again in place)
  is started again for the next call; one that cannot start raises InfraError
  ``mcp_server_start_failed``.
- lifecycle ``attempt``: each attempt's first call starts a server of its own, stopped when the
  attempt ends (``ToolBox.close``). Its death loses the attempt's state: InfraError
  ``mcp_server_died`` that is not retryable (the attempt is rerun), unless it died on its first call.
- a call past its time limit is the model's (``Error: ... timed out``), as with any tool; the
  server is then pinged, and one that no longer answers is stopped and replaced.
- a result with ``isError``, an error answer, a malformed result: the model reads it.

:meth:`McpServer.close` (``ToolBox.shutdown``) stops the run's server; any still running stop
at interpreter exit, and the launcher stops them when the trainer is killed.

Example::

    from agentrl.toolbox import ToolBox
    from agentrl.toolbox.mcp import McpServer

    box = ToolBox([McpServer(name="time", command="mcp-server-time", args=["--local-timezone", "UTC"])])
    print(box.tools["get_current_time"](timezone="Europe/Paris"))   # JSON with the time there
    box.shutdown()
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import weakref
from typing import Any

from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from agentrl.toolbox.box import ToolError
from agentrl.toolbox.mcp.config import McpServerConfig
from agentrl.toolbox.mcp.connection import McpConnection, ServerGone
from agentrl.toolbox.mcp.loop import on_mcp_loop, run_sync, submit
from agentrl.toolbox.mcp.render import render
from agentrl.toolbox.mcp.tool import McpTool, local_name
from agentrl.toolbox.threads import ToolTimeout
from agentrl.toolbox.tool import ToolContext, await_with_limit
from agentrl.types import ConfigError, InfraError

log = logging.getLogger(__name__)

PING_AFTER_TIMEOUT_S = 2.0  # a server that does not answer a ping this soon after a timed-out call is replaced


class McpServer:
    """The tools of one MCP server, and the server's processes. Pass it to a ToolBox.

    Takes an :class:`McpServerConfig` or its fields as keywords.
    """

    def __init__(self, spec: McpServerConfig | None = None, **fields: Any) -> None:
        self.spec = spec if spec is not None else McpServerConfig(**fields)
        self._tools: list[McpTool] | None = None
        self._run = _RunServer()  # lifecycle "run": the server every attempt uses
        # Dropped without close() (a Trainer that ends without ToolBox.shutdown): its server goes too.
        weakref.finalize(self, _RunServer.kill, self._run)
        self._lock: asyncio.Lock | None = None  # made on the MCP loop: one (re)start at a time
        self._key = f"mcp:{id(self)}"  # a ToolContext.state key for lifecycle "attempt"
        self._closed = False
        self.starts = 0  # servers started (the first, restarts, and one per attempt)

    def __repr__(self) -> str:
        return f"McpServer({self.spec.name!r}, {self.spec.transport}, lifecycle={self.spec.lifecycle})"

    # -- the ToolBox's side ------------------------------------------------------------------

    def as_tools(self) -> list[McpTool]:
        """Start the server and list its tools (once; the list is kept)."""
        if self._tools is None:
            conn = run_sync(self._open())
            try:
                self._tools = self._make_tools(conn.tools)
            except BaseException:
                run_sync(conn.close())
                raise
            if self.spec.lifecycle == "run":
                self._shared = conn
            else:  # a probe: each attempt starts its own
                run_sync(conn.close())
        return list(self._tools)

    def close(self) -> None:
        """Stop the run's server (an attempt's stops with its attempt). Safe to call twice."""
        self._closed = True
        conn, self._shared = self._shared, None
        if conn is not None:
            try:
                run_sync(conn.close(), timeout=10)
            except Exception:
                log.warning("stopping MCP server %r failed", self.spec.name, exc_info=True)

    @property
    def _shared(self) -> McpConnection | None:
        return self._run.conn

    @_shared.setter
    def _shared(self, conn: McpConnection | None) -> None:
        self._run.conn = conn

    @property
    def pid(self) -> int | None:
        """The run's server's launcher pid (its process group holds the server); None if none."""
        return None if self._shared is None else self._shared.pid

    # -- calls -------------------------------------------------------------------------------

    async def call(self, tool: McpTool, arguments: dict[str, Any], context: ToolContext,
                   timeout: float | None) -> str:
        """One call: the connection (started if needed, not under the time limit), then
        ``tools/call`` under ``timeout``, its outcome classified (module docstring)."""
        conn = await on_mcp_loop(self._connection(context))
        try:
            result = await await_with_limit(on_mcp_loop(conn.call(tool.remote_name, arguments)), timeout)
        except ToolTimeout:
            submit(self._start_check(conn))
            raise
        except ServerGone as exc:
            raise self._died(conn, context, tool, str(exc)) from None
        except MCPError as exc:  # the server answered with an error (bad arguments, unknown tool, reply too big)
            raise ToolError(f"tool '{tool.name}' failed: {exc.message}") from None
        except (ValidationError, RuntimeError) as exc:  # a result that fits no CallToolResult, or not its output schema
            raise ToolError(f"tool '{tool.name}' returned a malformed result ({_first_line(exc)})") from None
        text = render(result)
        if getattr(result, "is_error", False):
            raise ToolError(text or f"tool '{tool.name}' reported an error")
        return text

    def call_sync(self, tool: McpTool, arguments: dict[str, Any]) -> str:
        """A call from plain code: its own context, closed after (so an attempt's server stops)."""
        async def once() -> str:
            context = ToolContext(trajectory_id="direct")
            try:
                return await self.call(tool, arguments, context, None)
            finally:
                await self._close_context(context)

        return run_sync(once())

    # -- lifecycle (on the MCP loop) -----------------------------------------------------------

    async def _open(self) -> McpConnection:
        if self._closed:
            raise InfraError(f"MCP server {self.spec.name!r} was shut down (ToolBox.shutdown)", cause="mcp_server_closed")
        conn = McpConnection(self.spec)
        await conn.open()
        self.starts += 1
        return conn

    async def _connection(self, context: ToolContext) -> McpConnection:
        conn = self._shared if self.spec.lifecycle == "run" else context.state.get(self._key)
        check = getattr(conn, "check", None)
        if check is not None and not check.done():
            await asyncio.shield(check)  # after a timeout: the verdict first, so no new call queues behind a wedge
        if self.spec.lifecycle == "attempt":
            conn = context.state.get(self._key)
            if isinstance(conn, McpConnection) and getattr(conn, "wedged", False):
                del context.state[self._key]
                await conn.close()
                raise ToolError(f"the {self.spec.name} server stopped answering after an earlier call ran past "
                                "its time limit; it was restarted and its state is gone")
            if conn is None:
                conn = await self._open()
                context.state[self._key] = conn
                context.on_close(functools.partial(self._close_context, context))
            elif not conn.alive:
                raise self._died(conn, context, None, conn.describe_end())
            return conn
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            conn = self._shared
            if conn is None or not conn.alive:
                if conn is not None:
                    log.warning("MCP server %r ended%s; starting it again", self.spec.name,
                                f" ({conn.describe_end()})" if conn.describe_end() else "")
                    await conn.close()
                conn = self._shared = await self._open()
                self._check_same_tools(conn.tools)
            return conn

    async def _close_context(self, context: ToolContext) -> None:
        conn = context.state.pop(self._key, None)
        if isinstance(conn, McpConnection):
            await on_mcp_loop(conn.close())

    def _died(self, conn: McpConnection, context: ToolContext, tool: McpTool | None, how: str) -> InfraError:
        what = f"during a call to {tool.remote_name!r}" if tool is not None else "between calls"
        stdio = conn.process is not None
        kind, cause = ("died", "mcp_server_died") if stdio else ("lost the connection", "mcp_connection_lost")
        conn.mark_dead()
        submit(conn.close())
        if self.spec.lifecycle == "run":
            return InfraError(f"MCP server {self.spec.name!r} {kind} {what} ({how}); it is started again for the "
                              "next call", cause=cause)
        context.state.pop(self._key, None)
        first = conn.calls <= 1 and tool is not None  # nothing was lost: the same call again is the same call
        return InfraError(f"MCP server {self.spec.name!r} (lifecycle attempt) {kind} {what} ({how})"
                          + ("" if first else "; the attempt's server state is lost"),
                          cause=cause, retryable=first)

    async def _start_check(self, conn: McpConnection) -> None:
        if conn.check is None or conn.check.done():
            conn.check = asyncio.ensure_future(self._check_after_timeout(conn))

    async def _check_after_timeout(self, conn: McpConnection) -> None:
        if await conn.ping(PING_AFTER_TIMEOUT_S):
            return
        log.warning("MCP server %r does not answer a ping after a call timed out; stopping it", self.spec.name)
        conn.wedged = True  # an attempt's own server: its next call says so (its state is gone)
        await conn.close()  # calls in flight fail as infrastructure (retried); the next call restarts it

    # -- tools -----------------------------------------------------------------------------------

    def _make_tools(self, listed: list[Any]) -> list[McpTool]:
        by_name = {t.name: t for t in listed}
        wanted = self.spec.tools if self.spec.tools is not None else list(by_name)
        unknown = [n for n in wanted if n not in by_name]
        if unknown:
            raise ConfigError(f"MCP server {self.spec.name!r} has no tool {', '.join(map(repr, unknown))}; its tools: "
                              f"{', '.join(by_name) or 'none'} (fix tools.mcp[].tools)")
        tools: list[McpTool] = []
        for remote in (by_name[n] for n in wanted):
            name = local_name(self.spec.prefix, remote.name)
            if any(t.name == name for t in tools):
                raise ConfigError(f"MCP server {self.spec.name!r}: two tools become {name!r}; list one in tools.mcp[].tools")
            tools.append(McpTool(self, remote, name))
        return tools

    def _check_same_tools(self, listed: list[Any]) -> None:
        if self._tools is not None and {t.remote_name for t in self._tools} - {t.name for t in listed}:
            log.warning("MCP server %r restarted without some of its tools; their calls will fail", self.spec.name)


class _RunServer:
    """Holds the run's connection apart from its McpServer, so a finalizer can reach it."""

    conn: McpConnection | None = None

    def kill(self) -> None:
        pid = self.conn.pid if self.conn is not None else None
        if pid is not None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:300]

