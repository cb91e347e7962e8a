"""The ``python`` tool: the agent runs Python code and reads what it printed.

One argument, ``code``. The observation is stdout and stderr interleaved (capped, head and
tail kept), the repr of a trailing expression as in a notebook, a traceback on error, and
one short note when the run was stopped (time limit, output limit, signal). Time and output
limits come from this configuration, never from the model's arguments.

Backends: ``local`` (default; a sandboxed interpreter on this machine, see
:mod:`agentrl.tools.sandbox`) and ``e2b`` (E2B cloud sandboxes, optional extra). Modes:
``fresh`` starts a new interpreter per call (nothing persists); ``stateful`` keeps one
interpreter per trajectory (variables persist, like a notebook; never shared between
trajectories) and kills it when the trajectory ends.

``isolation_level`` (``bwrap`` | ``unshare`` | ``rlimits`` | ``e2b``) says how strongly the
code is isolated; the trainer logs it once.

What the code does is the model's outcome and comes back as the observation: it raised, ran
past the time limit, printed too much, ran out of memory, exited or killed its own process.
What the host or the service does to the sandbox raises :class:`agentrl.InfraError` (the
ToolBox reports error ``infra``, the run retries the attempt): the sandbox could not start,
the fork server or a stateful interpreter was killed from outside, E2B failed (causes in
:mod:`agentrl.tools.sandbox.local`, ``.forkpool``, ``.worker`` and ``.e2b``). The next call
starts a new sandbox. A fault that took the trajectory's state with it (a stateful
interpreter, an E2B sandbox that had run earlier calls) is not ``retryable``: the attempt runs
again; the others are, and the ToolBox runs the same call again in place.

Example::

    import asyncio
    from agentrl.toolbox import ToolBox
    from agentrl.tools.python import python_tool

    box = ToolBox([python_tool(timeout=5)])   # or ToolBox([python_tool()], default_timeout=5)
    ctx = box.new_context("t0")
    assert asyncio.run(box.execute("python", {"code": "print(6 * 7)"}, ctx)).content == "42\\n"
"""

from __future__ import annotations

import dataclasses
from typing import Any

from agentrl.toolbox import Tool, ToolContext
from agentrl.types import InfraError

from .sandbox.config import IsolationRequest, SandboxConfig
from .sandbox.local import LocalExecutor
from .sandbox.worker import StatefulWorker

BACKENDS = ("local", "e2b")
MODES = ("fresh", "stateful")
# Slack on top of the code's own limit for the ToolBox's backstop timeout: a call may wait for
# a pool slot (or an E2B sandbox to start) before its code runs. The sandbox enforces the
# real limit itself and says so in the observation.
_QUEUE_SLACK_S = 60.0


class PythonTool(Tool):
    """The ``python`` tool; build with :func:`python_tool`.

    Its ``timeout`` is the limit on the code itself, enforced inside the sandbox (the model is
    told "[stopped: the code ran past the Ns time limit]"); the ToolBox's wall-clock backstop
    adds ``backstop_slack`` for the wait for a pool slot.
    """

    isolation_level: str  # Tool's attribute, always set here: how strongly the code is isolated
    backend: str
    mode: str
    executor: LocalExecutor | None = None  # the local sandbox running the code; None on E2B
    backstop_slack = _QUEUE_SLACK_S
    _settings: dict[str, Any]  # the python_tool arguments it was built with

    def with_timeout(self, seconds: float) -> "PythonTool":
        """The same tool with a time limit of ``seconds`` (sandbox and description rebuilt)."""
        return self.with_settings(timeout=seconds)

    def with_settings(self, **changes: Any) -> "PythonTool":
        """The same tool built with some :func:`python_tool` arguments changed."""
        return python_tool(**{**self._settings, **changes})


def python_tool(
    *,
    backend: str = "local",
    mode: str = "fresh",
    timeout: float | None = None,
    max_output_chars: int | None = None,
    memory_mb: int | None = None,
    isolation: IsolationRequest | None = None,
    site_packages: bool | None = None,
    max_concurrency: int | None = None,
    fork_server: bool | None = None,
    config: SandboxConfig | None = None,
    e2b_template: str | None = None,
) -> PythonTool:
    """The ``python`` tool (argument ``code: str``), returning stdout + stderr as text.

    ``config`` gives every local-sandbox limit at once; an argument given here overrides that
    one field, an argument left as None keeps the config's value (default
    :class:`SandboxConfig`: 10 s, 4000 chars, 1024 MB, ``isolation="auto"``).

    The time limit has one source: ``timeout`` (or ``config.timeout``) when given, else the
    ToolBox's ``default_timeout`` — in a run, the config key ``tools.timeout``. A tool built
    with neither (as the built-in environments build it) takes the ToolBox's limit, and its
    description shows that limit.

    ``fork_server=False`` starts one interpreter per fresh-mode call instead of forking it from
    a warm server inside the sandbox (the default where the trainer is root; see
    :mod:`agentrl.tools.sandbox.forkserver`).

    The code sees the standard library and the allowed packages (``SandboxConfig.packages``:
    numpy, sympy, mpmath where installed), nothing else of the host (docs/sandbox.md).
    ``site_packages=True`` shows every installed package and its data files: for trusted code
    only (an environment's answers may sit there). Raises at construction when the backend cannot work
    here (no isolation level available, no E2B key), so a run fails before training starts.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    settings = dict(backend=backend, mode=mode, timeout=timeout, max_output_chars=max_output_chars,
                    memory_mb=memory_mb, isolation=isolation, site_packages=site_packages,
                    max_concurrency=max_concurrency, fork_server=fork_server, config=config, e2b_template=e2b_template)
    overrides = {k: v for k, v in settings.items()
                 if k in ("timeout", "max_output_chars", "memory_mb", "isolation", "site_packages", "max_concurrency", "fork_server")
                 and v is not None}
    cfg = dataclasses.replace(config or SandboxConfig(), **overrides)
    # Whether the limit was chosen here (then it wins over the ToolBox's default) or inherited.
    own_limit = cfg.timeout if (timeout is not None or config is not None) else None
    description = _description(mode, cfg.timeout)
    if backend == "e2b":
        from .sandbox.e2b import E2BExecutor

        remote = E2BExecutor(cfg.timeout, cfg.max_output_chars, mode, template=e2b_template)

        async def python_e2b(code: str, ctx: ToolContext) -> str:
            box = ctx.state.get("python_e2b")
            opened = box is None
            if opened:
                box = ctx.state["python_e2b"] = await remote.open()
                ctx.on_close(box.kill)
            try:
                return await remote.run(box, code)
            except InfraError as exc:
                ctx.state.pop("python_e2b", None)  # the sandbox is in doubt: the next call opens a new one
                # Files and variables of earlier calls went with it (both modes share the file
                # system): the same call again is not the same call, so only the attempt can rerun.
                exc.retryable = exc.retryable and opened
                raise

        return _make(python_e2b, description, own_limit, remote.isolation_level, settings)

    local = LocalExecutor(cfg)

    async def python(code: str, ctx: ToolContext) -> str:
        if mode == "fresh":
            return (await local.arun(code)).observation()
        session = ctx.state.get("python_session")
        if not isinstance(session, StatefulWorker):
            session = ctx.state["python_session"] = local.session()
            ctx.on_close(session.close)
        return (await session.arun(code)).observation()

    t = _make(python, description, own_limit, local.isolation_level, settings)
    t.executor = local
    return t


def _make(fn: Any, description: str, timeout: float | None, level: str, settings: dict[str, Any]) -> PythonTool:
    fn.__doc__ = f"""{description}

        Args:
            code: Python source code to run.
        """
    t = PythonTool(fn, name="python", description=description, timeout=timeout)
    t.isolation_level, t.backend, t.mode = level, settings["backend"], settings["mode"]
    t._settings = settings
    return t


def _description(mode: str, timeout: float) -> str:
    persist = (
        "Variables, imports and functions persist between calls, like a notebook."
        if mode == "stateful"
        else "Each call starts a new interpreter: nothing persists between calls."
    )
    return (
        "Run Python code and return what it printed (stdout and stderr); the value of a final "
        f"expression is shown too. Use print() to see results. {persist} No network access; "
        f"time limit {timeout:g}s per call."
    )
