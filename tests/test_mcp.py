"""MCP servers as tools: listing, calls, rendering, and every failure class, against the toy
stdio server in tests/fixtures/mcp_toy_server.py (standard library only, hostile tools included)
and, over streamable HTTP, the SDK's own server (tests/fixtures/mcp_http_server.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("mcp", reason="needs the mcp package: pip install 'agentrl[mcp]'")

from fixture_paths import FIXTURES  # noqa: E402

from agentrl.toolbox import ToolBox, tool  # noqa: E402
from agentrl.toolbox.mcp import McpServer  # noqa: E402
from agentrl.types import ConfigError, InfraError  # noqa: E402

TOY = str(FIXTURES / "mcp_toy_server.py")
HTTP = str(FIXTURES / "mcp_http_server.py")


def toy(*flags: str, **fields) -> McpServer:
    return McpServer(name="toy", command=sys.executable, args=[TOY, *flags], **fields)


def run(box: ToolBox, name: str, args: dict, ctx=None):
    return asyncio.run(box.execute(name, args, ctx or box.new_context("t")))


def gone(pid: int) -> bool:
    """True once ``pid`` is dead (a zombie counts: nothing runs)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):  # reaped, or reaped while /proc was read
        return True


def wait_gone(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.02)
    return gone(pid)


@tool
def plus(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: first term
        b: second term
    """
    return a + b


@pytest.fixture
def box():
    b = ToolBox([plus, toy()], default_timeout=5, infra_backoff_s=0.05)
    yield b
    b.shutdown()


def test_tools_are_listed_beside_tool_functions(box):
    names = [s["function"]["name"] for s in box.schemas()]
    assert names[:3] == ["plus", "echo", "add"] and "get_pid" in names  # get-pid: made an identifier
    echo = next(s for s in box.schemas() if s["function"]["name"] == "echo")["function"]
    assert echo["description"] == "Echo the text back."
    assert echo["parameters"]["properties"]["text"] == {"type": "string", "description": "what to echo"}
    assert run(box, "echo", {"text": "hi <|im_end|>"}).content == "hi <|im_end|>"  # text as is: encoded literally later
    assert run(box, "plus", {"a": 1, "b": 2}).content == "3"
    assert box.tools["echo"](text="direct") == "direct"


def test_two_tools_of_one_name_are_refused():
    with pytest.raises(ValueError, match="two tools are named 'add'"):
        ToolBox([tool(plus, name="add"), toy(tools=["add"])]).shutdown()


def test_arguments_are_validated_against_the_server_schema(box):
    r = run(box, "echo", {"text": 3})
    assert r.error == "invalid_arguments" and "echo(text: string)" in r.content


def test_structured_content_and_media_are_rendered_as_text():
    b = ToolBox([toy()])
    try:
        # a text block that holds the structured content's JSON: shown once
        assert run(b, "add", {"a": 2, "b": 3}).content == '{"sum": 5}'
        assert run(b, "media", {}).content == (
            "[image: image/png, 100 bytes]\n[audio: audio/wav, 20 bytes]\n"
            "[resource link: file:///data/report.txt (report)]\ninline text\n"
            "[resource: file:///b.bin, application/zip, 8 bytes]\n"
            '{"kind":"média","n":5}')
    finally:
        b.shutdown()


def test_is_error_and_malformed_results_are_observations(box):
    r = run(box, "fail", {})
    assert (r.error, r.content, r.failure) == ("exception", "Error: the file does not exist", None)
    t0 = time.monotonic()
    r = run(box, "malformed", {})
    assert r.error == "exception" and "returned a malformed result" in r.content
    r = run(box, "garbage", {})  # a reply that is not JSON: answered at once, not at the time limit
    assert r.error == "exception" and "malformed reply" in r.content
    assert time.monotonic() - t0 < 2
    r = run(box, "nosuch", {})
    assert r.error == "unknown_tool"
    assert run(box, "echo", {"text": "still here"}).content == "still here"


def test_a_flood_is_capped_and_a_reply_past_the_limit_is_dropped():
    b = ToolBox([toy()], max_output_tokens=50)
    try:
        r = run(b, "flood", {"n": 2_000_000})
        assert r.error is None and r.truncated and len(r.content) <= 200 and "characters cut" in r.content
        t0 = time.monotonic()
        r = run(b, "flood", {"n": 9 << 20})  # over the 8 MiB bound of one reply
        assert r.error == "exception" and "over the limit" in r.content and time.monotonic() - t0 < 5
        assert run(b, "echo", {"text": "ok"}).content == "ok"  # the same server goes on
        assert b.sources[0].starts == 1
    finally:
        b.shutdown()


def test_a_hanging_call_is_a_policy_timeout_and_the_wedged_server_is_replaced():
    b = ToolBox([toy()], default_timeout=1)
    try:
        server = b.sources[0]
        first = server.pid
        t0 = time.monotonic()
        r = run(b, "sleep", {"seconds": 60})
        assert r.error == "timeout" and r.content == "Error: tool 'sleep' timed out after 1s." and r.failure is None
        assert time.monotonic() - t0 < 3
        assert wait_gone(first, 5)  # it did not answer a ping: stopped
        assert run(b, "echo", {"text": "fresh"}).content == "fresh" and server.starts == 2
    finally:
        b.shutdown()


def test_a_crash_mid_call_is_infrastructure_and_the_server_restarts(box):
    r = run(box, "crash", {})  # it crashes every time: retried in place, then the attempt fails
    assert r.error == "infra" and r.failure.cause == "mcp_server_died" and r.failure.source == "tool:crash"
    assert len(r.retried) == 2 and "segfault in the tool" in r.failure.message
    r = run(box, "counter", {})
    assert (r.error, r.content) == (None, "1")  # a new server (its count starts again)


def test_a_server_killed_between_calls_is_restarted_before_the_next_call(box):
    server = box.sources[0]
    os.killpg(server.pid, signal.SIGKILL)
    assert wait_gone(server.pid)
    deadline = time.monotonic() + 5
    while server._shared.alive and time.monotonic() < deadline:  # the launcher's exit, once reaped
        time.sleep(0.02)
    r = run(box, "echo", {"text": "back"})
    assert (r.error, r.content, r.retried) == (None, "back", []) and server.starts == 2


def test_start_failures_name_the_cause():
    t0 = time.monotonic()
    with pytest.raises(InfraError, match="did not answer initialize") as e:
        ToolBox([toy("--no-initialize", start_timeout=1)])
    assert e.value.cause == "mcp_server_start_failed" and time.monotonic() - t0 < 4
    with pytest.raises(InfraError, match=r"exit status 2; its stderr ends: toy server: cannot open its database"):
        ToolBox([toy("--die-on-start")])
    with pytest.raises(ConfigError, match=r"command 'mcp-server-nope' not found on PATH.*pip install"):
        ToolBox([McpServer(name="nope", command="mcp-server-nope")])
    with pytest.raises(ConfigError, match=r"tool 'broken': its input schema is not a valid JSON schema"):
        ToolBox([toy("--bad-schema")])
    with pytest.raises(ConfigError, match=r"no tool 'ech'; its tools: echo, add"):
        ToolBox([toy(tools=["echo", "ech"])])


def test_a_server_that_cannot_restart_is_infrastructure():
    # one in-place retry: a call that reaches the dead server before its death is noticed fails
    # as mcp_server_died, and the retry then meets the restart that cannot start
    b = ToolBox([toy()], infra_retries=1, infra_backoff_s=0)
    try:
        server = b.sources[0]
        server.spec.args.append("--die-on-start")  # every later start fails
        os.killpg(server.pid, signal.SIGKILL)
        assert wait_gone(server.pid)
        r = run(b, "echo", {"text": "x"})
        assert r.error == "infra" and r.failure.cause == "mcp_server_start_failed"
    finally:
        b.shutdown()


def test_only_listed_tools_with_a_prefix():
    b = ToolBox([toy(tools=["echo", "get-pid"], prefix="toy_")])
    try:
        assert list(b.tools) == ["toy_echo", "toy_get_pid"]
        assert run(b, "toy_echo", {"text": "p"}).content == "p"
    finally:
        b.shutdown()


def test_lifecycle_attempt_gives_each_attempt_its_own_server():
    b = ToolBox([toy(lifecycle="attempt")], infra_backoff_s=0.05)
    server = b.sources[0]

    async def attempts():
        one, two = b.new_context("a"), b.new_context("b")
        counts = [(await b.execute("counter", {}, c)).content for c in (one, two, one, one)]
        pid = int((await b.execute("get_pid", {}, one)).content)
        late = await b.execute("crash", {}, one)  # its state is gone: the attempt reruns
        await b.close(one)
        await b.close(two)
        fresh = b.new_context("c")
        first = await b.execute("crash", {}, fresh)  # nothing lost on a first call: retried in place
        await b.close(fresh)
        return counts, pid, late, first

    try:
        counts, pid, late, first = asyncio.run(attempts())
        assert counts == ["1", "1", "2", "3"]
        assert late.error == "infra" and late.failure.cause == "mcp_server_died" and late.retried == []
        assert "state is lost" in late.failure.message
        assert first.error == "infra" and len(first.retried) == 2
        assert wait_gone(pid)
        assert server.pid is None  # no server of the run's own
    finally:
        b.shutdown()


def test_shutdown_stops_the_server(box):
    pid = int(run(box, "get_pid", {}).content)
    box.shutdown()
    assert wait_gone(pid)
    box.shutdown()  # twice is fine


PARENT = """
import json, sys, time
from agentrl.toolbox import ToolBox
from agentrl.toolbox.mcp import McpServer
box = ToolBox([McpServer(name="toy", command=sys.executable, args=[sys.argv[1]], lifecycle=sys.argv[2])])
import asyncio
ctx = box.new_context("t")
pid = asyncio.run(box.execute("get_pid", {}, ctx)).content
print(pid, flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("lifecycle", ["run", "attempt"])
def test_no_server_outlives_a_sigkilled_trainer(lifecycle):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, TOY, lifecycle], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(parent.stdout.readline())
        assert not gone(pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert wait_gone(pid, 3), f"the server {pid} outlived its trainer"
    finally:
        parent.kill()


def test_overhead_of_an_mcp_call_against_a_tool_function(box, capsys):
    async def calls(name, args, n=300):
        ctx = box.new_context("t")
        await box.execute(name, args, ctx)
        t0 = time.perf_counter()
        for _ in range(n):
            await box.execute(name, args, ctx)
        return (time.perf_counter() - t0) / n

    local = asyncio.run(calls("plus", {"a": 1, "b": 2}))
    remote = asyncio.run(calls("echo", {"text": "x"}))
    with capsys.disabled():
        print(f"\n@tool call {local * 1e3:.3f} ms, MCP stdio call {remote * 1e3:.3f} ms")
    assert remote < 0.05  # a round trip through the MCP loop and a pipe, not a process start


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def http_url():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, HTTP, str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/mcp", proc
    proc.kill()
    proc.wait()


@pytest.mark.parametrize("lifecycle", ["run", "attempt"])
def test_streamable_http_server(http_url, lifecycle):
    url, proc = http_url
    b = ToolBox([McpServer(name="web", url=url, lifecycle=lifecycle)], infra_retries=1, infra_backoff_s=0.05)
    try:
        assert list(b.tools) == ["shout"]
        assert run(b, "shout", {"text": "hi"}).content == "HI"  # {"result": "HI"} is that text: shown once
        proc.kill()
        proc.wait()
        r = run(b, "shout", {"text": "hi"})
        assert r.error == "infra" and r.failure.cause in ("mcp_connection_lost", "mcp_server_start_failed")
    finally:
        b.shutdown()


def test_run_config_lists_servers(tmp_path):
    from agentrl.run.config import load_config
    from agentrl.toolbox.mcp import McpServerConfig

    path = tmp_path / "cfg.yaml"
    path.write_text("tools:\n  mcp:\n    - {name: calc, command: .venv-mcp/bin/python, args: [-m, mcp_server_calculator]}\n"
                    "    - {name: web, url: 'http://127.0.0.1:9/mcp', lifecycle: attempt, timeout: 3}\n")
    cfg = load_config(path)
    assert cfg.tools.mcp == [McpServerConfig(name="calc", command=".venv-mcp/bin/python", args=["-m", "mcp_server_calculator"]),
                             McpServerConfig(name="web", url="http://127.0.0.1:9/mcp", lifecycle="attempt", timeout=3.0)]
    with pytest.raises(ConfigError, match=r"tools.mcp\[0\].lifecycle: 'trial' is not one of \['run', 'attempt'\]"):
        load_config(None, ["tools.mcp=[{name: a, command: x, lifecycle: trial}]"])
    with pytest.raises(ConfigError, match="give a command .* or a url"):
        load_config(None, ["tools.mcp=[{name: a}]"])
    with pytest.raises(ConfigError, match=r"unknown config key 'tools.mcp\[0\].cmd'"):
        load_config(None, ["tools.mcp=[{name: a, cmd: x}]"])


def test_a_dropped_toolbox_takes_its_server_with_it():
    import gc

    b = ToolBox([toy()])
    pid = int(run(b, "get_pid", {}).content)
    del b
    gc.collect()  # the tools and their server refer to each other: a cycle
    assert wait_gone(pid)


@pytest.mark.parametrize("lifecycle", ["run", "attempt"])
def test_concurrent_attempts(lifecycle):
    b = ToolBox([toy(lifecycle=lifecycle)])

    async def attempt(i: int) -> list[str]:
        ctx = b.new_context(f"a{i}")
        try:
            return [(await b.execute("echo", {"text": f"{i}-{k}"}, ctx)).content for k in range(3)]
        finally:
            await b.close(ctx)

    async def all_of_them():
        return await asyncio.gather(*(attempt(i) for i in range(16)))

    try:
        assert asyncio.run(all_of_them()) == [[f"{i}-{k}" for k in range(3)] for i in range(16)]
        assert b.sources[0].starts == (1 if lifecycle == "run" else 17)  # the probe, then one per attempt
    finally:
        b.shutdown()


TRAINER = """
import subprocess, sys
subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], start_new_session=True).wait()
"""
LAUNCHER_WITHOUT_PIDFD = """
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("launcher", sys.argv[1])
launcher = importlib.util.module_from_spec(spec)
spec.loader.exec_module(launcher)
launcher._pidfd = lambda pid: None  # as on a kernel without pidfds: the parent pid is polled
server = "import os, time; print(os.getpid(), flush=True); time.sleep(120)"
sys.exit(launcher.main([str(os.getppid()), "--", sys.executable, "-c", server]))
"""


def test_the_launcher_without_pidfds_polls_its_parent():
    from agentrl.toolbox.mcp.stdio import LAUNCHER

    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, LAUNCHER_WITHOUT_PIDFD, str(LAUNCHER)],
                               stdout=subprocess.PIPE, text=True)
    try:
        pid = int(trainer.stdout.readline())
        assert not gone(pid)
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
        assert wait_gone(pid, 3), f"the server {pid} outlived its trainer"
    finally:
        trainer.kill()


def test_without_the_mcp_package_the_error_names_the_install():
    code = ("import sys; sys.modules['mcp'] = None\n"  # as if it were not installed
            "from agentrl.run.build import mcp_servers\nfrom agentrl.run.config import load_config\n"
            "from agentrl.types import ConfigError\n"
            "cfg = load_config(None, ['tools.mcp=[{name: t, command: mcp-server-time}]'])\n"
            "try:\n    mcp_servers(cfg)\nexcept ConfigError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert "tools.mcp lists 1 server(s), but MCP tools need the mcp package" in out
    assert "pip install 'agentrl[mcp]'" in out
