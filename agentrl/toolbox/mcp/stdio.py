"""The stdio transport: a server process under the launcher, JSON-RPC lines over its pipes.

Written here rather than taken from the SDK's ``stdio_client`` for three things a training run
needs: the process itself (its pid, and its exit noticed between calls, so a dead server is
restarted before the next call rather than failing it), the tail of its stderr for error
messages (kept in memory, 4 KiB: a server that floods stderr fills nothing), and a bound on one
reply (``max_reply_bytes``): a longer line is dropped as it arrives, never held whole, and its
request answered with an error the model reads. The server runs under
:mod:`agentrl.toolbox.mcp.launcher`, so it dies with the trainer, even of SIGKILL.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import signal
import sys
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any, AsyncIterator

import anyio
import mcp_types
from mcp.shared.message import SessionMessage

from agentrl.toolbox.mcp.config import McpServerConfig
from agentrl.types import ConfigError

LAUNCHER = Path(__file__).with_name("launcher.py")
# What the server inherits from the trainer (the SDK's own list, plus locale and time zone);
# API keys and the like are not passed unless named in ``env``.
INHERITED_ENV = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "LC_ALL", "TZ", "TMPDIR")
STDERR_TAIL = 4096
_ID = re.compile(rb'"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.){0,200}")')
_LIVE_GROUPS: dict[int, int] = {}  # process group of a running server -> the pid that started it


def server_env(spec: McpServerConfig) -> dict[str, str]:
    env = {k: os.environ[k] for k in INHERITED_ENV if k in os.environ and not os.environ[k].startswith("()")}
    return env | spec.env


def resolve_command(spec: McpServerConfig, env: dict[str, str]) -> str:
    """The command's absolute path, or a ConfigError naming the fix."""
    command = spec.command or ""
    if os.sep in command:
        path = Path(spec.cwd or ".", command).expanduser()
        if path.is_file() and os.access(path, os.X_OK):
            return os.path.abspath(path)  # not resolve(): a venv's python is a symlink that must stay one
        found = None
    else:
        found = shutil.which(command, path=env.get("PATH"))
    if found:
        return found
    raise ConfigError(
        f"MCP server {spec.name!r}: command {command!r} not found"
        + (f" on PATH ({env.get('PATH', '')})" if os.sep not in command else " (no executable file there)")
        + "; install the server (e.g. `pip install mcp-server-time`, or into its own venv when it pins "
        "another mcp: `python3 -m venv .venv-mcp && .venv-mcp/bin/pip install mcp-server-calculator`) and "
        "give the program's full path in tools.mcp[].command (e.g. .venv-mcp/bin/python with args: "
        "[-m, mcp_server_calculator])")


class ServerProcess:
    """A launched server: the launcher's process (the server is its child, in its group)."""

    def __init__(self, process: anyio.abc.Process) -> None:
        self.process = process
        self.pid = process.pid  # the launcher's pid, which is also the group's id
        self._stderr = bytearray()

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    def stderr_tail(self) -> str:
        return self._stderr.decode("utf-8", errors="replace").strip()

    def _keep_stderr(self, chunk: bytes) -> None:
        self._stderr += chunk
        del self._stderr[:-STDERR_TAIL]

    async def stop(self, grace_s: float) -> None:
        """Close stdin, give the server ``grace_s`` to exit, then SIGKILL its whole group."""
        with suppress(Exception):
            await self.process.stdin.aclose()
        with anyio.move_on_after(grace_s):
            while self.returncode is None:
                await anyio.sleep(0.01)
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)  # the group outlives its leader while members remain
        with anyio.move_on_after(2.0):
            while self.returncode is None:
                await anyio.sleep(0.01)
        _LIVE_GROUPS.pop(self.pid, None)


@asynccontextmanager
async def launch_stdio(spec: McpServerConfig, max_reply_bytes: int,
                       grace_s: float = 1.0) -> AsyncIterator[tuple[Any, Any, ServerProcess]]:
    """Start the server; yields the session's (read, write) streams and the process."""
    env = server_env(spec)
    command = resolve_command(spec, env)
    argv = [sys.executable, "-I", str(LAUNCHER), str(os.getpid()), "--", command, *spec.args]
    process = await anyio.open_process(argv, env=env, cwd=spec.cwd, start_new_session=True)
    _LIVE_GROUPS[process.pid] = os.getpid()
    server = ServerProcess(process)
    to_session, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, from_session = anyio.create_memory_object_stream[SessionMessage](0)

    async def read_stdout() -> None:
        lines = _Lines(max_reply_bytes)
        async with to_session:
            with suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                async for chunk in process.stdout:
                    for item in lines.feed(chunk):
                        await to_session.send(item)

    async def write_stdin() -> None:
        with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            async with from_session:
                async for message in from_session:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send(data.encode() + b"\n")
        await to_session.aclose()  # the server stopped reading: the session sees the end, not a hang

    async def read_stderr() -> None:
        with suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            async for chunk in process.stderr:
                server._keep_stderr(chunk)

    async with anyio.create_task_group() as tg:
        tg.start_soon(read_stdout)
        tg.start_soon(write_stdin)
        tg.start_soon(read_stderr)
        try:
            yield read_stream, write_stream, server
        finally:
            with anyio.CancelScope(shield=True):  # a cancelled caller must not leave the process behind
                await server.stop(grace_s)
            tg.cancel_scope.cancel()


class _Lines:
    """Bytes from the server's stdout -> parsed JSON-RPC messages, one per line, each bounded."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.parts: list[bytes] = []
        self.size = 0
        self.head = b""  # the start of a line past the limit (where its id is), the rest dropped

    def feed(self, chunk: bytes) -> list[SessionMessage | Exception]:
        out: list[SessionMessage | Exception] = []
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            piece = chunk[start:] if nl < 0 else chunk[start:nl]
            self.size += len(piece)
            if self.head:
                pass  # a line already over the limit: its bytes are counted and dropped
            elif self.size > self.max_bytes:
                self.head, self.parts = (b"".join(self.parts) + piece)[:1024], []
            else:
                self.parts.append(piece)
            if nl < 0:
                return out
            start = nl + 1
            message = self._finish()
            if message is not None:
                out.append(message)

    def _finish(self) -> SessionMessage | Exception | None:
        size, head = self.size, self.head
        line = b"".join(self.parts)
        self.parts, self.size, self.head = [], 0, b""
        if head:
            return _error_for(head, f"the server's reply was {size} bytes, over the limit of "
                                    f"{self.max_bytes} bytes; it was dropped")
        if not line.strip():
            return None
        try:
            return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
        except ValueError as exc:
            # Not a JSON-RPC message: answer its request (when it names one) with the reason,
            # so the call fails at once instead of waiting out its time limit.
            return _error_for(line[:1024], f"the server sent a malformed reply ({_first_line(exc)})") or exc


def _error_for(head: bytes, message: str) -> SessionMessage | None:
    """An error response to the request whose id starts ``head``; None when it names none."""
    match = _ID.search(head)
    if match is None:
        return None
    try:
        request_id = json.loads(match.group(1))
    except ValueError:
        return None
    error = {"jsonrpc": "2.0", "id": request_id, "error": {"code": mcp_types.INTERNAL_ERROR, "message": message}}
    return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_python(error, by_name=False))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]


@atexit.register
def _stop_all() -> None:
    """At exit, SIGKILL the group of every server this process started and did not stop (a
    forked child never stops its parent's)."""
    for group, owner in list(_LIVE_GROUPS.items()):
        if owner == os.getpid():
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
