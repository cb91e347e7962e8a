"""Sandboxed execution of untrusted Python code (the engine behind the ``python`` tool and the
code checker).

- :class:`LocalExecutor` runs code in a fresh process per call, or in a per-trajectory
  :class:`StatefulWorker`, isolated as strongly as the host allows (``isolation_level``:
  ``bwrap`` > ``unshare`` > ``rlimits``), with limits from :class:`SandboxConfig`. As root a
  fresh call is a child forked from a warm server already inside the sandbox
  (:mod:`.forkpool`, :mod:`.forkserver`, :mod:`.serve`); ``fork_server=False`` (or not root)
  starts one interpreter per call.
- :class:`ExecPool` bounds how many runs execute at once.
- :mod:`.e2b` runs code in E2B cloud sandboxes instead (optional extra).

Example::

    from agentrl.tools.sandbox import LocalExecutor, SandboxConfig
    ex = LocalExecutor(SandboxConfig(timeout=5))
    r = ex.run("import os; print(os.getuid() != 0)")
    assert r.output == "True\\n" or ex.isolation_level == "rlimits"
"""

from .config import SandboxConfig
from .local import LocalExecutor
from .pool import ExecPool, shared_pool
from .result import ExecResult
from .worker import StatefulWorker

__all__ = ["SandboxConfig", "LocalExecutor", "StatefulWorker", "ExecPool", "shared_pool", "ExecResult"]
