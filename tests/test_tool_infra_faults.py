"""The built-in tools tell the infrastructure's faults from the model's (issue 28).

A fault of the host or a service raises ``agentrl.InfraError``: a stateless call's fault is
``retryable`` (the ToolBox runs the same call again in place), one that took the trajectory's
state with it is not (error ``infra``: the run retries the attempt); either way it is never
scored. What the model's code or query did stays an observation, exactly as before. Most
tests build the ToolBox with ``infra_retries=0`` to see the fault itself. Every fault is provoked
for real, through a real ToolBox: the fork server, a stateful interpreter or a sandbox's
launcher SIGKILLed from here while the code runs (found in /proc, not through the tool's
internals), a sandbox that cannot start (no free uid, no descriptors, a process limit its
launch cannot meet), a search index corrupted, truncated, removed or replaced by a directory,
web search through a proxy that refuses, never answers or rate-limits, and a local stand-in of
the E2B service (the real SDK talks HTTP to it) that is stopped, rejects the key or loses the
sandbox. After each fault the tool serves the next call.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

import pytest
from isolation_levels import level_params

from agentrl import InfraError
from agentrl.toolbox import ToolBox, ToolResult
from agentrl.tools.corpus import Document, SearchUnavailable, write_jsonl
from agentrl.tools.python import python_tool
from agentrl.tools.sandbox import SandboxConfig
from agentrl.tools.search import EMPTY_QUERY, NO_RESULTS, LocalBackend, search_tools

UID_BASE, UID_COUNT = 2_000_000, 128
CFG = SandboxConfig(timeout=4.0, uid_base=UID_BASE, uid_count=UID_COUNT)
ROOT = os.geteuid() == 0
SLEEPING = "import time; time.sleep(30); print('not reached')"  # found by its wait channel while it sleeps


@pytest.fixture(scope="module", params=level_params())
def level(request: pytest.FixtureRequest) -> str:
    return request.param


def python_box(level: str = "auto", mode: str = "fresh", retries: int = 0, **changes: object):  # noqa: ANN201
    if not ROOT:
        pytest.skip("the sandbox's uid leases, fork server and kills from outside need root")
    try:
        tool = python_tool(mode=mode, config=dataclasses.replace(CFG, isolation=level, **changes))  # type: ignore[arg-type]
    except RuntimeError as exc:
        pytest.skip(f"isolation level {level} not available here: {exc}")
    return ToolBox([tool], infra_retries=retries, infra_backoff_s=0.0), tool


def run(box: ToolBox, ctx: object, code: str) -> ToolResult:
    return asyncio.run(box.execute("python", {"code": code}, ctx))  # type: ignore[arg-type]


def infra(r: ToolResult, cause: str, tool: str = "python") -> str:
    """Assert ``r`` is an infrastructure failure with ``cause``; its message."""
    assert r.error == "infra" and r.failure is not None, (r.error, r.content)
    assert r.failure.cause == cause and r.failure.source == f"tool:{tool}", r.failure
    return r.failure.message


def policy(r: ToolResult, expected: str) -> None:
    """Assert ``r`` is an observation (the model's outcome) containing ``expected``."""
    assert r.error is None and r.failure is None, (r.error, r.content)
    assert expected in r.content, r.content


# --- processes, found in /proc --------------------------------------------------------------------


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, uid) of a live process, None when gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        if fields[0] in (b"Z", b"X"):
            return None
        return int(fields[1]), os.stat(f"/proc/{pid}").st_uid
    except (OSError, IndexError, ValueError):
        return None


def _sleeping(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/wchan") as f:
            return "nanosleep" in f.read()  # in time.sleep, not waiting for its next cell
    except OSError:
        return False


def sandbox_pids(sleeping: bool = False) -> list[int]:
    """Live processes of the sandbox uids of this module (only those in ``time.sleep``)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st and UID_BASE <= st[1] < UID_BASE + UID_COUNT and (not sleeping or _sleeping(int(entry))):
                out.append(int(entry))
    return out


def launcher_of(pid: int) -> int:
    """The sandbox's launcher: the ancestor of ``pid`` that this process started."""
    while True:
        st = _stat(pid)
        assert st is not None, f"process {pid} vanished"
        if st[0] == os.getpid():
            return pid
        pid = st[0]


def server_of(pid: int) -> int:
    """The fork server: the parent of a call's process (root, unlike the call)."""
    st = _stat(pid)
    assert st is not None
    server = _stat(st[0])
    assert server is not None and server[1] == 0, "the call's parent is not the root fork server"
    return st[0]


def kill_while_busy(box: ToolBox, ctx: object, victim: Callable[[int], int],
                    code: str = SLEEPING) -> tuple[ToolResult, int]:
    """Run ``code``; once its process is asleep, SIGKILL ``victim(its pid)`` (once)."""
    killed: list[int] = []

    def killer() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            busy = sandbox_pids(sleeping=True)
            if busy:
                target = victim(busy[0])
                os.kill(target, signal.SIGKILL)
                killed.append(target)
                return
            time.sleep(0.005)

    t = threading.Thread(target=killer)
    t.start()
    r = run(box, ctx, code)
    t.join()
    assert killed, "the code never started"
    return r, killed[0]


def no_sandbox_left() -> None:
    deadline = time.monotonic() + 3
    while sandbox_pids(sleeping=True) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sandbox_pids(sleeping=True) == []


# --- the python tool, local sandbox: the host's faults --------------------------------------------


@pytest.mark.parametrize("victim", ["server", "launcher"])
def test_fork_server_killed_mid_call_is_infra_and_the_next_call_gets_a_new_server(level: str, victim: str) -> None:
    box, tool = python_box(level)
    ctx = box.new_context("t")
    try:
        policy(run(box, ctx, "print('warm')"), "warm")
        servers = tool.executor.forkservers
        started = servers.started
        r, _ = kill_while_busy(box, ctx, server_of if victim == "server" else launcher_of)
        assert "killed from outside" in infra(r, "sandbox_server_died")
        assert r.latency_s < CFG.timeout  # told at once, not at the time limit
        no_sandbox_left()
        nxt = run(box, ctx, "print('next')")
        assert nxt.error is None and nxt.content == "next\n"
        assert servers.started == started + 1
    finally:
        tool.executor.close()


def test_fork_server_killed_mid_call_is_retried_in_place() -> None:
    """A fresh call keeps nothing: the ToolBox runs it again on a new server, the attempt goes on."""
    box, tool = python_box(retries=1)
    ctx = box.new_context("t")
    try:
        policy(run(box, ctx, "print('warm')"), "warm")
        r, _ = kill_while_busy(box, ctx, server_of, code="import time; time.sleep(1); print('done')")
        policy(r, "done\n")
        assert [f.cause for f in r.retried] == ["sandbox_server_died"]
    finally:
        tool.executor.close()


def test_fresh_interpreter_killed_mid_call_is_infra(level: str) -> None:
    box, tool = python_box(level, fork_server=False)
    ctx = box.new_context("t")
    r, _ = kill_while_busy(box, ctx, launcher_of)
    assert "killed from outside" in infra(r, "sandbox_killed") and r.latency_s < CFG.timeout
    no_sandbox_left()
    assert run(box, ctx, "print('next')").content == "next\n"


def test_stateful_worker_killed_mid_call_is_infra_and_a_new_one_starts(level: str) -> None:
    box, tool = python_box(level, mode="stateful", retries=2)
    ctx = box.new_context("t")
    try:
        policy(run(box, ctx, "x = 41"), "(no output)")
        r, _ = kill_while_busy(box, ctx, launcher_of)
        assert "its variables are gone" in infra(r, "sandbox_killed") and r.latency_s < CFG.timeout
        assert r.retried == []  # not retryable: the session's state died with it, only the attempt can rerun
        no_sandbox_left()
        nxt = run(box, ctx, "print('next')")
        policy(nxt, "next\n[the interpreter was restarted")
    finally:
        asyncio.run(box.close(ctx))


def test_a_new_stateful_worker_killed_mid_call_is_retried_in_place() -> None:
    """Killed during the session's first call, the worker held no state: the same call again."""
    box, tool = python_box(mode="stateful", retries=1)
    ctx = box.new_context("t")
    try:
        r, _ = kill_while_busy(box, ctx, launcher_of, code="import time; time.sleep(1); print('done')")
        assert r.error is None and r.content == "done\n", r.content  # no "restarted" note: nothing was lost
        assert [f.cause for f in r.retried] == ["sandbox_killed"]
    finally:
        asyncio.run(box.close(ctx))


def test_stateful_worker_killed_between_calls_is_infra(level: str) -> None:
    box, tool = python_box(level, mode="stateful", retries=2)
    ctx = box.new_context("t")
    try:
        policy(run(box, ctx, "x = 41"), "(no output)")
        launcher = launcher_of(sandbox_pids()[0])  # the worker (or its lifeline watcher): one sandbox
        os.kill(launcher, signal.SIGKILL)
        while _stat(launcher) is not None:  # a zombie until the tool reaps it
            time.sleep(0.01)
        r = run(box, ctx, "print(x + 1)")
        assert "between calls" in infra(r, "sandbox_killed") and r.retried == []
        policy(run(box, ctx, "print('fresh')"), "fresh\n[the interpreter was restarted")
    finally:
        asyncio.run(box.close(ctx))


@pytest.mark.parametrize("mode", ["fresh", "stateful"])
def test_a_sandbox_that_exits_before_it_reads_the_code_is_infra(mode: str) -> None:
    """A process limit the launch itself cannot meet (its lifeline watcher cannot fork): the
    sandbox dies before it reads the code, so none of the model's code ran. (The fork server's
    calls do not fork before the code at the namespace levels, so one interpreter per call.)"""
    box, tool = python_box(mode=mode, fork_server=False, max_processes=1, retries=1)
    ctx = box.new_context("t")
    try:
        for _ in range(2):  # and again on the next call: nothing is left in a bad state
            r = run(box, ctx, "print('never runs')")
            msg = infra(r, "sandbox_start_failed")
            assert "exited before it read the code" in msg and "BlockingIOError" in msg, msg
            assert [f.cause for f in r.retried] == ["sandbox_start_failed"]  # retryable: retried once, in vain
    finally:
        asyncio.run(box.close(ctx))


def test_no_free_sandbox_uid_is_infra_until_one_is_released() -> None:
    box, tool = python_box(uid_count=1)
    stateful = ToolBox([tool.with_settings(mode="stateful")], infra_retries=0)
    held = stateful.new_context("holder")
    ctx = box.new_context("t")
    try:
        policy(run(stateful, held, "y = 1"), "(no output)")  # holds the only uid
        assert "no sandbox uid could be leased" in infra(run(box, ctx, "print(1)"), "sandbox_start_failed")
        asyncio.run(stateful.close(held))
        policy(run(box, ctx, "print(1)"), "1\n")
    finally:
        asyncio.run(stateful.close(held))
        tool.executor.close()


FD_SCRIPT = r"""
import asyncio, json, os, resource
from agentrl.toolbox import ToolBox
from agentrl.tools.python import python_tool
from agentrl.tools.sandbox import SandboxConfig
cfg = SandboxConfig(timeout=4.0, uid_base=%d, uid_count=%d)
boxes = {"fork": ToolBox([python_tool(config=cfg)], infra_retries=0),
         "percall": ToolBox([python_tool(config=cfg, fork_server=False)], infra_retries=0),
         "stateful": ToolBox([python_tool(config=cfg, mode="stateful")], infra_retries=0)}
ctxs = {k: b.new_context(k) for k, b in boxes.items()}
loop = asyncio.new_event_loop()
call = lambda k, code: loop.run_until_complete(boxes[k].execute("python", {"code": code}, ctxs[k]))
for k in boxes:
    assert call(k, "print(1)").content == "1\n"
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 4096), hard))  # quick to exhaust
hog = []
try:
    while True:
        hog.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass
out = {}
for k in boxes:
    r = call(k, "print(2)")
    out[k] = [r.error, r.failure and r.failure.cause, r.failure and r.failure.message]
for fd in hog:
    os.close(fd)
for k in boxes:
    r = call(k, "print(3)")
    out[k + "_after"] = [r.error, r.content]
print(json.dumps(out))
""" % (UID_BASE, UID_COUNT)


def test_no_file_descriptors_left_is_infra_and_the_tool_recovers() -> None:
    """The trainer out of descriptors (in a child process: every descriptor it may open is taken)."""
    if not ROOT:
        pytest.skip("needs root")
    done = subprocess.run([sys.executable, "-c", FD_SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for k in ("fork", "percall", "stateful"):
        error, cause, message = out[k]
        assert (error, cause) == ("infra", "sandbox_start_failed") and "Too many open files" in message, out[k]
        error, content = out[k + "_after"]
        assert error is None and content.startswith("3\n"), out[k + "_after"]


# --- the python tool: the model's own outcomes stay observations -----------------------------------

# (code, what fresh mode says, what stateful mode says); none of them is an infrastructure failure.
POLICY = [
    ("raise ValueError('boom')", "ValueError: boom", "ValueError: boom"),
    ("while True: pass", "[stopped: the code ran past the 1s time limit]", "[stopped: the code ran past the 1s time limit]"),
    ("import os; os._exit(3)", "[exit code 3]", "[the interpreter exited (status 3)"),
    ("import sys; sys.exit(4)", "[exit code 4]", "SystemExit: 4"),
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "[the process was killed by signal SIGKILL]",
     "[the interpreter exited (status -9)"),
    ("import os, signal; os.killpg(0, signal.SIGKILL)", "[the process was killed by signal SIGKILL]",
     "[the interpreter exited (status -9)"),
    ("import os\ntry:\n    os.kill(os.getppid(), 9)\nexcept OSError as e:\n    print('out of reach:', type(e).__name__)",
     "out of reach: PermissionError", "out of reach: PermissionError"),  # its supervisor is root: not the code's to kill
    ("print('x' * 3_000_000)", "[stopped: the code printed more than", "[stopped: the code printed more than"),
    ("b = bytearray(8 << 30)", "MemoryError", "MemoryError"),
]


@pytest.mark.parametrize("mode,fork_server", [("fresh", True), ("fresh", False), ("stateful", True)],
                         ids=["fork", "percall", "stateful"])
def test_the_codes_own_failures_stay_observations(mode: str, fork_server: bool) -> None:
    box, tool = python_box(mode=mode, fork_server=fork_server, timeout=1.0)
    ctx = box.new_context("t")
    try:
        for code, fresh, stateful in POLICY:
            policy(run(box, ctx, code), fresh if mode == "fresh" else stateful)
            policy(run(box, ctx, "print('still serving')"), "still serving")
    finally:
        asyncio.run(box.close(ctx))
        if tool.executor is not None:
            tool.executor.close()


def test_a_thread_the_code_left_behind_ending_the_worker_is_the_codes_doing() -> None:
    box, tool = python_box(mode="stateful")
    ctx = box.new_context("t")
    try:
        policy(run(box, ctx, "import os, threading; threading.Timer(0.2, os._exit, (5,)).start(); x = 1"), "(no output)")
        time.sleep(0.8)
        policy(run(box, ctx, "print('after')"), "after\n[the interpreter was restarted")
    finally:
        asyncio.run(box.close(ctx))


# --- the search tools: the local index ----------------------------------------------------------------


@pytest.fixture()
def local(tmp_path: Path) -> tuple[ToolBox, LocalBackend, Path]:
    corpus = tmp_path / "c.jsonl"
    write_jsonl([Document("vell", "Vell", "Vell is a river town known for copper bells."),
                 Document("orm", "Orm", "Orm is a mountain pass with old stone bridges.")], corpus)
    backend = LocalBackend(corpus, cache_dir=tmp_path / "cache")
    return ToolBox(search_tools(backend), infra_retries=0), backend, backend.index.path  # type: ignore[union-attr]


def search(box: ToolBox, query: str) -> ToolResult:
    return asyncio.run(box.execute("search", {"query": query}, box.new_context("t")))


def test_corrupt_index_is_infra_and_is_rebuilt_on_the_next_call(local) -> None:  # noqa: ANN001
    box, backend, path = local
    policy(search(box, "copper bells"), "1. Vell (id: vell)")
    with open(path, "r+b") as f:  # the same file, overwritten: the pooled connection reads garbage
        f.write(b"this is no longer a database " * 200)
    msg = infra(search(box, "copper bells"), "search_index_unreadable", "search")
    assert str(path) in msg and "rebuilds it on its next call" in msg
    policy(search(box, "copper bells"), "1. Vell (id: vell)")


def test_corrupt_index_is_retried_in_place_and_the_attempt_goes_on(local) -> None:  # noqa: ANN001
    _, backend, path = local
    box = ToolBox(search_tools(backend), infra_backoff_s=0.0)  # the default: retryable faults run again
    with open(path, "r+b") as f:
        f.write(b"garbage " * 500)
    r = search(box, "copper bells")
    policy(r, "1. Vell (id: vell)")
    assert [f.cause for f in r.retried] == ["search_index_unreadable"]


def test_truncated_index_is_infra_for_search_and_open(local) -> None:  # noqa: ANN001
    box, backend, path = local
    os.truncate(path, 0)
    infra(asyncio.run(box.execute("open", {"id": "vell"}, box.new_context("t"))), "search_index_unreadable", "open")
    r = asyncio.run(box.execute("open", {"id": "vell"}, box.new_context("t")))
    policy(r, "Vell is a river town")


def test_removed_index_is_infra_and_is_rebuilt(local) -> None:  # noqa: ANN001
    box, backend, path = local
    backend.index.close()  # no pooled connection holds the old file open
    path.unlink()
    infra(search(box, "copper"), "search_index_unreadable", "search")
    policy(search(box, "copper"), "1. Vell")
    assert path.is_file()


def test_directory_in_place_of_the_index_is_infra_until_it_is_gone(local) -> None:  # noqa: ANN001
    box, backend, path = local
    backend.index.close()
    path.unlink()
    path.mkdir()
    infra(search(box, "copper"), "search_index_unreadable", "search")
    msg = infra(search(box, "copper"), "search_index_unavailable", "search")  # the rebuild cannot replace it
    assert "could not be reopened or rebuilt" in msg and "IsADirectoryError" in msg, msg
    path.rmdir()
    policy(search(box, "copper"), "1. Vell")


def test_queries_that_find_nothing_stay_observations(local) -> None:  # noqa: ANN001
    box, backend, path = local
    policy(search(box, "zeppelin quasar"), NO_RESULTS)
    policy(search(box, "   "), EMPTY_QUERY)
    policy(search(box, '"NEAR( AND OR *'), NO_RESULTS)
    r = asyncio.run(box.execute("open", {"id": "no-such-doc"}, box.new_context("t")))
    policy(r, "No document with id 'no-such-doc'")


# --- the search tools: web search through ddgs ------------------------------------------------------


@contextlib.contextmanager
def proxy(answer: bytes | None):
    """A local HTTP proxy: answers every request with ``answer``, or never answers (None)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(32)
    server.settimeout(0.1)
    stop = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            if answer is None:
                held.append(conn)
                continue
            try:
                conn.recv(65536)
                conn.sendall(answer)
            except OSError:
                pass
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        t.join()
        for c in held:
            c.close()
        server.close()


def _ddgs_box(proxy_url: str, timeout: float = 2.0) -> ToolBox:
    pytest.importorskip("ddgs")
    return ToolBox(search_tools("ddgs", timeout=timeout, backoff=0.1, proxy=proxy_url), infra_retries=0)


def test_web_search_rate_limited_is_infra() -> None:
    with proxy(b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 0\r\nConnection: close\r\n\r\n") as url:
        msg = infra(search(_ddgs_box(url), "python"), "web_search_rate_limited", "search")
    # the status reaches the message only when ddgs's HTTP client reports it (not every backend does)
    assert msg.startswith("Web search is rate-limited")


def test_web_search_that_never_answers_is_infra_within_its_timeout() -> None:
    with proxy(None) as url:
        box = _ddgs_box(url, timeout=1.0)
        start = time.monotonic()
        infra(search(box, "python"), "web_search_timeout", "search")
        assert time.monotonic() - start < 1.0 + 0.5


def test_web_page_that_cannot_be_fetched_is_the_models_choice() -> None:
    """The URL is the model's: one that does not resolve or answers is an observation (a network
    that is down fails the search that found the URL first, as infra)."""
    with proxy(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n") as url:
        box = _ddgs_box(url)
        r = asyncio.run(box.execute("open", {"id": "https://no-such-host.invalid/page"}, box.new_context("t")))
    policy(r, "Could not open https://no-such-host.invalid/page:")


def test_ddgs_errors_map_to_causes_and_no_results_stays_empty() -> None:
    exc = pytest.importorskip("ddgs.exceptions")
    from agentrl.tools.search_ddgs import call_with_retries

    def failing(error: BaseException) -> Callable[[float], object]:
        def fn(seconds_left: float) -> object:
            raise error
        return fn

    with pytest.raises(SearchUnavailable) as info:
        call_with_retries(failing(exc.RatelimitException("202 Ratelimit")), timeout=2, backoff=0.01, empty=[])
    assert isinstance(info.value, InfraError) and info.value.cause == "web_search_rate_limited"
    with pytest.raises(SearchUnavailable) as info:
        call_with_retries(failing(exc.DDGSException("unexpected page layout")), timeout=2, backoff=0.01, empty=[])
    assert info.value.cause == "web_search_error"
    assert call_with_retries(failing(exc.DDGSException("No results found.")), timeout=2, empty=[]) == []


# --- the python tool on E2B: a local stand-in of the service -----------------------------------------


class E2BStandIn:
    """The HTTP surface of E2B the SDK uses (create a sandbox, contexts, execute, health, kill),
    served here; it runs the code in this process. ``stop()`` closes it and every connection
    (a dropped connection mid-call); ``start()`` serves again on the same port."""

    def __init__(self) -> None:
        self.reject_key = False
        self.sandbox_gone = False
        self.lose_next = 0  # how many more executes find their sandbox gone
        self.port = 0
        self.live: set[socket.socket] = set()
        self.server: ThreadingHTTPServer | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                outer.live.add(self.connection)

            def finish(self) -> None:
                outer.live.discard(self.connection)
                with contextlib.suppress(OSError):
                    super().finish()

            def reply(self, code: int, obj: object = None) -> None:
                body = b"" if obj is None else json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if self.path == "/v2/sandboxes":
                    if outer.reject_key:
                        return self.reply(401, {"code": 401, "message": "Invalid API key"})
                    return self.reply(201, {"templateID": "code-interpreter-v1", "sandboxID": "sbx1",
                                            "clientID": "c1", "envdVersion": "0.2.4", "envdAccessToken": "t"})
                if self.path == "/contexts":
                    return self.reply(200, {"id": "ctx1", "language": "python", "cwd": "/home/user"})
                if self.path != "/execute":
                    return self.reply(404, {"message": "not found"})
                if outer.sandbox_gone or outer.lose_next > 0:  # what E2B answers for a sandbox past its lifetime
                    outer.lose_next -= 1
                    return self.reply(502, {"message": "sandbox not running"})
                self.send_response(200)
                self.send_header("Content-Type", "application/x-ndjson")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                out = io.StringIO()
                with contextlib.redirect_stdout(out):
                    try:
                        exec(body["code"], {})  # noqa: S102 - the tests' own code, standing in for the sandbox
                        lines = []
                    except Exception as e:  # noqa: BLE001 - the code's error, as E2B reports it
                        lines = [{"type": "error", "name": type(e).__name__, "value": str(e),
                                  "traceback": f"{type(e).__name__}: {e}"}]
                if out.getvalue():
                    lines.insert(0, {"type": "stdout", "text": out.getvalue(), "timestamp": "2025-01-01T00:00:00Z"})
                with contextlib.suppress(OSError):
                    for line in lines:
                        data = (json.dumps(line) + "\n").encode()
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.write(b"0\r\n\r\n")

            def do_GET(self) -> None:  # noqa: N802 - envd's health check
                self.reply(204)

            def do_DELETE(self) -> None:  # noqa: N802 - kill
                self.reply(204)

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        assert self.server is not None
        self.server.shutdown()
        self.server.server_close()
        for conn in list(self.live):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


@pytest.fixture()
def e2b(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    pytest.importorskip("e2b_code_interpreter")
    service = E2BStandIn()
    monkeypatch.setenv("E2B_API_KEY", "e2b_test_key")
    monkeypatch.setenv("E2B_API_URL", service.url)
    monkeypatch.setenv("E2B_SANDBOX_URL", service.url)
    monkeypatch.setenv("E2B_HTTP_VERSION", "1.1")
    yield service
    with contextlib.suppress(Exception):
        service.stop()


@pytest.mark.parametrize("mode", ["stateful", "fresh"])
def test_e2b_the_codes_outcomes_stay_observations(e2b: E2BStandIn, mode: str) -> None:
    box = ToolBox([python_tool(backend="e2b", mode=mode, timeout=1.0)], infra_retries=0)
    ctx = box.new_context("t")
    policy(run(box, ctx, "print(6 * 7)"), "42\n")
    policy(run(box, ctx, "1 / 0"), "ZeroDivisionError: division by zero")
    policy(run(box, ctx, "import time; time.sleep(2.5)"), "[stopped: the code ran past the 1s time limit]")
    asyncio.run(box.close(ctx))


def test_e2b_connection_dropped_mid_call_is_infra_and_a_new_sandbox_opens_later(e2b: E2BStandIn) -> None:
    tool = python_tool(backend="e2b", mode="stateful", timeout=5.0)
    box, once = ToolBox([tool]), ToolBox([tool], infra_retries=0)
    ctx = box.new_context("t")
    policy(run(box, ctx, "print('up')"), "up\n")
    timer = threading.Timer(0.5, e2b.stop)
    timer.start()
    r = run(box, ctx, "import time; time.sleep(30)")
    timer.join()
    # told before the code's time limit (the SDK first checks, in vain, whether the sandbox still runs)
    assert "connection to the E2B sandbox failed" in infra(r, "e2b_connection_lost") and r.latency_s < 5.0
    assert r.retried == []  # not retryable: the sandbox took the session's variables and files with it
    assert "could not start an E2B sandbox" in infra(run(once, ctx, "print(1)"), "e2b_create_failed")  # still down
    e2b.start()  # back, on the same port
    policy(run(box, ctx, "print('back')"), "back\n")


def test_e2b_key_rejected_mid_run_is_infra(e2b: E2BStandIn) -> None:
    box = ToolBox([python_tool(backend="e2b", timeout=2.0)], infra_retries=0)
    policy(run(box, box.new_context("a"), "print(1)"), "1\n")
    e2b.reject_key = True  # the key was revoked while the run went on
    msg = infra(run(box, box.new_context("b"), "print(1)"), "e2b_auth")
    assert "rejected the API key" in msg and "E2B_API_KEY" in msg


def test_e2b_sandbox_lost_before_the_time_limit_is_infra(e2b: E2BStandIn) -> None:
    box = ToolBox([python_tool(backend="e2b", mode="stateful", timeout=5.0)])
    ctx = box.new_context("t")
    policy(run(box, ctx, "print(1)"), "1\n")
    e2b.sandbox_gone = True
    r = run(box, ctx, "print(2)")
    infra(r, "e2b_sandbox_lost")
    assert r.latency_s < 5.0 and r.retried == []  # it had run a call: not retryable


def test_e2b_sandbox_lost_on_its_first_call_is_retried_in_place(e2b: E2BStandIn) -> None:
    """A sandbox that ran nothing yet held nothing: the same call again, in a new sandbox."""
    box = ToolBox([python_tool(backend="e2b", mode="stateful", timeout=5.0)], infra_retries=1, infra_backoff_s=0.0)
    e2b.lose_next = 1  # the next execute finds its sandbox gone, the one after works
    r = run(box, box.new_context("t"), "print('ran')")
    policy(r, "ran\n")
    assert [f.cause for f in r.retried] == ["e2b_sandbox_lost"]
