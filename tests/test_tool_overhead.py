"""The per-call cost of ToolBox.execute for sync tools (issue 16), checked by what it does rather
than by a wall-clock threshold: calls reuse one worker thread, the short path that made them
cheap keeps the guarantees (time limits, other calls unblocked, cancellation, context variables),
and the quick argument check never accepts what the full validator rejects."""

from __future__ import annotations

import asyncio
import contextvars
import random
import threading
import typing

from jsonschema import Draft202012Validator

from agentrl.toolbox.schema import function_schema, quick_check
from agentrl.toolbox.threads import WORKERS
from agentrl.toolbox import ToolBox, ToolContext, ToolResult, tool


def test_sequential_calls_of_a_fast_sync_tool_reuse_one_worker_thread() -> None:
    threads: list[threading.Thread] = []  # the objects, not idents: a dead thread's ident is reused

    @tool
    def where(q: str) -> str:
        """Record the thread that runs the call."""
        threads.append(threading.current_thread())
        return q

    box = ToolBox([where])

    async def go() -> list[ToolResult]:
        await box.execute("where", {"q": "warm"}, ToolContext("t"))  # may start the first worker
        started, alive = WORKERS.started, set(threading.enumerate())
        results = [await box.execute("where", {"q": str(i)}, ToolContext("t")) for i in range(200)]
        assert WORKERS.started == started and set(threading.enumerate()) <= alive  # no thread started
        return results

    results = asyncio.run(go())
    assert [r.content for r in results] == [str(i) for i in range(200)]
    assert len(set(map(id, threads))) == 1  # the same worker every time...
    assert threads[-1] is not threading.main_thread()  # ...and never the event loop's thread


def test_a_hung_sync_call_times_out_while_other_sync_calls_complete() -> None:
    release, entered = threading.Event(), threading.Event()

    @tool(timeout=0.3)
    def hang() -> str:
        """Block until released."""
        entered.set()
        release.wait(60)
        return "late"

    @tool
    def quick(i: int) -> int:
        """Answer at once."""
        return i

    box = ToolBox([hang, quick], default_timeout=30)

    async def go() -> tuple[ToolResult, list[ToolResult], list[ToolResult]]:
        hung = asyncio.create_task(box.execute("hang", {}, ToolContext("h")))
        while not entered.is_set():
            await asyncio.sleep(0.001)
        during = [await box.execute("quick", {"i": i}, ToolContext(str(i))) for i in range(20)]
        assert not hung.done()  # quick calls did not wait for the hung one
        timed_out = await hung
        after = [await box.execute("quick", {"i": i}, ToolContext(str(i))) for i in range(5)]
        return timed_out, during, after

    try:
        timed_out, during, after = asyncio.run(go())
        assert not release.is_set()  # everything above ran while the hung call held its thread
    finally:
        release.set()
    assert (timed_out.error, timed_out.content) == ("timeout", "Error: tool 'hang' timed out after 0.3s.")
    assert [r.content for r in during] == [str(i) for i in range(20)]
    assert [r.content for r in after] == [str(i) for i in range(5)]


def test_cancelling_a_sync_call_returns_at_once_and_its_result_is_dropped() -> None:
    release, entered, finished = threading.Event(), threading.Event(), threading.Event()

    @tool
    def block() -> str:
        """Block until released."""
        entered.set()
        release.wait(60)
        finished.set()
        return "late"

    box = ToolBox([block])

    async def go() -> None:
        task = asyncio.create_task(box.execute("block", {}, ToolContext("t")))
        while not entered.is_set():
            await asyncio.sleep(0.001)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        assert task.cancelled() and not finished.is_set()
        release.set()
        while not finished.is_set():  # the worker finishes later; its delivery must not raise
            await asyncio.sleep(0.001)
        for _ in range(5):
            await asyncio.sleep(0.01)

    try:
        asyncio.run(go())
    finally:
        release.set()


def test_sync_tool_returning_a_coroutine_is_awaited_within_the_limit() -> None:
    @tool(timeout=0.2)
    def later(wait: bool) -> object:
        """Hand back a coroutine instead of a value."""

        async def value() -> str:
            if wait:
                await asyncio.sleep(60)
            return "awaited"

        return value()

    box = ToolBox([later])
    assert asyncio.run(box.execute("later", {"wait": False}, ToolContext("t"))).content == "awaited"
    r = asyncio.run(box.execute("later", {"wait": True}, ToolContext("t")))
    assert r.error == "timeout" and r.latency_s < 30


REQUEST = contextvars.ContextVar("REQUEST", default="unset")


def test_sync_tools_see_the_callers_context_variables() -> None:
    @tool
    def read() -> str:
        """Read a context variable set by the caller."""
        return REQUEST.get()

    box = ToolBox([read])

    async def call(tag: str) -> str:
        REQUEST.set(tag)
        return (await box.execute("read", {}, ToolContext(tag))).content

    async def go() -> list[str]:
        return list(await asyncio.gather(*(call(f"r{i}") for i in range(8))))

    assert asyncio.run(go()) == [f"r{i}" for i in range(8)]


# --- the quick argument check -------------------------------------------------------------------

_VALUES = [None, True, False, 0, 3, -7, 2**70, 3.0, 2.5, float("nan"), "", "x", "3", [], [1], {}, {"a": 1}, b"x"]


def _flat(a: int, b: str = "s", c: float | None = None, d: bool = False, e: typing.Any = None) -> None:
    """Every primitive kind, a default, a nullable and an untyped argument."""


def _nested(xs: list[int], mode: typing.Literal["a", "b"] = "a") -> None:
    """Shapes the quick check leaves to the full validator."""


def test_quick_check_accepts_only_what_the_full_validator_accepts() -> None:
    schemas = [function_schema(_flat, skip=set()).parameters,
               {**function_schema(_flat, skip=set()).parameters, "additionalProperties": True},
               {"type": "object", "properties": {"n": {"type": ["integer", "string"]}}}]
    rng = random.Random(0)
    accepted = 0
    for schema in schemas:
        check, validator = quick_check(schema), Draft202012Validator(schema)
        assert check is not None
        names = [*schema["properties"], "extra"]
        for _ in range(3000):
            args = {k: rng.choice(_VALUES) for k in rng.sample(names, rng.randint(0, len(names)))}
            if check(args):
                accepted += 1
                assert validator.is_valid(args), (schema, args)
    assert accepted > 500  # the quick path does take ordinary arguments
    assert quick_check(function_schema(_nested, skip=set()).parameters) is None


def test_search_tool_arguments_take_the_quick_path() -> None:
    from agentrl.tools.search import search_tool

    t = search_tool("local", corpus="mini_wiki")
    check = quick_check(t.parameters)
    assert check is not None and check({"query": "copper bells"}) and check({"query": "x", "top_k": 3})
    assert not check({"query": "x", "top_k": 3.0})  # the full validator accepts it; execute coerces it
    assert t.argument_errors({"query": "x", "top_k": "3"}) == ["argument 'top_k' must be integer, got string \"3\""]
