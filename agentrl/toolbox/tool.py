"""A tool: a plain Python function plus what the model is told about it.

``@tool`` turns a function (sync or async) into a :class:`Tool`: the name comes from the
function, the description and per-argument descriptions from its Google-style docstring, the
JSON schema from its type hints (mapping in :mod:`agentrl.toolbox.schema`). A parameter
annotated :class:`ToolContext` receives the per-trajectory context and is hidden from the
schema. :class:`agentrl.toolbox.box.ToolBox` runs tools for a rollout.

The docstring is what the model reads, so ``@tool`` checks it when it decorates (one rule for
every tool, ``Tool(fn)`` and ``ToolBox([fn])`` included):

- no description (no docstring text before the first section, and no ``description=``):
  ``ValueError``; write a docstring or pass ``@tool(description="...")``;
- an ``Args:`` entry (or ``:param x:``) that names no parameter of the function, usually a
  typo or a renamed parameter: ``ValueError`` naming the entry and the parameters;
- a parameter with no description (no ``Args:`` entry, no ``Annotated[X, "text"]``):
  :class:`ToolDocWarning`, a warning, since a self-explaining name (``query``) can do.

With ``parameters=`` (a schema given by hand) only the description is checked.

    >>> @tool
    ... def add(a: int, b: int) -> int:
    ...     '''Add two integers.
    ...
    ...     Args:
    ...         a: first term
    ...         b: second term
    ...     '''
    ...     return a + b
    >>> add.schema()["function"]["parameters"]["required"], add(a=1, b=2)
    (['a', 'b'], 3)
"""

from __future__ import annotations

import asyncio
import copy
import difflib
import inspect
import os
import sys
import time
import types
import typing
import warnings
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from jsonschema import Draft202012Validator

from agentrl.toolbox.output import to_text
from agentrl.toolbox.schema import FunctionSchema, argument_errors, function_schema, quick_check, signature_hint
from agentrl.toolbox.threads import ToolTimeout, call_in_worker
from agentrl.types import Failure


class ToolDocWarning(UserWarning):
    """A tool parameter the model is told nothing about (see the module docstring's rules)."""


@dataclass
class ToolContext:
    """Per-trajectory context injected into tools that declare a parameter annotated
    ``ToolContext``. Not part of the schema the model sees.

    ``state`` holds per-trajectory objects of stateful tools (an interpreter session, a
    scratch directory); ``on_close`` registers their cleanup, run by :meth:`ToolBox.close`.
    """

    trajectory_id: str
    state: dict[str, object] = field(default_factory=dict)
    seed: int | None = None  # the rollout's seed (keys the fault-injection harness's decisions)
    calls: int = 0  # calls executed so far in this trajectory (the harness's per-call key)
    _cleanups: list[Callable[[], object]] = field(default_factory=list, repr=False)

    def on_close(self, fn: Callable[[], object]) -> None:
        """Register a cleanup (sync, async, or returning an awaitable); cleanups run last-in
        first-out when the trajectory ends."""
        self._cleanups.append(fn)


@dataclass
class ToolResult:
    """Outcome of one tool call, as the rollout records it."""

    content: str  # the observation the model sees (already capped)
    error: str | None  # None on success; "unknown_tool" | "invalid_arguments" | "exception" | "timeout" | "parse_error" | "infra"
    latency_s: float
    truncated: bool  # output was capped
    failure: Failure | None = None  # error "infra": the tool raised InfraError (not the model's fault)
    retried: list[Failure] = field(default_factory=list)  # infrastructure failures retried in place first


class Tool:
    """A function plus what the model is told about it. Build with :func:`tool`.

    ``parameters`` may be passed to replace the schema derived from the type hints (the
    arguments are then validated against it as given).

    ``timeout`` is the tool's time limit in seconds; None takes the ToolBox's
    ``default_timeout`` (in a run: ``tools.timeout``), bound when the ToolBox is built.
    """

    # Seconds the ToolBox's wall-clock backstop adds to ``timeout``: 0 for tools the ToolBox
    # stops itself; a tool that enforces its own limit (the sandbox) adds its queueing time.
    backstop_slack: float = 0.0
    # Where a sandboxed tool runs its code (the python tool: "bwrap", "unshare", "rlimits",
    # "e2b"); None for in-process tools. The trainer logs the levels of its tools once.
    isolation_level: str | None = None

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = None,
        max_output_tokens: int | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"@tool needs a function, got {fn!r}")
        if timeout is not None and timeout <= 0:
            raise ValueError(f"tool timeout must be positive seconds or None, got {timeout}")
        if max_output_tokens is not None and max_output_tokens < 1:
            raise ValueError(f"max_output_tokens must be at least 1 or None, got {max_output_tokens}")
        self.fn = fn
        self.name: str = name or getattr(fn, "__name__", "")
        if not self.name.isidentifier():
            raise ValueError(f"tool name {self.name!r} is not an identifier; pass @tool(name='...')")
        self._context_param = _context_parameter(fn)
        derived = function_schema(fn, skip={self._context_param} if self._context_param else set())
        self.description: str = description if description is not None else derived.description
        self.parameters: dict[str, Any] = parameters if parameters is not None else derived.parameters
        _check_docstring(self.name, fn, self.description, None if parameters is not None else derived)
        Draft202012Validator.check_schema(self.parameters)
        self._validator = Draft202012Validator(self.parameters)
        self._quick_check = quick_check(self.parameters)
        self.timeout = timeout
        self.max_output_tokens = max_output_tokens
        self.is_async = inspect.iscoroutinefunction(fn)
        self.__doc__ = fn.__doc__
        self.__name__ = self.name
        self.__wrapped__ = fn

    def with_timeout(self, seconds: float) -> "Tool":
        """This tool with a time limit of ``seconds`` (what the ToolBox binds a None to)."""
        bound = copy.copy(self)
        bound.timeout = seconds
        return bound

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the original function directly (no validation, no timeout)."""
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Tool({signature_hint(self.name, self.parameters)})"

    def schema(self) -> dict[str, Any]:
        """``{"type": "function", "function": {"name", "description", "parameters"}}``, the shape
        chat templates and OpenAI-style APIs take."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def argument_errors(self, arguments: dict[str, Any]) -> list[str]:
        """Short problems with ``arguments`` against the schema; empty when valid."""
        if self._quick_check is not None and self._quick_check(arguments):
            return []
        return argument_errors(self._validator, arguments)

    async def invoke(self, arguments: dict[str, Any], context: ToolContext) -> str:
        """Raw call: no validation, no timeout, may raise. Sync functions run in a worker thread."""
        kwargs = self._kwargs(arguments, context)
        if self.is_async:
            return to_text(await _settle(self.fn(**kwargs)))
        return to_text(await _settle(call_in_worker(self.fn, kwargs, None)))

    async def run(self, arguments: dict[str, Any], context: ToolContext, timeout: float | None) -> str:
        """:meth:`invoke` that raises ToolTimeout after ``timeout`` seconds (None: no limit).

        A sync function's call waits on the worker's own future and a timer rather than in a
        task of its own: a task plus ``asyncio.wait`` cost about as much again as the thread
        hand-off itself, per call (issue 16, benchmarks/search.py).
        """
        if self.is_async:
            return await await_with_limit(self.invoke(arguments, context), timeout)
        start = time.monotonic()
        value = await call_in_worker(self.fn, self._kwargs(arguments, context), timeout)
        if inspect.isawaitable(value):  # a sync function that hands back a coroutine
            left = None if timeout is None else max(0.0, timeout - (time.monotonic() - start))
            value = await await_with_limit(_settle(value), left)
        return to_text(value)

    def _kwargs(self, arguments: dict[str, Any], context: ToolContext) -> dict[str, Any]:
        kwargs = dict(arguments)
        if self._context_param:
            kwargs[self._context_param] = context
        return kwargs


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    max_output_tokens: int | None = None,
) -> Any:
    """Make a :class:`Tool` from a function: ``@tool`` or ``@tool(name=..., timeout=...)``.

    >>> @tool(name="plus", timeout=5)
    ... def add(a: int, b: int = 1) -> int:
    ...     '''Add.
    ...
    ...     Args:
    ...         a: first term
    ...         b: second term
    ...     '''
    ...     return a + b
    >>> add.name, add.timeout, add.parameters["required"], add(a=2)
    ('plus', 5, ['a'], 3)
    """

    def wrap(f: Callable[..., Any]) -> Tool:
        f = f.fn if isinstance(f, Tool) else f  # re-decorating a Tool changes its options
        return Tool(f, name=name, description=description, timeout=timeout, max_output_tokens=max_output_tokens)

    return wrap(fn) if fn is not None else wrap


def _check_docstring(name: str, fn: Callable[..., Any], description: str, derived: FunctionSchema | None) -> None:
    """Apply the docstring rules of the module docstring; ``derived`` is None when the schema
    was given by hand (``parameters=``)."""
    where = _where(fn)
    if not description.strip():
        raise ValueError(
            f"tool {name!r} ({where}) has no description, so the model sees only its name: give the "
            "function a docstring whose first line says what it does (Google style, an `Args:` "
            "section for the parameters), or pass @tool(description='...')"
        )
    if derived is None:
        return
    params = [p for p in inspect.signature(fn).parameters]
    if derived.unknown_args:
        hints = []
        for entry in derived.unknown_args:
            close = difflib.get_close_matches(entry, params, n=1)
            hints.append(f"{entry!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ValueError(
            f"tool {name!r} ({where}): the docstring's `Args:` {'entry' if len(hints) == 1 else 'entries'} "
            f"{', '.join(hints)} {'names' if len(hints) == 1 else 'name'} no parameter of the function "
            f"(its parameters: {', '.join(params) or 'none'}); rename the entry to the parameter it "
            "describes, or remove it"
        )
    if derived.undocumented:
        missing = ", ".join(derived.undocumented)
        warnings.warn(ToolDocWarning(
            f"tool {name!r} ({where}): the model is told nothing about parameter(s) {missing}; "
            f"describe each in the docstring's `Args:` section (`{derived.undocumented[0]}: what it is`)"
        ), stacklevel=_outside_toolbox())


def _where(fn: Callable[..., Any]) -> str:
    """``file.py:12`` where ``fn`` is defined (its qualified name when that is unknown)."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return getattr(fn, "__qualname__", repr(fn))
    return f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}"


_TOOLBOX_DIR = os.path.dirname(os.path.abspath(__file__))


def _outside_toolbox() -> int:
    """The ``stacklevel`` of the first frame outside agentrl/toolbox (the decorated function's
    module), so a warning points at the user's code."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == _TOOLBOX_DIR:
        frame, level = frame.f_back, level + 1
    return level


def _context_parameter(fn: Callable[..., Any]) -> str | None:
    """Name of the parameter annotated ``ToolContext`` (or ``ToolContext | None``), if any."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        return None  # function_schema reports unresolvable hints with a better message
    for pname, hint in hints.items():
        candidates = typing.get_args(hint) if typing.get_origin(hint) in _UNIONS else (hint,)
        if any(isinstance(c, type) and issubclass(c, ToolContext) for c in candidates):
            return pname
    return None


_UNIONS: tuple[object, ...] = (typing.Union, getattr(types, "UnionType", typing.Union))


async def _settle(awaitable: Awaitable[Any]) -> Any:
    """Await a tool's result, and the awaitable it may hand back in turn."""
    try:
        value = await awaitable
        if inspect.isawaitable(value):
            value = await value
    except SystemExit as exc:
        # Inside a task SystemExit would escape to the event loop and stop every rollout.
        raise RuntimeError(f"tool called exit({exc.code})") from exc
    return value


async def await_with_limit(awaitable: Awaitable[Any], timeout: float | None) -> Any:
    """Await with a limit. Unlike ``asyncio.wait_for`` this does not wait for a cancelled tool
    to acknowledge cancellation, so a tool that swallows CancelledError cannot hang the caller."""
    task = asyncio.ensure_future(awaitable)
    try:
        finished, _ = await asyncio.wait({task}, timeout=timeout)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not finished:
        task.cancel()
        task.add_done_callback(_drop_result)
        raise ToolTimeout()
    return task.result()


def _drop_result(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # retrieve it so asyncio does not log "exception was never retrieved"
