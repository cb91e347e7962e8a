"""The warm fork server behind fresh mode: each invariant, attacked, at every isolation level.

A hostile call aims at the server or at the calls after it (leave a file or a daemon, change
imported modules or the environment, fill the temp dir, signal, trace or read the server);
the *next* call then reports its view (files in its temp dir, /tmp, HOME and /dev/shm, its
processes, environment, cwd, module state), which must equal the view of a call on a fresh
executor. The server must not have been replaced by an attack it is immune to, and must be
replaced (detected) when it really dies.

The fork server is used when started as root (each call gets a leased uid); these tests skip
otherwise. The server's lifecycle (restarts, concurrency, close, the switch, a SIGKILLed
trainer) is tested in ``test_sandbox_forkserver_lifecycle.py``. Levels this machine hides (rlimits as root, where Python lives below /root) run in
``test_forkserver_suite_without_bubblewrap``, which reruns this module in a private mount
namespace with bubblewrap hidden and the interpreter reachable.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import private_mount
import pytest
from isolation_levels import level_params

from agentrl import InfraError
from agentrl.tools.sandbox import LocalExecutor, SandboxConfig
from agentrl.tools.sandbox.isolation import LEVELS, PYTHON

UID_BASE, UID_COUNT = 1_600_000, 256
CFG = SandboxConfig(timeout=3.0, disk_mb=16, uid_base=UID_BASE, uid_count=UID_COUNT)
ROOT = os.geteuid() == 0
TESTS = Path(__file__).resolve().parent

# What a call sees of the places a previous call could have left something in. Printed as
# JSON; pids are left out (they differ from call to call), process count and owners kept.
VIEW = r"""
import json, os, sys, tempfile, random
def ls(p):  # entries a sandbox uid of this module made (at the rlimits level /tmp is the host's)
    try:
        found = [(n, os.lstat(os.path.join(p, n)).st_uid) for n in os.listdir(p)]
    except OSError as e:
        return type(e).__name__
    return sorted(e for e in found if %d <= e[1] < %d)
procs = []
for p in os.listdir('/proc'):
    if p.isdigit() and int(p) != os.getpid():
        try:
            st = os.stat('/proc/' + p)
            state = open('/proc/' + p + '/stat').read().rsplit(')', 1)[1].split()[0]
        except OSError:
            continue
        if st.st_uid == os.getuid() and state not in 'ZX':
            procs.append(open('/proc/' + p + '/cmdline', 'rb').read().decode(errors='replace')[:80])
import json as j2, math
print(json.dumps({
    "cwd": os.getcwd() if os.getcwd() in ('/tmp',) else 'private', "cwd_files": ls('.'), "tmp": ls('/tmp'),
    "home": ls(os.environ.get('HOME', '/nonexistent')), "tmpdir": ls(tempfile.gettempdir()),
    "shm": ls('/dev/shm'), "env": sorted(os.environ.items()),
    "env_names": sorted(os.environ), "my_procs": procs, "json_ok": j2.dumps([1]) == '[1]', "pi": math.pi,
    "modules_sane": all(sys.modules.get(m) is not None for m in ('json', 'math', 'os')),
    "print_is_builtin": print.__module__ == 'builtins', "fds": sorted(os.listdir('/proc/self/fd')),
    "umask": os.umask(0o22), "stdin": sys.stdin.read(), "recursion": sys.getrecursionlimit(),
}, sort_keys=True))
""" % (UID_BASE, UID_BASE + UID_COUNT)


def view(ex: LocalExecutor) -> dict:
    r = ex.run(VIEW)
    assert r.exit_code == 0, r.observation()
    v = json.loads(r.output)
    if ex.isolation_level == "rlimits":  # HOME and TMPDIR are the call's own host directory
        v["env"] = [(k, "<workdir>" if k in ("HOME", "TMPDIR") else val) for k, val in v["env"]]
    return v


def executor_at(level: str, **changes: object) -> LocalExecutor:
    if not ROOT:
        pytest.skip("the fork server is used when started as root (a leased uid per call)")
    try:
        ex = LocalExecutor(dataclasses.replace(CFG, isolation=level, **changes))
    except RuntimeError as exc:
        pytest.skip(f"isolation level {level} not available here: {exc}")
    assert ex.uses_fork_server
    return ex


@pytest.fixture(scope="module", params=level_params())
def level(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def baseline(level: str) -> dict:
    """The view of the first call of a fresh executor: what every later call must see."""
    ex = executor_at(level)
    try:
        return view(ex)
    finally:
        ex.close()


@pytest.fixture()
def ex(level: str):  # noqa: ANN201
    e = executor_at(level)
    yield e
    e.close()


def same_server(ex: LocalExecutor, before: int) -> None:
    fs = ex.forkservers
    assert fs is not None and fs.started == before and not fs.replaced, (fs.started, fs.replaced)


def attack_then_pristine(ex: LocalExecutor, baseline: dict, code: str) -> str:
    """Run hostile ``code``, then assert the next call's view equals the baseline, on the same
    server (an attack that cannot touch the server must not cost a restart)."""
    ex.run("pass")
    started = ex.forkservers.started  # type: ignore[union-attr]
    r = ex.run(code)
    assert view(ex) == baseline
    same_server(ex, started)
    return r.output


# --- nothing a call does is visible to a later call ---------------------------------------------


def test_files_left_in_every_writable_place_are_gone(ex: LocalExecutor, baseline: dict) -> None:
    code = (
        "import os, tempfile\n"
        "for d in ('.', '/tmp', os.environ['HOME'], tempfile.gettempdir(), '/dev/shm'):\n"
        "    try:\n        open(os.path.join(d, 'left-behind'), 'w').write('x')\n"
        "    except OSError as e:\n        print(d, type(e).__name__)\n"
        "os.mkdir('dir-left'); os.chmod('dir-left', 0)\n"
        "fd, name = tempfile.mkstemp(); print('made', name)\n"
    )
    out = attack_then_pristine(ex, baseline, code)
    assert "made" in out
    if ex.isolation_level != "rlimits":  # a private /tmp and /dev/shm: every write above succeeded
        assert out.count("\n") == 1, out


def test_daemon_left_behind_is_gone_before_the_status(ex: LocalExecutor, baseline: dict) -> None:
    token = "fs-daemon-" + secrets.token_hex(6)
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        os.execv({PYTHON!r}, [{PYTHON!r}, '-c', 'import time; time.sleep(60)  # {token}'])\n"
        "    os._exit(0)\n"
        "time.sleep(0.3)\nprint('left it')\n"
    )
    ex.run("pass")
    started = ex.forkservers.started  # type: ignore[union-attr]
    assert ex.run(code).output == "left it\n"
    # No grace period: the server reaped every process of the call before it reported.
    assert host_pids(token) == [] and host_pids(uid_range=True) == []
    assert view(ex) == baseline
    same_server(ex, started)


def test_module_state_environment_and_cwd_do_not_carry_over(ex: LocalExecutor, baseline: dict) -> None:
    code = (
        "import sys, os, json, math, builtins\n"
        "json.dumps = lambda *a, **k: 'patched'; math.pi = 3\n"
        "sys.modules['os'] = None; del sys.modules['json']\n"
        "import posix; posix.environ[b'INJECTED'] = b'1'\n"
        "os.environ['PATH'] = '/evil'; os.environ['INJECTED2'] = '1'; os.chdir('/')\n"
        "os.umask(0); sys.setrecursionlimit(50)\n"
        "builtins.print = None\n"
    )
    attack_then_pristine(ex, baseline, code)


def test_fill_the_temp_dir(ex: LocalExecutor, baseline: dict) -> None:
    if ex.isolation_level == "rlimits":
        pytest.skip("no sized private /tmp at the rlimits level: filling it would fill the host disk")
    code = (
        "n = 0\ntry:\n"
        "    while True:\n"
        "        open(f'/tmp/f{n}', 'wb').write(b'x' * (1 << 20)); n += 1\n"
        "except OSError as e:\n    print('full', e.strerror)\n"
    )
    assert "No space left" in attack_then_pristine(ex, baseline, code)
    r = ex.run("open('/tmp/big', 'wb').write(b'x' * (8 << 20)); print('room')")
    assert r.output == "room\n"


def test_exhaust_file_descriptors(ex: LocalExecutor, baseline: dict) -> None:
    code = "fs = []\ntry:\n    while True:\n        fs.append(open('/dev/null'))\nexcept OSError as e:\n    print('out of fds', len(fs))\n"
    assert "out of fds" in attack_then_pristine(ex, baseline, code)


def test_shared_memory_message_queues_and_keyrings_do_not_carry_over(ex: LocalExecutor, baseline: dict) -> None:
    code = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print('shm', libc.shmget(4242, 4096, 0o1666) >= 0)\n"
        "print('key', libc.syscall(248, b'user', b'agentrl-fs', b'secret', 6, -4), ctypes.get_errno())\n"
    )
    out = attack_then_pristine(ex, baseline, code)
    assert "shm True" in out and "key -1 1" in out  # keyrings refused (seccomp): they outlive processes, per uid
    r = ex.run("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nprint(libc.shmget(4242, 4096, 0o666))")
    if ex.isolation_level != "rlimits":  # own IPC namespace per call
        assert r.output == "-1\n"


def test_random_state_is_fresh_per_call(ex: LocalExecutor) -> None:
    draws = {ex.run("import random; print(random.random())").output for _ in range(4)}
    assert len(draws) == 4


# --- the server is out of the code's reach ------------------------------------------------------


def test_signal_the_server_and_everything_else(ex: LocalExecutor, baseline: dict) -> None:
    code = (
        "import os, signal\n"
        "for pid in (os.getppid(), 1):\n"
        "    for sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGTERM):\n"
        "        try:\n            os.kill(pid, sig); print('signalled', pid, sig)\n"
        "        except OSError as e:\n            print('refused', type(e).__name__)\n"
        "os.kill(-1, signal.SIGKILL)  # every process it may signal (never itself)\n"
        "os.killpg(0, signal.SIGKILL)\n"
    )
    ex.run("pass")
    started = ex.forkservers.started  # type: ignore[union-attr]
    r = ex.run(code)
    assert "signalled" not in r.output and r.exit_code == -signal.SIGKILL
    assert view(ex) == baseline
    same_server(ex, started)


def test_trace_or_read_the_server(ex: LocalExecutor, baseline: dict) -> None:
    code = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nppid = os.getppid()\n"
        "for req in (16, 0x4206):  # PTRACE_ATTACH, PTRACE_SEIZE\n"
        "    print('ptrace', libc.ptrace(req, ppid, 0, 0), ctypes.get_errno())\n"
        "for name in ('mem', 'environ', 'maps', 'fd/0'):\n"
        "    try:\n        open(f'/proc/{ppid}/{name}', 'rb').read(1); print('read', name)\n"
        "    except OSError as e:\n        print('refused', name, type(e).__name__)\n"
        "class IoVec(ctypes.Structure):\n    _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]\n"
        "buf = ctypes.create_string_buffer(16)\nlocal, remote = IoVec(ctypes.addressof(buf), 16), IoVec(0x400000, 16)\n"
        "print('vm_readv', libc.process_vm_readv(ppid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0), ctypes.get_errno())\n"
    )
    out = attack_then_pristine(ex, baseline, code)
    assert out.count("ptrace -1 1") == 2 and "read " not in out and out.count("refused") == 4
    assert "vm_readv -1 1" in out


def test_a_later_call_cannot_find_an_earlier_call_in_its_memory(ex: LocalExecutor) -> None:
    """The server never reads a call's code or output, so the memory every child inherits holds
    nothing of earlier calls. The scan is checked on the call holding the secret first."""
    half_a, half_b = "agentrl-" + secrets.token_hex(8), secrets.token_hex(8) + "-secret"
    scan = (
        "import ctypes, re\nA, B = %r.encode(), %r.encode()\nfound = 0\n"
        "for line in open('/proc/self/maps'):\n"
        "    parts = line.split()\n"
        "    lo, hi = (int(x, 16) for x in parts[0].split('-'))\n"
        "    if parts[1][0] != 'r' or hi - lo > (256 << 20) or (len(parts) > 5 and parts[5] not in ('[heap]', '[stack]')):\n"
        "        continue  # anonymous memory, heap and stack: where a call's code or output would be\n"
        "    try:\n        data = ctypes.string_at(lo, hi - lo)\n    except Exception:\n        continue\n"
        "    i = data.find(A)\n"
        "    while i >= 0:\n"
        "        found += data[i + len(A):i + len(A) + len(B)] == B\n"
        "        i = data.find(A, i + 1)\n"
        "print('found', found)\n"
    ) % (half_a, half_b)
    holder = f"secret = {half_a + half_b!r}\nprint(len(secret))\n" + scan
    assert re.search(r"found [1-9]", ex.run(holder).output)  # the scanner sees a secret that is there
    out = ex.run(scan).output
    assert out == "found 0\n", out


def test_server_killed_from_outside_is_detected_and_replaced(ex: LocalExecutor, baseline: dict) -> None:
    ex.run("pass")
    server = ex.forkservers.live[0]  # type: ignore[union-attr]
    os.killpg(server.proc.pid, signal.SIGKILL)
    time.sleep(0.2)
    r = ex.run("print('fine')")
    assert r.output == "fine\n" and not r.server_lost
    assert ex.forkservers.replaced == ["found dead while idle"]  # type: ignore[union-attr]
    assert view(ex) == baseline


def test_server_dying_mid_call_is_an_infrastructure_failure(ex: LocalExecutor, baseline: dict) -> None:
    """The code cannot signal the server (root; the code runs as a leased uid): its death is the
    host's doing, raised as InfraError (never an observation the model would be scored on)."""
    ex.run("pass")
    server = ex.forkservers.live[0]  # type: ignore[union-attr]
    killer = subprocess.Popen(["sh", "-c", f"sleep 0.5; kill -9 -{server.proc.pid}"])
    start = time.monotonic()
    with pytest.raises(InfraError, match="fork server died while the code ran") as info:
        ex.run("import time; print('started', flush=True); time.sleep(2); print('not reached')")
    killer.wait()
    assert info.value.cause == "sandbox_server_died" and time.monotonic() - start < 1.5
    assert host_pids(uid_range=True) == []
    assert ex.run("print('next')").output == "next\n"
    assert view(ex) == baseline


# --- the levels this machine hides ----------------------------------------------------------------


@pytest.mark.slow
def test_forkserver_suite_without_bubblewrap() -> None:
    """This module and the lifecycle module again with bubblewrap hidden and the interpreter
    reachable by the sandbox uids, so the unshare and rlimits levels run here too."""
    if os.environ.get("AGENTRL_FS_INNER"):
        pytest.skip("already inside the rerun")
    if not private_mount.available():
        pytest.skip("needs root and mount namespaces")
    out = private_mount.rerun_pytest(f"{Path(__file__).resolve()} {TESTS / 'test_sandbox_forkserver_lifecycle.py'} "
                                     "-k 'rlimits or unshare'", env="AGENTRL_FS_INNER=1")
    for lvl in ("unshare", "rlimits"):
        assert len(re.findall(rf"\[{lvl}\] PASSED", out)) >= 15, f"the {lvl} level did not run:\n{out[-3000:]}"
    skips = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    assert all("rlimits" in s and "fill" in s or "rerun" in s for s in skips), "\n".join(skips)


# --- host-side helpers ----------------------------------------------------------------------------


def cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def host_pids(token: str | None = None, uid_range: bool = False) -> list[int]:
    """Live processes whose command line holds ``token``, or owned by this module's sandbox uids."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[-1][1:2] in (b"Z", b"X"):
                    continue
            hit = uid_range and UID_BASE <= os.stat(f"/proc/{name}").st_uid < UID_BASE + UID_COUNT
            hit = hit or (token is not None and token.encode() in cmdline(int(name)))
        except OSError:
            continue
        if hit and int(name) != os.getpid():
            found.append(int(name))
    return found
