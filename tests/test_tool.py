"""ToolBox.execute: error observations, timeouts, concurrency, context cleanup, documented examples."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, Literal

import pytest

from agentrl.toolbox import ToolBox, ToolContext, ToolResult, tool


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: first term
        b: second term
    """
    return a + b


# --- execute: error paths -----------------------------------------------------------------------


def test_unknown_tool_lists_available() -> None:
    @tool
    def python(code: str) -> str:
        """Run code."""
        return code

    r = run(ToolBox([add, python]).execute("foo", {}, ToolContext("t")))
    assert r == ToolResult(content="Error: unknown tool 'foo'. Available tools: add, python.", error="unknown_tool",
                           latency_s=r.latency_s, truncated=False)


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ({"a": 1}, "missing required argument 'b' (integer)"),
        ({"a": "3", "b": 1}, 'argument \'a\' must be integer, got string "3"'),
        ({"a": True, "b": 1}, "argument 'a' must be integer, got boolean true"),
        ({"a": 1.5, "b": 1}, "argument 'a' must be integer, got number 1.5"),
        ({"a": 1, "b": 2, "c": 3}, "unexpected argument 'c'"),
        ({"a": 1, "b": 2, "timeout": 99}, "unexpected argument 'timeout'"),
        ([1, 2], "must be a JSON object"),
    ],
)
def test_invalid_arguments(arguments: Any, fragment: str) -> None:
    r = run(ToolBox([add]).execute("add", arguments, ToolContext("t")))
    assert r.error == "invalid_arguments"
    assert fragment in r.content
    assert r.content.startswith("Error: ") and r.content.endswith("Expected: add(a: integer, b: integer).")


def test_enum_and_nested_errors() -> None:
    @tool
    def convert(unit: Literal["c", "f"], xs: list[int]) -> str:
        """Convert."""
        return unit

    r = run(ToolBox([convert]).execute("convert", {"unit": "k", "xs": [1, "2"]}, ToolContext("t")))
    assert 'argument \'unit\' must be one of "c", "f", got "k"' in r.content
    assert "argument 'xs[1]' must be integer" in r.content


def test_integer_valued_float_is_coerced_and_json_text_parsed() -> None:
    seen: list[type] = []

    @tool
    def kind(n: int, x: float) -> str:
        """Kind."""
        seen.extend([type(n), type(x)])
        return "ok"

    box = ToolBox([kind])
    assert run(box.execute("kind", {"n": 3.0, "x": 2}, ToolContext("t"))).content == "ok"
    assert seen == [int, int]  # 3.0 -> 3 for the int; an int stays an int for a float param
    assert run(box.execute("kind", '{"n": 1, "x": 0.5}', ToolContext("t"))).error is None
    r = run(box.execute("kind", '{"n": 1,', ToolContext("t")))
    assert r.error == "parse_error" and "not valid JSON" in r.content


def test_raising_tool_reports_last_line_only() -> None:
    @tool
    def boom(x: int) -> int:
        """Fail."""
        return x // 0

    @tool
    def bye() -> None:
        """Exit."""
        raise SystemExit(3)

    @tool
    async def loud() -> None:
        """Long message."""
        raise RuntimeError("x" * 10_000)

    box = ToolBox([boom, bye, loud])
    r = run(box.execute("boom", {"x": 1}, ToolContext("t")))
    assert (r.error, r.content) == ("exception", "Error: tool 'boom' raised ZeroDivisionError: integer division or modulo by zero")
    r = run(box.execute("bye", {}, ToolContext("t")))
    assert r.error == "exception" and "SystemExit" in r.content
    r = run(box.execute("loud", {}, ToolContext("t")))
    assert r.error == "exception" and r.content.startswith("Error: tool 'loud' raised RuntimeError: xxx")
    assert len(r.content) < 600 and "Traceback" not in r.content


def test_results_converted_to_text() -> None:
    @tool
    def obj(kind: str) -> Any:
        """Return various things."""
        return {"dict": {"a": [1, "é"]}, "list": [1, 2], "int": 3, "none": None, "bytes": b"hi"}[kind]

    box = ToolBox([obj])
    got = [run(box.execute("obj", {"kind": k}, ToolContext("t"))).content for k in ["dict", "list", "int", "none", "bytes"]]
    assert got == ['{"a": [1, "é"]}', "[1, 2]", "3", "None", "hi"]


# --- timeouts and concurrency -------------------------------------------------------------------


def test_sync_timeout_abandons_thread_and_pool_does_not_starve() -> None:
    release = threading.Event()

    @tool(timeout=0.2)
    def hang() -> str:
        """Hang until released."""
        release.wait(60)
        return "late"

    @tool
    def quick() -> str:
        """Quick."""
        return "ok"

    box = ToolBox([hang, quick], default_timeout=30)

    async def go() -> tuple[list[ToolResult], ToolResult]:
        # More hung calls than a default thread pool has workers on a small machine.
        hung = await asyncio.gather(*(box.execute("hang", {}, ToolContext(str(i))) for i in range(12)))
        return hung, await box.execute("quick", {}, ToolContext("q"))

    try:
        hung, after = run(go())
    finally:
        release.set()
    assert all(r.error == "timeout" and r.content == "Error: tool 'hang' timed out after 0.2s." for r in hung)
    assert all(r.latency_s < 30 for r in hung)  # returned at the tool's limit, not the box default
    assert after.content == "ok" and after.error is None


def test_async_timeout_cancels_and_box_default_applies() -> None:
    state: dict[str, bool] = {}

    @tool
    async def slow() -> str:
        """Sleep."""
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            state["cancelled"] = True
            raise
        return "late"

    box = ToolBox([slow], default_timeout=0.1)

    async def go() -> ToolResult:
        r = await box.execute("slow", {}, ToolContext("t"))
        for _ in range(5):
            await asyncio.sleep(0)
        return r

    r = run(go())
    assert r.error == "timeout" and "after 0.1s" in r.content
    assert state == {"cancelled": True}


def test_slow_sync_tool_does_not_block_async_tool() -> None:
    release = threading.Event()
    order: list[str] = []

    @tool
    def blocking() -> str:
        """Block a thread."""
        release.wait(30)
        order.append("blocking")
        return "b"

    @tool
    async def fast() -> str:
        """Fast."""
        order.append("fast")
        return "f"

    box = ToolBox([blocking, fast])

    async def go() -> None:
        slow_task = asyncio.create_task(box.execute("blocking", {}, ToolContext("1")))
        await asyncio.sleep(0)
        assert (await box.execute("fast", {}, ToolContext("2"))).content == "f"
        assert not slow_task.done()  # the event loop ran `fast` while `blocking` held its thread
        release.set()
        assert (await slow_task).content == "b"

    try:
        run(go())
    finally:
        release.set()
    assert order == ["fast", "blocking"]


def test_fifty_concurrent_calls() -> None:
    @tool
    def nap(i: int) -> int:
        """Sleep a little in a thread."""
        time.sleep(0.05)
        return i * i

    @tool
    async def anap(i: int) -> int:
        """Sleep a little on the loop."""
        await asyncio.sleep(0.05)
        return -i

    box = ToolBox([nap, anap])

    async def go() -> list[ToolResult]:
        calls = [box.execute("nap" if i % 2 else "anap", {"i": i}, ToolContext(str(i))) for i in range(50)]
        return await asyncio.gather(*calls)

    t0 = time.perf_counter()
    results = run(go())
    wall = time.perf_counter() - t0
    assert [r.content for r in results] == [str(i * i if i % 2 else -i) for i in range(50)]
    serial = sum(r.latency_s for r in results)
    print(f"50 concurrent calls: wall {wall:.3f}s vs summed latency {serial:.3f}s (ratio {wall / serial:.2f})")
    assert wall < serial / 2  # overlapped, not run one after another


# --- context cleanup ------------------------------------------------------------------------------


def test_close_runs_cleanups_lifo_and_swallows_errors(caplog: pytest.LogCaptureFixture) -> None:
    ran: list[str] = []

    async def async_cleanup() -> None:
        ran.append("async")

    def failing() -> None:
        ran.append("failing")
        raise OSError("disk gone")

    box = ToolBox([])
    ctx = box.new_context("traj-7")
    ctx.on_close(lambda: ran.append("first"))
    ctx.on_close(failing)
    ctx.on_close(async_cleanup)
    with caplog.at_level(logging.WARNING, logger="agentrl.toolbox"):
        run(box.close(ctx))
    assert ran == ["async", "failing", "first"]
    assert "traj-7" in caplog.text and "disk gone" in caplog.text
    run(box.close(ctx))  # second close: nothing left to run
    assert ran == ["async", "failing", "first"]


@pytest.mark.parametrize("module", ["agentrl.toolbox.box", "agentrl.toolbox.schema", "agentrl.toolbox.output"])
def test_documented_examples_run(module: str) -> None:
    import doctest
    import importlib
    import textwrap

    mod = importlib.import_module(module)
    assert doctest.testmod(mod).failed == 0
    example = textwrap.dedent(mod.__doc__.split("Example::")[1])
    exec(compile(example, f"{module} docstring", "exec"), {})
