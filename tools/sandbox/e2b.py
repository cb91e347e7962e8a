"""The E2B backend: run the agent's code in an E2B cloud sandbox (``pip install 'agentrl[e2b]'``).

One sandbox per trajectory, created on its first call and killed when the trajectory ends.
``stateful`` runs every call in the sandbox's default interpreter (variables persist);
``fresh`` gives every call a new code context (a new interpreter, same file system). The
SDK's :class:`~e2b_code_interpreter.Execution` becomes text by :func:`execution_text`:
stdout, stderr, the cell's results (text, or a note for images and other formats), and the
error's traceback without terminal colour codes.

Example (needs ``E2B_API_KEY`` and network)::

    from agentrl.tools.python import python_tool
    tool = python_tool(backend="e2b", mode="stateful", timeout=30)
"""

from __future__ import annotations

import os
import re
from typing import Any

from .capture import OutputCapture

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_KEY_HELP = "create a key at https://e2b.dev/dashboard and `export E2B_API_KEY=...`, or use backend='local'"


class E2BUnavailable(RuntimeError):
    """The E2B backend cannot run here (no SDK, no API key, or no network); the message says why."""


def execution_text(execution: Any, max_chars: int) -> str:
    """The observation for an SDK ``Execution``: stdout, stderr, results, then the error.

    Output is capped like the local backend's (head and tail kept)."""
    parts: list[str] = []
    parts += list(execution.logs.stdout)
    parts += list(execution.logs.stderr)
    for result in execution.results:
        if result.text is not None:
            parts.append(result.text if result.text.endswith("\n") else result.text + "\n")
        else:
            formats = ", ".join(f for f in result.formats() if f != "text") or "empty"
            parts.append(f"[{formats} output not shown]\n")
    if execution.error is not None:
        err = execution.error
        trace = _ANSI.sub("", err.traceback or "").rstrip("\n")
        parts.append((trace or f"{err.name}: {err.value}") + "\n")
    cap = OutputCapture(max_chars)
    cap.feed("".join(parts).encode("utf-8", "replace"))
    return cap.text() or "(no output)"


class E2BExecutor:
    """Per-trajectory E2B sandboxes. Raises :class:`E2BUnavailable` at construction without the
    SDK or an API key, and at the first call when the service cannot be reached."""

    isolation_level = "e2b"

    def __init__(self, timeout: float, max_output_chars: int, mode: str, template: str | None = None,
                 sandbox_lifetime_s: int = 600, api_key: str | None = None) -> None:
        try:
            import e2b_code_interpreter  # noqa: F401  (optional extra, imported lazily)
        except ImportError as exc:
            raise E2BUnavailable("backend='e2b' needs the E2B SDK: pip install 'agentrl[e2b]' (e2b-code-interpreter)") from exc
        self.api_key = api_key or os.environ.get("E2B_API_KEY")
        if not self.api_key:
            raise E2BUnavailable(f"backend='e2b' needs an E2B API key: {_KEY_HELP}")
        self.timeout = timeout
        self.max_output_chars = max_output_chars
        self.mode = mode
        self.template = template
        self.sandbox_lifetime_s = sandbox_lifetime_s

    async def open(self) -> Any:
        """A new sandbox (one per trajectory)."""
        from e2b_code_interpreter import AsyncSandbox

        try:
            return await AsyncSandbox.create(template=self.template, timeout=self.sandbox_lifetime_s, api_key=self.api_key)
        except Exception as exc:
            raise E2BUnavailable(
                f"could not start an E2B sandbox ({type(exc).__name__}: {exc}); check network access and "
                f"E2B_API_KEY ({_KEY_HELP})"
            ) from exc

    async def run(self, sandbox: Any, code: str) -> str:
        """Run one call in ``sandbox``; a timeout becomes a note, like the local backend's."""
        from e2b_code_interpreter import TimeoutException

        context = await sandbox.create_code_context() if self.mode == "fresh" else None
        try:
            execution = await sandbox.run_code(code, context=context, timeout=self.timeout)
        except TimeoutException:
            return f"[stopped: the code ran past the {self.timeout:g}s time limit]"
        return execution_text(execution, self.max_output_chars)
