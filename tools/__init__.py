"""Built-in tools, installed as ``agentrl.tools`` (this folder is ``tools/`` in the repository;
``pyproject.toml`` maps it). The tool API they are written with is :mod:`agentrl.toolbox`.

- :func:`python_tool` — run Python in a local sandbox (bubblewrap / unshare / rlimits) or E2B;
- :func:`search_tool`, :func:`open_tool`, :func:`search_tools` — search a corpus (a local
  SQLite FTS5 index, or the web through DDGS) and open a document.

Example::

    from agentrl.tools import python_tool, search_tools
    tools = [python_tool(), *search_tools("local")]
"""

from agentrl.tools.python import PythonTool, python_tool
from agentrl.tools.search import open_tool, search_tool, search_tools

__all__ = ["PythonTool", "open_tool", "python_tool", "search_tool", "search_tools"]
