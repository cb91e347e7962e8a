"""The E2B backend: run the agent's code in an E2B cloud sandbox (``pip install 'agentrl[e2b]'``).

One sandbox per trajectory, created on its first call and killed when the trajectory ends.
``stateful`` runs every call in the sandbox's default interpreter (variables persist);
``fresh`` gives every call a new code context (a new interpreter, same file system). The
SDK's :class:`~e2b_code_interpreter.Execution` becomes text by :func:`execution_text`:
stdout, stderr, the cell's results (text, or a note for images and other formats), and the
error's traceback without terminal colour codes.

What the code did is the observation (its error, its output, "[stopped: ...]" when it ran past
the time limit). What the service did raises :class:`E2BUnavailable`, an
:class:`agentrl.InfraError`, so the run retries the attempt instead of scoring it: the sandbox
could not be created (``e2b_create_failed``), the API key was rejected (``e2b_auth``), the
connection dropped or was refused (``e2b_connection_lost``), the sandbox is gone or stopped
answering before the code's time limit (``e2b_sandbox_lost``). The ``python`` tool then opens
a new sandbox on the trajectory's next call (a sandbox that had run earlier calls took their
files and variables with it: that fault is not ``retryable``). The API key is read once, when the tool is built
(a run without one fails before training starts): a key revoked mid-run is ``e2b_auth``.

Example (needs ``E2B_API_KEY`` and network)::

    from agentrl.tools.python import python_tool
    tool = python_tool(backend="e2b", mode="stateful", timeout=30)
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

from agentrl.types import InfraError

from .capture import OutputCapture

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_KEY_HELP = "create a key at https://e2b.dev/dashboard and `export E2B_API_KEY=...`, or use backend='local'"


class E2BUnavailable(InfraError):
    """The E2B backend cannot run (no SDK or API key at construction; during a call: the
    service failed, see the module docstring); the message says why and ``cause`` names it."""

    def __init__(self, message: str, *, cause: str = "e2b_unavailable", retryable: bool = True) -> None:
        super().__init__(message, cause=cause, retryable=retryable)


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
            raise E2BUnavailable("backend='e2b' needs the E2B SDK: pip install 'agentrl[e2b]' (e2b-code-interpreter)",
                                 cause="e2b_no_sdk") from exc
        self.api_key = api_key or os.environ.get("E2B_API_KEY")
        if not self.api_key:
            raise E2BUnavailable(f"backend='e2b' needs an E2B API key: {_KEY_HELP}", cause="e2b_no_api_key")
        self.timeout = timeout
        self.max_output_chars = max_output_chars
        self.mode = mode
        self.template = template
        self.sandbox_lifetime_s = sandbox_lifetime_s

    async def open(self) -> Any:
        """A new sandbox (one per trajectory); raises :class:`E2BUnavailable` when none can be had
        (nothing of the model is involved yet: any failure is the service's)."""
        from e2b import AuthenticationException
        from e2b_code_interpreter import AsyncSandbox

        try:
            return await AsyncSandbox.create(template=self.template, timeout=self.sandbox_lifetime_s, api_key=self.api_key)
        except AuthenticationException as exc:
            raise E2BUnavailable(f"E2B rejected the API key ({exc}); {_KEY_HELP}", cause="e2b_auth") from exc
        except Exception as exc:
            raise E2BUnavailable(
                f"could not start an E2B sandbox ({type(exc).__name__}: {exc}); check network access and "
                f"E2B_API_KEY ({_KEY_HELP})", cause="e2b_create_failed"
            ) from exc

    async def run(self, sandbox: Any, code: str) -> str:
        """Run one call in ``sandbox``. The code running past the time limit becomes a note, like
        the local backend's; a failure of the service raises :class:`E2BUnavailable`."""
        from e2b_code_interpreter import TimeoutException

        try:
            context = await sandbox.create_code_context() if self.mode == "fresh" else None
            started = time.monotonic()
            try:
                execution = await sandbox.run_code(code, context=context, timeout=self.timeout)
            except TimeoutException as exc:
                # The SDK's own execution deadline, or no answer by the time the code's limit was
                # spent: the code's. Earlier (a request timeout, a killed or expired sandbox): the service's.
                if "execution timed out" in str(exc).lower() or time.monotonic() - started >= self.timeout:
                    return f"[stopped: the code ran past the {self.timeout:g}s time limit]"
                raise
        except Exception as exc:
            fault = service_fault(exc)
            if fault is None:
                raise
            raise fault from exc
        return execution_text(execution, self.max_output_chars)


def service_fault(exc: BaseException) -> E2BUnavailable | None:
    """The infrastructure failure an exception from the E2B SDK stands for, or None when it is
    not one (a bad argument: a bug here, raised as is)."""
    import httpx
    from e2b import AuthenticationException, InvalidArgumentException, SandboxException, TimeoutException

    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, AuthenticationException):
        return E2BUnavailable(f"E2B rejected the API key mid-run ({text}); {_KEY_HELP}", cause="e2b_auth")
    if isinstance(exc, (httpx.TransportError, ConnectionError, OSError)):
        return E2BUnavailable(f"the connection to the E2B sandbox failed ({text}); check network access",
                              cause="e2b_connection_lost")
    if isinstance(exc, SandboxException) and not isinstance(exc, InvalidArgumentException):
        lost = isinstance(exc, TimeoutException) or "not found" in str(exc).lower()
        return E2BUnavailable(f"the E2B sandbox failed ({text})", cause="e2b_sandbox_lost" if lost else "e2b_error")
    return None
