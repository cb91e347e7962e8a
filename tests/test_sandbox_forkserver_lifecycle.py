"""The fork server's lifecycle at every isolation level: restarted after N calls and after a
stopped call, one server per concurrent call (at most the pool size), every server stopped on
close, the switch back to one interpreter per call, and no process left when the trainer is
SIGKILLed mid-call. Skips where the fork server is not used (not root) or the level is not
available; ``test_sandbox_forkserver.test_forkserver_suite_without_bubblewrap`` reruns it at
the levels this machine hides.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import secrets
import subprocess
import sys
import time

import pytest
from isolation_levels import level_params
from test_sandbox_forkserver import CFG, ROOT, UID_BASE, UID_COUNT, cmdline, executor_at, host_pids

from agentrl.tools.sandbox import LocalExecutor
from agentrl.tools.sandbox.isolation import LEVELS


@pytest.fixture(scope="module", params=level_params())
def level(request: pytest.FixtureRequest) -> str:
    return request.param


def test_restart_after_n_calls_and_after_a_stopped_call(level: str) -> None:
    ex = executor_at(level, fork_server_calls=3, timeout=1.0)
    try:
        for _ in range(7):
            assert ex.run("print(1)").output == "1\n"
        fs = ex.forkservers
        assert fs is not None and fs.started == 3 and fs.replaced == ["served 3 calls"] * 2
        assert ex.run("while True: pass").timed_out
        assert fs.replaced[-1] == "the call was stopped (timeout)"
        assert ex.run("print(2)").output == "2\n" and fs.started == 4
    finally:
        ex.close()


def test_concurrent_calls_get_their_own_uid_and_server(level: str) -> None:
    ex = executor_at(level)
    try:
        async def many() -> list[str]:
            code = "import os, time; time.sleep(0.2); print(os.getuid())"
            return [r.output for r in await asyncio.gather(*[ex.arun(code) for _ in range(6)])]

        uids = asyncio.run(many())
        assert len(set(uids)) == 6 and all(UID_BASE <= int(u) < UID_BASE + UID_COUNT for u in uids)
        assert ex.forkservers is not None and len(ex.forkservers.live) <= ex.pool.size
    finally:
        ex.close()


def test_close_stops_every_server(level: str) -> None:
    ex = executor_at(level)
    ex.run("pass")
    servers = ex.forkservers.live  # type: ignore[union-attr]
    assert servers
    ex.close()
    assert all(s.proc.exited for s in servers)
    with pytest.raises(RuntimeError, match="closed"):
        ex.run("1")


def test_switch_back_to_one_interpreter_per_call(level: str) -> None:
    if not ROOT:
        pytest.skip("needs root")
    try:
        ex = LocalExecutor(dataclasses.replace(CFG, isolation=level, fork_server=False))
    except RuntimeError as exc:
        pytest.skip(f"isolation level {level} not available here: {exc}")
    assert not ex.uses_fork_server and ex.forkservers is None
    assert ex.run("import sys; print('json' in sys.modules)").output == "False\n"  # nothing preimported
    from agentrl.tools.python import python_tool

    assert not python_tool(fork_server=False, isolation=level).executor.uses_fork_server


def test_no_orphans_after_the_trainer_is_sigkilled(level: str) -> None:
    executor_at(level).close()  # skips where the level or the fork server is not available
    half = secrets.token_hex(6)
    script = (
        "import asyncio, os\n"
        "from agentrl.tools.sandbox import LocalExecutor, SandboxConfig\n"
        f"ex = LocalExecutor(SandboxConfig(isolation={level!r}, uid_base={UID_BASE}, uid_count={UID_COUNT}, timeout=60))\n"
        "ex.run('pass')  # one idle server\n"
        "print(os.getpid(), flush=True)\n"
        "code = ('import subprocess, sys, time\\n'\n"
        f"        'subprocess.Popen([sys.executable, \"-c\", \"import time; time.sleep(120)  # fs-orphan-\" + \"{half}\"], start_new_session=True)\\n'\n"
        "        'time.sleep(120)')\n"
        "async def main():\n    await asyncio.gather(ex.arun(code), ex.arun(code))\n"
        "asyncio.run(main())\n"
    )
    trainer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        assert trainer.stdout is not None
        trainer.stdout.readline()
        token = "fs-orphan-" + half
        deadline = time.monotonic() + 15
        while len(host_pids(token)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(host_pids(token)) == 2, f"the calls never started: {host_pids(token)}"
        tree = descendants(trainer.pid)
        assert any(b"\0server\0" in cmdline(p) for p, _ in tree), "no fork server in the trainer's tree"
    finally:
        trainer.kill()  # SIGKILL: what must not leave anything behind
        trainer.wait()
    deadline = time.monotonic() + 5
    while alive(tree) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive(tree) == [] and host_pids(token) == []


def descendants(root: int) -> list[tuple[int, bytes]]:
    """(pid, start time) of every live descendant of ``root`` (start time guards against pid reuse)."""
    children: dict[int, list[int]] = {}
    starts: dict[int, bytes] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[-1].split()
                children.setdefault(int(fields[1]), []).append(int(name))
                starts[int(name)] = fields[19]
            except OSError:
                pass
    out, todo = [], [root]
    while todo:
        for kid in children.get(todo.pop(), []):
            out.append((kid, starts[kid]))
            todo.append(kid)
    return out


def alive(tree: list[tuple[int, bytes]]) -> list[int]:
    left = []
    for pid, start in tree:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[-1].split()
            if fields[19] == start and fields[0] not in (b"Z", b"X"):
                left.append(pid)
        except OSError:
            pass
    return left
