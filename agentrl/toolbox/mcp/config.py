"""One MCP server the agent gets tools from: a ``tools.mcp`` entry of a run config.

    >>> s = McpServerConfig(name="time", command="mcp-server-time", args=["--local-timezone", "UTC"])
    >>> s.transport, s.lifecycle
    ('stdio', 'run')
    >>> McpServerConfig(name="calc")
    Traceback (most recent call last):
    ...
    agentrl.types.ConfigError: tools.mcp 'calc': give a command (a stdio server) or a url (streamable HTTP)

docs/mcp.md describes every field; this dataclass is what a run config's YAML is checked against.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from agentrl.types import ConfigError

LIFECYCLES = ("run", "attempt")


@dataclass
class McpServerConfig:
    """One MCP server (stdio: ``command``; streamable HTTP: ``url``)."""

    name: str = ""  # names the server in messages and in failures (required)
    command: str | None = None  # stdio: the program, found on PATH or a path (e.g. .venv-mcp/bin/python)
    args: list[str] = field(default_factory=list)  # its arguments
    env: dict[str, str] = field(default_factory=dict)  # variables set for it, over PATH, HOME, LANG, TZ, ...
    cwd: str | None = None  # its working directory (default: the trainer's)
    url: str | None = None  # streamable HTTP: the endpoint, e.g. http://127.0.0.1:8000/mcp
    headers: dict[str, str] = field(default_factory=dict)  # HTTP headers sent with every request
    # "run": one server for the whole run, shared by every attempt (stateless servers); "attempt":
    # a fresh server (or HTTP session) per attempt, stopped when it ends (servers that keep state)
    lifecycle: Literal["run", "attempt"] = "run"
    timeout: float | None = None  # a call's time limit in seconds; None: tools.timeout
    start_timeout: float = 30.0  # seconds for the server to start and answer initialize and tools/list
    tools: list[str] | None = None  # expose only these of its tools (the server's names); None: all
    prefix: str = ""  # put before each of its tool names (e.g. "git_"), to keep two servers' tools apart

    def __post_init__(self) -> None:
        where = f"tools.mcp {self.name!r}" if self.name else "tools.mcp entry"
        if not self.name:
            raise ConfigError(f"{where}: give each server a name (name: calc)")
        if (self.command is None) == (self.url is None):
            raise ConfigError(f"{where}: give a command (a stdio server) or a url (streamable HTTP)"
                              + (", not both" if self.command is not None else ""))
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"{where}: url {self.url!r} must start with http:// or https://")
        if self.lifecycle not in LIFECYCLES:
            raise ConfigError(f"{where}: lifecycle {self.lifecycle!r} is not one of {list(LIFECYCLES)}")
        if self.timeout is not None and not self.timeout > 0:
            raise ConfigError(f"{where}: timeout={self.timeout} must be > 0 seconds, or null for tools.timeout")
        if not self.start_timeout > 0:
            raise ConfigError(f"{where}: start_timeout={self.start_timeout} must be > 0 seconds")
        if self.prefix and not self.prefix.replace("_", "a").isalnum():
            raise ConfigError(f"{where}: prefix {self.prefix!r} may hold letters, digits and _ only")
        self.env = {str(k): str(v) for k, v in self.env.items()}
        self.args = [str(a) for a in self.args]

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "http"
