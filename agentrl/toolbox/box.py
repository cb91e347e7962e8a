"""The ToolBox: the tools of an environment, and the policy that runs them safely.

``@tool`` turns a function (sync or async) into a :class:`Tool`: the name comes from the
function, the description and per-argument descriptions from its Google-style docstring, the
JSON schema from its type hints (mapping in :mod:`agentrl.toolbox.schema`). A parameter annotated
:class:`ToolContext` receives the per-trajectory context and is hidden from the schema.

:meth:`ToolBox.execute` never raises: an unknown tool, bad arguments, an exception inside the
tool, a timeout or an oversized result all come back as a short observation for the model plus
an error kind in :class:`ToolResult`. A tool that raises :class:`agentrl.InfraError` (its
infrastructure failed, not the model) is called again in place when the error is
``retryable`` (``infra_retries`` times, with backoff); when it is not, or keeps failing, the
call comes back with error ``infra`` and a :class:`agentrl.Failure`: the rollout ends that
attempt and the run retries the attempt. Timeouts come from the tool (``@tool(timeout=...)``) or
the ToolBox default, never from the model's arguments.

Example::

    import asyncio
    from agentrl.toolbox import ToolBox, tool

    @tool
    def add(a: int, b: int) -> int:
        '''Add two integers.

        Args:
            a: first term
            b: second term
        '''
        return a + b

    box = ToolBox([add])
    ctx = box.new_context("traj-0")
    assert asyncio.run(box.execute("add", {"a": 1, "b": 2}, ctx)).content == "3"
    r = asyncio.run(box.execute("mul", {}, ctx))
    assert r.error == "unknown_tool" and r.content == "Error: unknown tool 'mul'. Available tools: add."
    assert add(a=1, b=2) == 3   # still callable as the function
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import time
from typing import Any, Callable

from agentrl.toolbox.faults import FaultPlan
from agentrl.toolbox.output import cap_tokens
from agentrl.toolbox.schema import coerce_integers, signature_hint
from agentrl.toolbox.tape import ToolTape
from agentrl.toolbox.threads import ToolTimeout, call_in_worker
from agentrl.toolbox.tool import Tool, ToolContext, ToolResult, await_with_limit
from agentrl.types import Failure, InfraError

log = logging.getLogger(__name__)

_MAX_ERROR_CHARS = 500


class ToolError(Exception):
    """A tool's own report that a call failed, in words for the model (an MCP result with
    ``isError``): the observation is the message, after ``Error: `` unless it starts with
    ``Error``, whole but capped like any output; error kind ``exception``."""


class ToolBox:
    """The tools of an environment and the policy for running them.

    Sync tools run in a daemon thread of their own, so a slow one never blocks the event loop;
    on timeout it is abandoned (Python cannot kill a thread) while async tools are cancelled.
    Idle threads are reused, but never one whose call hangs (:mod:`agentrl.toolbox.threads`): a
    few hung tools cannot fill a pool and make every later call time out while queued.
    """

    def __init__(
        self,
        tools: list[Tool],
        tokenizer: Any = None,
        default_timeout: float | None = 30.0,
        max_output_tokens: int = 1024,
        faults: FaultPlan | None = None,
        infra_retries: int = 2,
        infra_backoff_s: float = 0.2,
    ) -> None:
        self.tools: dict[str, Tool] = {}
        # A tool source (an MCP server, agentrl.toolbox.mcp) stands for the tools it lists now;
        # it owns processes, which shutdown() stops.
        self.sources: list[Any] = [t for t in tools if hasattr(t, "as_tools")]
        for t in [u for t in tools for u in (t.as_tools() if hasattr(t, "as_tools") else [t])]:
            t = t if isinstance(t, Tool) else Tool(t)
            if t.timeout is None and default_timeout is not None:
                t = t.with_timeout(default_timeout)  # one limit per tool, fixed before the first call
            if t.name in self.tools:
                raise ValueError(f"two tools are named {t.name!r}; rename one with @tool(name='...')")
            self.tools[t.name] = t
        self.tokenizer = tokenizer
        self.default_timeout = default_timeout
        self.max_output_tokens = max_output_tokens
        self.faults = faults  # the fault-injection harness (rollout.fault_rate); None in real runs
        # A call whose infrastructure failed with a retryable InfraError (a stateless call: the
        # same call again is the same call) runs again in place, up to infra_retries times, waiting
        # infra_backoff_s, doubled each time: the attempt goes on, and nothing is resampled.
        self.infra_retries = infra_retries
        self.infra_backoff_s = infra_backoff_s
        self.tape: ToolTape | None = None  # the run's tape of calls (agentrl.toolbox.tape); None: calls only run

    def schemas(self) -> list[dict[str, Any]]:
        """The schema of every tool, in order, for the chat template's ``tools=`` argument."""
        return [t.schema() for t in self.tools.values()]

    def new_context(self, trajectory_id: str, seed: int | None = None) -> ToolContext:
        """A fresh context for one trajectory; pass it to every ``execute`` of that trajectory.
        ``seed`` is the rollout's (it keys the fault-injection harness's seeded decisions)."""
        return ToolContext(trajectory_id=trajectory_id, seed=seed)

    async def execute(self, name: str, arguments: dict[str, Any] | str, context: ToolContext) -> ToolResult:
        """Run one call and describe the outcome to the model. Never raises (except when the
        caller cancels it). ``arguments`` may also be the raw JSON text of the call. With a
        ``tape`` set (a run's record, or a replay: ``agentrl.toolbox.tape``) the call goes
        through it: recorded, served from the tape, or run and compared."""
        if self.tape is not None:
            return await self.tape.through(self._execute, name, arguments, context)
        return await self._execute(name, arguments, context)

    async def _execute(self, name: str, arguments: dict[str, Any] | str, context: ToolContext) -> ToolResult:
        start = time.perf_counter()

        retried: list[Failure] = []  # this call's infrastructure failures that were retried in place

        def done(content: str, error: str | None, max_tokens: int | None = None,
                 failure: Failure | None = None) -> ToolResult:
            text, cut = cap_tokens(content, self.tokenizer, max_tokens or self.max_output_tokens)
            return ToolResult(content=text, error=error, latency_s=time.perf_counter() - start, truncated=cut,
                              failure=failure, retried=retried)

        t = self.tools.get(name) if isinstance(name, str) else None
        if t is None:
            available = ", ".join(self.tools) or "none"
            return done(f"Error: unknown tool {_quote(name)}. Available tools: {available}.", "unknown_tool")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as exc:
                return done(f"Error: arguments for tool '{t.name}' are not valid JSON ({exc}).", "parse_error")
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            return done(f"Error: arguments for tool '{t.name}' must be a JSON object. {_expected(t)}", "invalid_arguments")
        problems = t.argument_errors(arguments)
        if problems:
            return done(f"Error: invalid arguments for tool '{t.name}': {'; '.join(problems[:5])}. {_expected(t)}",
                        "invalid_arguments")
        timeout = None if t.timeout is None else t.timeout + t.backstop_slack
        args = coerce_integers(arguments, t.parameters)
        try:
            for k in range(self.infra_retries + 1):
                try:
                    if self.faults is not None:
                        self.faults.maybe_fail(t.name, context)
                    content = await t.run(args, context, timeout)
                    break
                except InfraError as exc:  # not the model's fault: the model never reads it
                    failure = Failure.of(f"tool:{t.name}", exc)
                    if not exc.retryable or k == self.infra_retries:  # the rollout ends the attempt
                        return done(f"Error: tool '{t.name}' failed outside the model's control: {exc}", "infra",
                                    failure=failure)
                    retried.append(failure)  # the same call again: the attempt goes on as if it never failed
                    await asyncio.sleep(self.infra_backoff_s * 2 ** k)
        except ToolError as exc:  # the tool's own failure report: the model reads it whole
            text = str(exc)
            return done(text if text.startswith("Error") else f"Error: {text}", "exception", t.max_output_tokens)
        except ToolTimeout:
            return done(f"Error: tool '{t.name}' timed out after {timeout:g}s.", "timeout")
        except Exception as exc:  # the tool's own bug or bad input: the model reads it, the rollout goes on
            log.debug("tool %s raised", t.name, exc_info=True)
            return done(f"Error: tool '{t.name}' raised {_last_line(exc)}", "exception")
        return done(content, None, t.max_output_tokens)

    def shutdown(self) -> None:
        """Stop the tool sources' processes (MCP servers); safe to call twice. Those still
        running at interpreter exit are stopped then."""
        for source in self.sources:
            source.close()

    async def close(self, context: ToolContext) -> None:
        """Run the context's cleanups, last registered first; failures are logged, never raised.
        Each cleanup gets the ToolBox default timeout. Safe to call twice."""
        cleanups, context._cleanups = context._cleanups[::-1], []
        for fn in cleanups:
            try:
                await await_with_limit(_call_cleanup(fn), self.default_timeout)
            except Exception:
                log.warning("cleanup %r of trajectory %s failed", fn, context.trajectory_id, exc_info=True)


async def _call_cleanup(fn: Callable[[], object]) -> None:
    value = await fn() if inspect.iscoroutinefunction(fn) else await call_in_worker(fn, {}, None)
    if inspect.isawaitable(value):
        await value


def _expected(t: Tool) -> str:
    return f"Expected: {signature_hint(t.name, t.parameters)}."


def _last_line(exc: BaseException) -> str:
    """``ZeroDivisionError: division by zero``: the last traceback line, cut to a sane length."""
    message = str(exc).strip()
    line = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return line if len(line) <= _MAX_ERROR_CHARS else line[: _MAX_ERROR_CHARS - 3] + "..."


def _quote(name: object) -> str:
    text = name if isinstance(name, str) else repr(name)
    return "'" + (text if len(text) <= 100 else text[:97] + "...") + "'"
