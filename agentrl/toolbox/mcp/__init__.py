"""Tools from MCP servers (stdio or streamable HTTP), through the official ``mcp`` SDK.

``McpServer`` is a tool source: ``ToolBox([my_tool, McpServer(name="time",
command="mcp-server-time")])`` lists the server's tools beside ``my_tool``; in a run,
``tools.mcp`` lists the servers (``McpServerConfig``). docs/mcp.md says how servers start,
restart and stop, what the model reads and which failures are whose.

- ``config.py``: :class:`McpServerConfig`, one ``tools.mcp`` entry;
- ``server.py``: :class:`McpServer`, lifecycle and the classification of each call's failures;
- ``tool.py``: :class:`McpTool`, one listed tool as a :class:`agentrl.toolbox.Tool`;
- ``connection.py``: one live session (initialize, tools/list, calls, ping);
- ``stdio.py``: the stdio transport (the process, its stderr, bounded replies);
- ``launcher.py``: the launcher that kills the server when the trainer dies;
- ``render.py``: a result's content blocks and structured content as text;
- ``loop.py``: the event loop thread all sessions run on.

Needs ``pip install agentrl[mcp]`` (the ``mcp`` package); without it, importing
``McpServer`` raises ImportError naming that install.
"""

from typing import Any

from agentrl.toolbox.mcp.config import McpServerConfig

_SDK = ("mcp", "mcp_types", "anyio", "httpx2", "pydantic")


def __getattr__(name: str) -> Any:
    """``McpServer`` and ``McpTool``, imported on first use: the SDK costs ~0.5 s to import and
    is an extra, and the run config imports this package for ``McpServerConfig``."""
    if name not in ("McpServer", "McpTool"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        from agentrl.toolbox.mcp import server, tool
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in _SDK:
            raise
        raise ImportError(f"MCP tools need the mcp package ({exc}); install it with "
                          "`pip install 'agentrl[mcp]'` (or `pip install mcp`)") from exc
    return server.McpServer if name == "McpServer" else tool.McpTool


__all__ = ["McpServer", "McpServerConfig", "McpTool"]
