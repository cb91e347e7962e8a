"""The ``python`` tool: the agent runs Python code and reads stdout + stderr.

(First, simple version: fresh interpreter per call or a per-trajectory stateful worker, with a
wall-clock timeout, an allow-listed environment and capped output. The hardened sandbox
replaces the internals behind the same factory.)

Example::

    import asyncio
    from agentrl.tool import ToolBox
    from agentrl.tools.python import python_tool

    box = ToolBox([python_tool(timeout=5)])
    ctx = box.new_context("t0")
    assert asyncio.run(box.execute("python", {"code": "print(6 * 7)"}, ctx)).content.strip() == "42"
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading

from agentrl.tool import Tool, ToolContext, tool

_PY = os.path.realpath(sys.executable)
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}

_BOOT = r"""
import sys, os
src = sys.stdin.read()
sys.stdin = open(os.devnull)
os.dup2(sys.stdin.fileno(), 0)
g = {"__name__": "__main__", "__builtins__": __builtins__}
try:
    exec(compile(src, "<cell>", "exec"), g)
except SystemExit:
    raise
except BaseException:
    import traceback
    et, ev, tb = sys.exc_info()
    traceback.print_exception(et, ev, tb.tb_next)
"""


def _run_fresh(code: str, timeout: float, max_chars: int) -> str:
    with tempfile.TemporaryDirectory(prefix="agentrl-py-") as work:
        proc = subprocess.Popen(
            [_PY, "-I", "-S", "-u", "-c", _BOOT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=work,
            env={**_ENV, "HOME": work},
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(code.encode("utf-8", "replace"), timeout=timeout)
            note = ""
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            note = f"\n[timed out after {timeout:g}s; process killed]"
    return _cap(out.decode("utf-8", "replace"), max_chars) + note


def _cap(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    half = max_chars // 2
    return text[:half] + f"\n...[{len(text) - 2 * half} characters cut]...\n" + text[-half:]


class _History:
    """Stand-in for a stateful worker: replays earlier successful cells (simple version)."""

    def __init__(self) -> None:
        self.cells: list[str] = []
        self.lock = threading.Lock()


def python_tool(
    *,
    backend: str = "local",
    mode: str = "fresh",
    timeout: float = 10.0,
    max_output_chars: int = 4000,
) -> Tool:
    """The ``python`` tool (argument ``code: str``) returning stdout + stderr as text."""
    if backend != "local":
        raise ValueError(f"backend {backend!r} is not available yet; use backend='local'")
    if mode not in ("fresh", "stateful"):
        raise ValueError(f"mode must be 'fresh' or 'stateful', got {mode!r}")

    @tool(name="python", timeout=timeout + 5)
    def python(code: str, ctx: ToolContext) -> str:
        """Run Python code and return what it printed (stdout and stderr). Use print() to see values.

        Args:
            code: Python source code to run.
        """
        if mode == "fresh":
            return _run_fresh(code, timeout, max_output_chars)
        hist = ctx.state.setdefault("python_history", _History())
        assert isinstance(hist, _History)
        with hist.lock:
            prefix = "".join(f"import io as _io, contextlib as _c\nwith _c.redirect_stdout(_io.StringIO()):\n    exec({c!r})\n" for c in hist.cells)
            out = _run_fresh(prefix + code, timeout, max_output_chars)
            if "Traceback" not in out and "[timed out" not in out:
                hist.cells.append(code)
        return out

    python.isolation_level = "none"  # type: ignore[attr-defined]
    return python
