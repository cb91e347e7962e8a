"""One tool of an MCP server, as a :class:`agentrl.toolbox.Tool` the ToolBox runs like any other.

The name, description and JSON schema come from the server's ``tools/list`` entry. The schema
is checked as our own tools' are (a valid JSON schema of an object), and every call's
arguments are validated against it by the ToolBox before the server sees them. Tool names are
the server's, with the server's ``prefix`` put before them and any character that cannot be in
a Python identifier replaced by ``_`` (``get-time`` -> ``get_time``); the server is called
with its own name.
"""

from __future__ import annotations

import copy
import re
from typing import TYPE_CHECKING, Any

from jsonschema.exceptions import SchemaError

from agentrl.toolbox.tool import Tool, ToolContext
from agentrl.types import ConfigError

if TYPE_CHECKING:
    from agentrl.toolbox.mcp.server import McpServer


def local_name(prefix: str, remote: str) -> str:
    """The ToolBox name of the server's tool ``remote``.

    >>> local_name("git_", "status"), local_name("", "get-time"), local_name("", "2d")
    ('git_status', 'get_time', '_2d')
    """
    name = prefix + re.sub(r"\W", "_", remote, flags=re.ASCII)
    return name if name[:1].isalpha() or name[:1] == "_" else "_" + name


class McpTool(Tool):
    """A tool served by an MCP server; calls go through :meth:`McpServer.call`."""

    def __init__(self, server: "McpServer", remote: Any, name: str) -> None:
        async def remote_call(context: ToolContext) -> str:  # never called: run() goes to the server
            raise NotImplementedError

        remote_call.__name__ = remote_call.__qualname__ = name
        where = f"MCP server {server.spec.name!r}, tool {remote.name!r}"
        description = (getattr(remote, "description", None) or getattr(remote, "title", None) or "").strip()
        schema = copy.deepcopy(getattr(remote, "input_schema", None) or {"type": "object", "properties": {}})
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise ConfigError(f"{where}: its input schema is not a JSON schema of an object ({str(schema)[:200]})")
        try:
            super().__init__(remote_call, name=name, parameters=schema, timeout=server.spec.timeout,
                             description=description or f"The {remote.name} tool of the {server.spec.name} server.")
        except (SchemaError, ValueError, TypeError) as exc:
            raise ConfigError(f"{where}: its input schema is not a valid JSON schema: "
                              f"{str(exc).splitlines()[0][:300]}") from exc
        self.server = server
        self.remote_name: str = remote.name

    async def run(self, arguments: dict[str, Any], context: ToolContext, timeout: float | None) -> str:
        """One ``tools/call`` under ``timeout`` seconds (the server's start is not counted)."""
        return await self.server.call(self, arguments, context, timeout)

    async def invoke(self, arguments: dict[str, Any], context: ToolContext) -> str:
        return await self.run(arguments, context, None)

    def __call__(self, **arguments: Any) -> str:
        """Call the tool from plain code, outside a rollout (no validation, no time limit)."""
        return self.server.call_sync(self, arguments)
