"""The tool API: plain Python functions the agent can call, and the ToolBox that runs them.

- ``tool.py``: ``@tool`` and :class:`Tool` (a function plus its schema), :class:`ToolContext`
  (per-trajectory state), :class:`ToolResult` (one call's outcome); ``@tool`` checks the
  docstring when it decorates: no description or an ``Args:`` entry naming no parameter raises
  ValueError, a parameter without a description warns (the rules: ``tool.py``'s docstring);
- ``box.py``: :class:`ToolBox`, which runs a rollout's calls and never raises;
- ``schema.py``: JSON schema from type hints and Google-style docstrings, argument checks;
- ``threads.py``: the reused worker threads that run synchronous tools, with time limits;
- ``output.py``: tool results as text, capped in tokens (head and tail kept);
- ``faults.py``: the fault-injection harness (``rollout.fault_rate``);
- ``tape.py``: a run's tool calls recorded, served back or compared on replay (``agentrl replay``);
- ``mcp/``: tools from MCP servers (stdio, streamable HTTP), ``tools.mcp`` (docs/mcp.md).

The built-in tools (python, search) live in the top-level ``tools/`` folder, installed as
``agentrl.tools``.
"""

from agentrl.toolbox.box import ToolBox
from agentrl.toolbox.output import cap_tokens
from agentrl.toolbox.tool import Tool, ToolContext, ToolResult, tool

__all__ = ["tool", "Tool", "ToolBox", "ToolContext", "ToolResult", "cap_tokens"]
