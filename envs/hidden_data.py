"""Keep an environment's task files out of its sandboxes, whatever they may see.

The python tool and the code checker run the model's code in a sandbox that shows only the
system directories, the standard library and the allowed packages (docs/sandbox.md), so a
checkout and other packages' data files are hidden already. A data file can still sit inside
what is shown (an allowed package's folder, or a tool built with ``site_packages=True``), and a
policy that can open it can copy the answer (math's ``answer`` field) or run the canonical
solution (HumanEval's ``canonical_solution``) instead of solving. An environment that knows its
data files names them in ``data_paths``; its sandboxes also hide each file's folder and the git
work tree around it (its history holds the same files), through
``SandboxConfig.hidden_paths``. At ``rlimits`` the hiding is Landlock's (contents unreadable,
names still listable); under ``/tmp`` nothing is needed: the sandbox's /tmp is private.

Example::

    from agentrl.envs.hidden_data import hidden_folders
    hidden_folders(["/srv/data/gsm8k.jsonl"])  # ('/srv/data',) where that file exists, outside a git work tree
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from agentrl.tools.python import PythonTool
    from agentrl.tools.sandbox.config import SandboxConfig

_PRIVATE = ("/tmp", "/dev/shm")  # private inside every sandbox already


def hidden_folders(paths: Iterable[str | os.PathLike]) -> tuple[str, ...]:
    """The folders to hide for data files ``paths``: each existing file's folder (a folder as
    is) and the root of the git work tree holding it, if any."""
    out: list[str] = []
    for p in paths:
        path = Path(p).resolve()
        if not path.exists():
            continue
        folder = path if path.is_dir() else path.parent
        tree = next((d for d in (folder, *folder.parents) if (d / ".git").exists()), None)
        for f in (folder, tree):
            if f is not None and f != Path("/") and not _private(str(f)) and str(f) not in out:
                out.append(str(f))
    return tuple(out)


def _private(folder: str) -> bool:
    return any(folder == p or folder.startswith(p + "/") for p in _PRIVATE)


def hiding_config(base: "SandboxConfig", paths: Iterable[str | os.PathLike]) -> "SandboxConfig":
    """``base`` with the folders of ``paths`` added to its hidden paths."""
    extra = tuple(f for f in hidden_folders(paths) if f not in base.hidden_paths)
    return dataclasses.replace(base, hidden_paths=(*base.hidden_paths, *extra)) if extra else base


def python_tool_hiding(paths: Iterable[str | os.PathLike], **kwargs) -> "PythonTool":
    """``python_tool(**kwargs)`` whose sandbox hides the folders of ``paths``. Its time limit
    stays the ToolBox's (``tools.timeout``), as for a plain ``python_tool()``."""
    from agentrl.tools.python import python_tool
    from agentrl.tools.sandbox.config import SandboxConfig

    config = hiding_config(SandboxConfig(), paths)
    if config.hidden_paths == SandboxConfig().hidden_paths:
        return python_tool(**kwargs)
    return _inherit_limit(python_tool(config=config, **kwargs), inherits=True)


def _inherit_limit(tool: "PythonTool", inherits: bool) -> "PythonTool":
    """``python_tool`` reads a given ``config`` as choosing the time limit too; ours only hides
    folders, so the tool keeps taking the ToolBox's limit until one is set (``with_timeout``),
    through every rebuild (``with_settings``, e.g. ``tools.fork_server=false``)."""
    if inherits:
        tool.timeout = None
    rebuild = tool.with_settings

    def with_settings(**changes):
        return _inherit_limit(rebuild(**changes), inherits=inherits and changes.get("timeout") is None)

    tool.with_settings = with_settings  # type: ignore[method-assign]
    return tool
