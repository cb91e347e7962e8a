"""The python tool and its local sandbox: observations, modes, limits, pool, isolation levels, E2B mapping."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import os
import threading
import time

import pytest
from isolation_levels import level_params

from agentrl.toolbox import ToolBox
from agentrl.tools.python import python_tool
from agentrl.tools.sandbox import ExecPool, LocalExecutor, SandboxConfig
from agentrl.tools.sandbox.capture import OutputCapture, clean
from agentrl.tools.sandbox.isolation import LEVELS, PYTHON
from agentrl.tools.sandbox.result import ExecResult

CFG = SandboxConfig(timeout=3.0, uid_base=1_700_000, uid_count=512)


def executor_at(level: str) -> LocalExecutor:
    try:
        return LocalExecutor(dataclasses.replace(CFG, isolation=level))
    except RuntimeError as exc:
        pytest.skip(f"isolation level {level} not available here: {exc}")


@pytest.fixture(scope="module", params=level_params())
def ex(request: pytest.FixtureRequest) -> LocalExecutor:
    """Every observation and limit test runs at each isolation level this machine offers: a
    machine with bubblewrap still tests the fallbacks a user without it gets."""
    return executor_at(request.param)


def run(coro):  # noqa: ANN001, ANN201
    return asyncio.run(coro)


# --- observations ---------------------------------------------------------------------------------


def test_print_and_trailing_expression(ex: LocalExecutor) -> None:
    assert ex.run("print(6 * 7)").output == "42\n"
    assert ex.run("x = 3\nx * 2").output == "6\n"
    assert ex.run("None").observation() == "(no output)"


def test_traceback_starts_at_user_code(ex: LocalExecutor) -> None:
    out = ex.run("def f():\n    return 1 / 0\nf()").output
    assert out.startswith("Traceback (most recent call last):\n  File \"<cell>\", line 3")
    assert "return 1 / 0" in out and out.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "child" not in out and "<string>" not in out  # no sandbox frames


def test_syntax_error_is_reported(ex: LocalExecutor) -> None:
    out = ex.run("def f(:\n  pass").output
    assert "SyntaxError" in out


def test_stdout_and_stderr_interleave(ex: LocalExecutor) -> None:
    out = ex.run("import sys\nprint('a')\nprint('b', file=sys.stderr)\nprint('c')").output
    assert out == "a\nb\nc\n"


def test_exit_codes_and_exit_builtin(ex: LocalExecutor) -> None:
    r = ex.run("exit(3)")
    assert r.exit_code == 3 and r.observation() == "[exit code 3]"
    assert ex.run("quit()").exit_code == 0


def test_timeout_note_and_duration(ex: LocalExecutor) -> None:
    r = ex.run("print('started')\nwhile True: pass")
    assert r.timed_out and r.observation() == "started\n[stopped: the code ran past the 3s time limit]"
    assert CFG.timeout <= r.duration_s < CFG.timeout + 2


def test_interpreter_is_the_real_binary_with_fast_flags(ex: LocalExecutor) -> None:
    out = ex.run("import sys; print(sys.executable); print(sys.flags.isolated, sys.flags.no_site)").output
    exe, flags = out.splitlines()
    assert exe == PYTHON == os.path.realpath(exe)  # never a pyenv shim (10x slower start)
    assert flags == "1 1"


def test_environment_is_allow_listed(ex: LocalExecutor, monkeypatch: pytest.MonkeyPatch) -> None:
    out = ex.run("import os; print(sorted(os.environ))").output
    names = set(eval(out))  # noqa: S307 - our own printed list
    allowed = {"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "PWD", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
               "MKL_NUM_THREADS", "MALLOC_ARENA_MAX"}
    if ex.isolation_level == "rlimits" and os.geteuid() != 0:
        allowed.add("AGENTRL_SANDBOX_RUN")  # no namespace, no own uid: stragglers are found by this marker
    assert names <= allowed


def test_sandbox_runs_unprivileged(ex: LocalExecutor) -> None:
    out = ex.run("import os; print(os.getuid()); print(open('/proc/self/uid_map').read().split())").output
    uid, uid_map = int(out.splitlines()[0]), eval(out.splitlines()[1])  # noqa: S307 - our own printed list
    if os.geteuid() == 0:
        assert CFG.uid_base <= uid < CFG.uid_base + CFG.uid_count
    elif ex.isolation_level == "unshare":  # root of its own user namespace = this user outside, nothing more
        assert uid == 0 and uid_map == ["0", str(os.getuid()), "1"]
    else:
        assert uid == os.getuid()


def test_memory_limit_applies(ex: LocalExecutor) -> None:
    out = ex.run("import resource; print(resource.getrlimit(resource.RLIMIT_AS)[0] >> 20)").output
    assert int(out) == CFG.memory_mb


def test_one_interpreter_per_call_switch_keeps_the_observations(ex: LocalExecutor) -> None:
    """``fork_server=False``: a new interpreter per fresh call, same observations and limits."""
    per_call = LocalExecutor(dataclasses.replace(ex.config, fork_server=False))
    assert not per_call.uses_fork_server and per_call.isolation_level == ex.isolation_level
    for code in ("print(6 * 7)", "x = 3\nx * 2", "def f():\n    return 1 / 0\nf()", "exit(3)",
                 "import os; print(sorted(os.environ))",
                 "import resource; print(resource.getrlimit(resource.RLIMIT_AS)[0] >> 20)"):
        a, b = ex.run(code), per_call.run(code)
        assert (a.output, a.exit_code) == (b.output, b.exit_code), code
    uid = int(per_call.run("import os; print(os.getuid())").output)
    assert uid != 0 or os.geteuid() != 0
    r = per_call.run("while True: pass")
    assert r.timed_out and "time limit" in r.observation()


# --- capture --------------------------------------------------------------------------------------


def test_capture_keeps_head_and_tail() -> None:
    cap = OutputCapture(max_chars=8)
    for chunk in (b"abc", b"defghij", b"klmnop"):
        cap.feed(chunk)
    assert cap.total == 16 and cap.cut == 8
    assert cap.text() == "abcd\n...[8 bytes cut]...\nmnop"
    small = OutputCapture(100)
    small.feed(b"hello")
    assert small.text() == "hello" and small.cut == 0


def test_clean_replaces_controls_and_bad_utf8() -> None:
    assert clean(b"a\tb\nc\x00\x1b[31m\xff") == "a\tb\nc\ufffd\ufffd[31m\ufffd"


def test_output_is_capped_in_chars(ex: LocalExecutor) -> None:
    r = ex.run("print('a' * 50_000 + 'END')")
    assert r.truncated and len(r.output) < CFG.max_output_chars + 50
    assert r.output.startswith("aaaa") and r.output.endswith("END\n") and "bytes cut" in r.output


# --- the tool -------------------------------------------------------------------------------------


def test_tool_schema_and_level() -> None:
    t = python_tool(timeout=3)
    fn = t.schema()["function"]
    assert fn["name"] == "python" and fn["parameters"]["required"] == ["code"]
    assert set(fn["parameters"]["properties"]) == {"code"} and fn["parameters"]["additionalProperties"] is False
    assert t.isolation_level in LEVELS and "3s" in fn["description"]


def test_config_given_is_kept_and_arguments_override_one_field() -> None:
    t = python_tool(config=SandboxConfig(timeout=30, memory_mb=512))
    assert t.timeout == 30 and t.executor.config.timeout == 30 and "30s" in t.description
    assert t.executor.config.memory_mb == 512
    t = python_tool(config=SandboxConfig(timeout=30, memory_mb=512), memory_mb=256)
    assert t.executor.config.timeout == 30 and t.executor.config.memory_mb == 256


def test_time_limit_has_one_source_the_toolbox_default_unless_the_tool_sets_one() -> None:
    inherited = ToolBox([python_tool()], default_timeout=2).tools["python"]
    assert inherited.timeout == 2 and inherited.executor.config.timeout == 2 and "2s" in inherited.description
    assert inherited.schema()["function"]["description"] == inherited.description
    own = ToolBox([python_tool(timeout=3)], default_timeout=30).tools["python"]
    assert own.timeout == 3 and own.executor.config.timeout == 3
    box = ToolBox([python_tool()], default_timeout=1)
    start = time.perf_counter()
    r = run(box.execute("python", {"code": "import time; time.sleep(30)"}, box.new_context("t")))
    assert "[stopped: the code ran past the 1s time limit]" in r.content
    assert time.perf_counter() - start < 1 + 2


def test_tool_timeout_comes_from_config_not_arguments() -> None:
    box = ToolBox([python_tool(timeout=1)])
    ctx = box.new_context("t")
    r = run(box.execute("python", {"code": "import time; time.sleep(30)", "timeout": 1000}, ctx))
    assert r.error == "invalid_arguments" and "timeout" in r.content
    start = time.perf_counter()
    r = run(box.execute("python", {"code": "import time; time.sleep(30)"}, ctx))
    assert "[stopped: the code ran past the 1s time limit]" in r.content
    assert time.perf_counter() - start < 1 + 2


def test_fresh_mode_keeps_nothing_between_calls() -> None:
    box = ToolBox([python_tool(timeout=3)])
    ctx = box.new_context("t")
    run(box.execute("python", {"code": "x = 1\nopen('f', 'w').write('hi')"}, ctx))
    r = run(box.execute("python", {"code": "import os\nprint('x' in globals(), os.path.exists('f'))"}, ctx))
    assert r.content == "False False\n"


def test_stateful_mode_persists_per_trajectory_only() -> None:
    async def go() -> tuple[list[str], list[str]]:
        box = ToolBox([python_tool(mode="stateful", timeout=3)])
        a, b = box.new_context("a"), box.new_context("b")
        first = [
            (await box.execute("python", {"code": "x = 'A'\nimport math"}, a)).content,
            (await box.execute("python", {"code": "x = 'B'"}, b)).content,
            (await box.execute("python", {"code": "print(x, math.pi > 3)"}, a)).content,
            (await box.execute("python", {"code": "x"}, b)).content,
        ]
        await box.close(a)
        await box.close(b)
        c = box.new_context("c")
        second = [(await box.execute("python", {"code": "print('x' in globals())"}, c)).content]
        await box.close(c)
        return first, second

    first, second = run(go())
    assert first == ["(no output)", "(no output)", "A True\n", "'B'\n"]
    assert second == ["False\n"]


def test_stateful_timeout_restarts_and_says_so(ex: LocalExecutor) -> None:
    with ex.session() as s:
        s.run("x = 1")
        r = s.run("while True: pass")
        assert r.timed_out and "time limit" in r.observation()
        r = s.run("print('x' in globals())")
        assert r.output == "False\n" and r.restarted and "variables" in r.observation()
        assert not s.run("print(1)").restarted  # said once


def test_stateful_exit_keeps_state_but_os_exit_ends_it(ex: LocalExecutor) -> None:
    with ex.session() as s:
        s.run("x = 5")
        assert "SystemExit: 2" in s.run("exit(2)").output
        assert s.run("x").output == "5\n"
        r = s.run("import os; os._exit(7)")
        assert r.worker_exited and r.exit_code == 7 and "interpreter exited (status 7)" in r.observation()
        assert s.run("print('x' in globals())").output == "False\n"


def test_closed_session_process_is_gone(ex: LocalExecutor) -> None:
    s = ex.session()
    assert s.run("print('up')").output == "up\n"
    proc = s._proc
    assert proc is not None and s.alive
    s.close()
    assert proc.exited and not s.alive
    with pytest.raises(RuntimeError, match="closed"):
        s.run("1")


def test_stateful_calls_are_fast_after_start(ex: LocalExecutor) -> None:
    with ex.session() as s:
        s.run("pass")
        start = time.perf_counter()
        for _ in range(20):
            assert s.run("print(1)").output == "1\n"
        per_call = (time.perf_counter() - start) / 20
    fresh = ex.run("print(1)").duration_s
    print(f"stateful {per_call * 1e3:.2f} ms/call vs fresh {fresh * 1e3:.1f} ms/call")


# --- pool -----------------------------------------------------------------------------------------


def test_pool_bounds_concurrency_without_deadlock() -> None:
    pool = ExecPool(2)
    ex = LocalExecutor(CFG, pool=pool)

    async def many() -> list[str]:
        return [r.output for r in await asyncio.gather(*[ex.arun(f"import time; time.sleep(0.05); print({i})") for i in range(8)])]

    sync_out: list[str] = []
    t = threading.Thread(target=lambda: sync_out.extend(ex.run("print('sync')").output for _ in range(3)))
    t.start()
    outs = run(many())
    t.join(timeout=30)
    assert outs == [f"{i}\n" for i in range(8)] and sync_out == ["sync\n"] * 3
    assert pool.peak == 2 and pool.in_use == 0


def test_pool_rejects_bad_size() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ExecPool(0)


# --- configuration --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [({"timeout": 0}, "positive"), ({"timeout": float("inf")}, "positive"), ({"isolation": "docker"}, "isolation must be"),
     ({"memory_mb": 0}, "memory_mb"), ({"max_output_bytes": 10, "max_output_chars": 100}, "max_output_bytes")],
)
def test_config_errors(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        SandboxConfig(**kwargs)


def test_tool_argument_errors() -> None:
    with pytest.raises(ValueError, match="backend must be"):
        python_tool(backend="docker")
    with pytest.raises(ValueError, match="mode must be"):
        python_tool(mode="notebook")


# --- isolation levels -----------------------------------------------------------------------------


@pytest.mark.parametrize("level", level_params())
def test_each_level_runs_code_unprivileged_without_secrets(level: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRL_TEST_SECRET", "s3cr3t-level")
    ex = executor_at(level)
    assert ex.isolation_level == level
    r = ex.run("import os\nprint(6 * 7, os.getuid())\nprint(open(f'/proc/{os.getppid()}/environ','rb').read() if os.path.exists(f'/proc/{os.getppid()}/environ') else '')")
    assert r.output.startswith("42 ")
    assert "s3cr3t-level" not in r.output
    if os.geteuid() == 0:
        assert r.output.split()[1] != "0"
    with ex.session() as s:
        s.run("y = 2")
        assert s.run("y * 21").output == "42\n"


def test_named_level_unavailable_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    from agentrl.tools.sandbox.isolation import Isolation

    monkeypatch.setattr(Isolation, "_cache", {})
    with pytest.raises(RuntimeError, match="bwrap: not installed.*apt-get install bubblewrap"):
        Isolation.for_config(dataclasses.replace(CFG, isolation="bwrap"))


# --- result notes ---------------------------------------------------------------------------------


def test_observation_notes() -> None:
    base = dict(output="", duration_s=0.1, timeout_s=2.0, max_output_bytes=100)
    assert ExecResult(exit_code=-11, timed_out=False, output_limited=False, **base).observation() == "[the process was killed by signal SIGSEGV]"
    assert ExecResult(exit_code=None, timed_out=False, output_limited=True, **base).observation() == "[stopped: the code printed more than 100 bytes]"
    assert ExecResult(exit_code=1, timed_out=False, output_limited=False, **{**base, "output": "x"}).observation() == "x"


# --- E2B backend (no network here: the SDK's own result classes, and the missing-key error) -------


def test_e2b_execution_maps_to_observation() -> None:
    pytest.importorskip("e2b_code_interpreter")
    from e2b_code_interpreter.models import Execution, ExecutionError, Logs, Result

    from agentrl.tools.sandbox.e2b import execution_text

    ok = Execution(
        results=[Result(text="42", is_main_result=True), Result(png="iVBORw0KGgo=")],
        logs=Logs(stdout=["hello\n"], stderr=["careful\n"]),
    )
    assert execution_text(ok, 4000) == "hello\ncareful\n42\n[png output not shown]\n"
    trace = "\x1b[0;31m---------\x1b[0m\n\x1b[0;31mZeroDivisionError\x1b[0m: division by zero"
    bad = Execution(logs=Logs(stdout=["before\n"]), error=ExecutionError("ZeroDivisionError", "division by zero", trace))
    assert execution_text(bad, 4000) == "before\n---------\nZeroDivisionError: division by zero\n"
    no_trace = Execution(error=ExecutionError("ValueError", "bad", ""))
    assert execution_text(no_trace, 4000) == "ValueError: bad\n"
    assert execution_text(Execution(), 4000) == "(no output)"
    long = Execution(logs=Logs(stdout=["x" * 10_000 + "END"]))
    text = execution_text(long, 100)
    assert text.startswith("x" * 50) and text.endswith("END") and "bytes cut" in text


def test_e2b_timeout_becomes_a_note() -> None:
    e2b = pytest.importorskip("e2b_code_interpreter")
    from agentrl.tools.sandbox.e2b import E2BExecutor

    class TimingOutSandbox:
        async def run_code(self, code: str, context: object = None, timeout: float | None = None) -> None:
            raise e2b.TimeoutException("execution timed out")

    remote = E2BExecutor.__new__(E2BExecutor)
    remote.timeout, remote.max_output_chars, remote.mode = 5.0, 100, "stateful"
    assert run(remote.run(TimingOutSandbox(), "while True: pass")) == "[stopped: the code ran past the 5s time limit]"


def test_e2b_without_key_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("e2b_code_interpreter")
    from agentrl.tools.sandbox.e2b import E2BUnavailable

    monkeypatch.delenv("E2B_API_KEY", raising=False)
    with pytest.raises(E2BUnavailable, match="E2B_API_KEY.*backend='local'"):
        python_tool(backend="e2b")


def test_limits_follow_each_config_not_the_first_one() -> None:
    small = LocalExecutor(dataclasses.replace(CFG, memory_mb=256))
    big = LocalExecutor(dataclasses.replace(CFG, memory_mb=768))
    code = "import resource; print(resource.getrlimit(resource.RLIMIT_AS)[0] >> 20)"
    assert small.run(code).output == "256\n" and big.run(code).output == "768\n"


def test_site_packages_is_opt_in() -> None:
    code = "import jsonschema; print('ok')"
    assert "ModuleNotFoundError" in LocalExecutor(CFG).run(code).output
    assert LocalExecutor(dataclasses.replace(CFG, site_packages=True)).run(code).output == "ok\n"


@pytest.mark.parametrize("level", ["bwrap", "unshare"])
def test_site_packages_under_tmp_survive_the_private_tmp(level, tmp_path, monkeypatch) -> None:
    # CI may clone (and build its virtualenv) under /tmp, which the sandbox replaces.
    if shutil.which(level) is None:
        pytest.skip(f"{level} not installed")
    site = tmp_path / "lib" / "site-packages"
    site.mkdir(parents=True)
    (site / "agentrl_probe_mod.py").write_text("X = 42\n")
    monkeypatch.syspath_prepend(str(site))
    cfg = dataclasses.replace(CFG, isolation=level, site_packages=True)
    assert LocalExecutor(cfg).run("import agentrl_probe_mod; print(agentrl_probe_mod.X)").output == "42\n"
    hostile = f"open({str(site / 'agentrl_probe_mod.py')!r}, 'a').write('x')"
    assert "Permission denied" in LocalExecutor(cfg).run(hostile).output or "Read-only" in LocalExecutor(cfg).run(hostile).output
    assert (site / "agentrl_probe_mod.py").read_text() == "X = 42\n"


def test_uid_lease_clears_what_a_crashed_holder_left(tmp_path) -> None:  # noqa: ANN001
    if os.geteuid() != 0:
        pytest.skip("uid leases are used when started as root")
    import subprocess

    from agentrl.tools.sandbox.uids import UidLeases

    uid = 1_750_000
    (tmp_path / f"{uid}.lock").write_text("1")  # last held by another process
    left = subprocess.Popen(["setpriv", "--reuid", str(uid), "--regid", str(uid), "--clear-groups", "sleep", "60"])
    try:
        time.sleep(0.2)
        assert left.poll() is None
        leases = UidLeases(uid, 1, lock_dir=str(tmp_path))
        with leases.lease() as got:
            assert got == uid
            assert left.wait(timeout=5) == -9
            with pytest.raises(RuntimeError, match="in use"):
                leases.acquire()
        assert (tmp_path / f"{uid}.lock").read_text() == str(os.getpid())
    finally:
        left.kill()
        left.wait()


def test_builtin_tools_import_from_the_package_as_the_readme_says() -> None:
    from agentrl.tools import open_tool, python_tool as from_package, search_tool, search_tools

    assert from_package is python_tool and callable(search_tool) and callable(open_tool) and callable(search_tools)
