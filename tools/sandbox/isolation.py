"""How a sandboxed interpreter is launched: the isolation level and its command line.

Levels, strongest first (``isolation_level`` names the one in use):

- ``bwrap``: bubblewrap. No network (own empty network namespace), read-only root, private
  sized tmpfs for /tmp (the working directory) and /dev/shm, own pid/ipc/uts namespaces,
  ``--cap-drop ALL``, ``--die-with-parent``, ``--new-session``; home directories and other
  places where credentials live are hidden behind empty tmpfs mounts, the Python install is
  bound back read-only. Started as root, bwrap runs privileged (no user namespace, which
  would map the sandbox onto host root), sets ``no_new_privs`` and keeps only CAP_SETUID and
  CAP_SETGID, which the child uses as its first act to become a leased unprivileged uid
  (after which it has no capabilities and, under no_new_privs, cannot gain any).
- ``unshare``: the same namespaces through util-linux ``unshare`` where permitted; private
  tmpfs /tmp, /dev/shm and hidden directories, but the root file system stays writable to
  whatever the (unprivileged) uid may write.
- ``rlimits``: no namespaces: only the always-on measures.

Always: an unprivileged uid when started as root, rlimits set inside the child before any
user code (soft = hard), an allow-listed environment, a private working directory, and the
parent's kill of the whole process group plus stragglers (see :mod:`.process`).

The same launch starts a fresh-mode fork server (``child.py server``, :mod:`.serve`) at every
level: it runs inside the same namespaces and read-only root, and each call it forks gets the
guarantees above plus a mount and IPC namespace of its own (see :mod:`.forkserver`).

Example::

    from agentrl.tools.sandbox.config import SandboxConfig
    from agentrl.tools.sandbox.isolation import Isolation
    iso = Isolation.for_config(SandboxConfig())
    print(iso.level)  # "bwrap" where bubblewrap works
"""

from __future__ import annotations

import atexit
import marshal
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from .config import SandboxConfig
from .uids import UidLeases

LEVELS: tuple[str, ...] = ("bwrap", "unshare", "rlimits")

# What each level means, in one phrase (the trainer's "tool isolation:" line).
MEANINGS: dict[str, str] = {
    "bwrap": "bubblewrap: no network, read-only root, private /tmp, own pid namespace, no capabilities; "
             "the strongest level",
    "unshare": "util-linux unshare: no network, private /tmp, own pid namespace, but the root file system "
               "stays writable to the sandbox's uid",
    "rlimits": "no namespaces: resource limits, an allow-listed environment and a private working "
               "directory only; the code can reach the network and write where its uid may",
    "e2b": "E2B cloud sandboxes: the code runs on E2B's machines, not this one",
}


def describe_level(level: str) -> str:
    """``level`` with what it isolates and, below ``bwrap``, how to get the strongest level.

    >>> describe_level("bwrap")
    'bwrap (bubblewrap: no network, read-only root, ...; the strongest level)'
    >>> "apt-get install bubblewrap" in describe_level("rlimits") or shutil.which("bwrap") is not None
    True
    """
    text = f"{level} ({MEANINGS.get(level, 'a level this version does not describe')})"
    if level not in ("unshare", "rlimits"):
        return text
    if shutil.which("bwrap") is None:
        return f"{text}; for bwrap, the strongest level, install bubblewrap (sudo apt-get install bubblewrap)"
    return (f"{text}; bubblewrap is installed but failed its start-up check here (often: unprivileged user "
            "namespaces are disabled); python_tool(isolation='bwrap') raises with the reason")
CHILD_SOURCE = (Path(__file__).with_name("child.py")).read_text()
# The child program travels precompiled (marshal, same interpreter binary): loading it takes
# ~0.2 ms where compiling its source on every start took several.
CHILD_CODE = marshal.dumps(compile(CHILD_SOURCE, "<sandbox>", "exec")).hex()
BOOT = "import marshal,sys;exec(marshal.loads(bytes.fromhex(sys.argv.pop(1))))"
PYTHON = os.path.realpath(sys.executable)
# -I: ignore PYTHON* variables, user site and the script's directory; -S: no site import
# (about 10x faster start than a pyenv-shimmed interpreter with site); -u: unbuffered, so
# output printed before a kill is still seen.
PYTHON_FLAGS: tuple[str, ...] = ("-I", "-S", "-u")
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
# One thread per math library and few malloc arenas: a BLAS that starts a thread per core
# would hit RLIMIT_NPROC and reserve most of the address-space limit before any user code.
_QUIET_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2"}


# The launcher dies with the thread that started it (a SIGKILLed trainer takes its sandboxes).
_PDEATHSIG: tuple[str, ...] = ("setpriv", "--pdeathsig", "KILL", "--")


@dataclass(frozen=True)
class Launch:
    """Everything :class:`~.process.SandboxProcess` needs to start one sandboxed interpreter."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    uid: int | None  # the sandbox's host uid when started as root
    host_workdir: str | None  # created by the parent and removed after the run (rlimits level)
    own_pid_namespace: bool  # killing the launcher kills every process of the sandbox


class Isolation:
    """The chosen level plus the command-line recipe; build with :meth:`for_config` (cached)."""

    # Probed level per (request, what the probe depends on): probing costs one sandbox start.
    _cache: dict[tuple[object, ...], str] = {}
    _cache_lock = threading.Lock()

    def __init__(self, config: SandboxConfig, level: str) -> None:
        self.config = config
        self.level = level
        self.root = os.geteuid() == 0
        self.leases = UidLeases(config.uid_base, config.uid_count) if self.root else None
        self.exposed = _exposed_paths(config.site_packages)
        self.extra_path = os.pathsep.join(p for p in self.exposed[1:]) if config.site_packages else ""
        self.nproc = config.max_processes if self.root else _own_process_count() + config.max_processes + 64
        self.base_dir = _private_base_dir() if level == "rlimits" else None
        if level == "rlimits" and self.root:
            blocked = [p for p in self.exposed if not _world_reachable(p)]
            if blocked:
                raise RuntimeError(
                    f"the sandbox user cannot reach {blocked[0]} (a parent directory is not world-searchable); "
                    "install bubblewrap (apt-get install bubblewrap) so the sandbox can bind it, or make the "
                    f"path searchable (chmod o+x on its parents), or use a Python outside it"
                )

    @classmethod
    def for_config(cls, config: SandboxConfig) -> "Isolation":
        """The strongest working level allowed by ``config.isolation``; probed once per process."""
        key = (config.isolation, config.site_packages, config.hidden_paths, config.uid_base, config.uid_count, os.geteuid())
        with cls._cache_lock:
            if key in cls._cache:
                return cls(config, cls._cache[key])
            wanted = LEVELS if config.isolation == "auto" else (config.isolation,)
            errors = []
            for level in wanted:
                if level != "rlimits" and shutil.which(level) is None:
                    errors.append(f"{level}: not installed")
                    continue
                try:
                    iso = cls(config, level)
                    problem = iso.probe()
                except RuntimeError as exc:
                    problem = str(exc)
                if problem is None:
                    cls._cache[key] = level
                    return iso
                errors.append(f"{level}: {problem}")
            fix = "install bubblewrap (apt-get install bubblewrap) or use isolation='auto'"
            raise RuntimeError(f"sandbox isolation {config.isolation!r} is not available here ({'; '.join(errors)}); {fix}")

    def probe(self) -> str | None:
        """Run ``print('ok')`` through the full launch; None when it works, else the problem."""
        uid_fd = self.leases.acquire() if self.leases else None
        try:
            launch = self.launch(["run", self.limits(self.config.cpu_seconds_per_call)], uid_fd[0] if uid_fd else None)
            try:
                done = subprocess.run(launch.argv, input=b"print('ok')", capture_output=True, env=launch.env, cwd=launch.cwd, timeout=30)
            finally:
                self.cleanup(launch)
            if done.returncode != 0 or done.stdout.strip() != b"ok":
                return (done.stderr or done.stdout).decode(errors="replace").strip()[-300:] or f"exit code {done.returncode}"
            return None
        finally:
            if uid_fd and self.leases:
                self.leases.release(*uid_fd)

    def limits(self, cpu_seconds: int) -> str:
        """The child's rlimit spec (``NAME=value,...``)."""
        c = self.config
        return (
            f"AS={c.memory_mb << 20},CPU={cpu_seconds},NPROC={self.nproc},FSIZE={c.max_file_mb << 20},"
            f"NOFILE={c.max_open_files},CORE=0"
        )

    def launch(self, child_args: list[str], uid: int | None, server: bool = False) -> Launch:
        """The command line that runs ``child.py`` with ``child_args`` at this level. A fork
        ``server`` (see :mod:`.serve`) keeps CAP_SYS_ADMIN under bubblewrap as root, to give each
        call its own mount and pid namespace."""
        limits = child_args[1]
        if self.level == "bwrap" and uid is not None:
            # The child drops to ``uid`` itself (see child.set_limits): one exec fewer than
            # setpriv, ~4 ms of CPU per call. bwrap already set no_new_privs.
            limits, drop = f"{limits},UID={uid}", []
        else:
            drop = _drop_privileges(uid)
        python = [PYTHON, *PYTHON_FLAGS, "-c", BOOT, CHILD_CODE, child_args[0], limits, self.extra_path, *child_args[2:]]
        env = {"PATH": SANDBOX_PATH, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TMPDIR": "/tmp", "HOME": "/tmp", **_QUIET_ENV, **self.config.extra_env}
        if self.level == "bwrap":
            # bwrap's --die-with-parent ties the sandbox to bwrap, not bwrap to us: without the
            # parent-death signal a SIGKILLed trainer leaves bwrap and its sandbox running.
            argv = [*_PDEATHSIG, "bwrap", *self._bwrap_args(server), "--chdir", "/tmp", "--", *python]
            return Launch(argv, env, "/", uid, None, True)
        if self.level == "unshare":
            return Launch(self._unshare_argv(drop, python), env, "/", uid, None, True)
        workdir = tempfile.mkdtemp(prefix="run-", dir=self.base_dir)
        if uid is not None:
            os.chown(workdir, uid, uid)
        env.update(HOME=workdir, TMPDIR=workdir)
        if drop or not shutil.which("setpriv"):
            argv = [*drop, *python]
        else:
            argv = [*_PDEATHSIG, *python]
        return Launch(argv, env, workdir, uid, workdir, False)

    def cleanup(self, launch: Launch) -> None:
        """Remove the host working directory of a finished run (rlimits level)."""
        if launch.host_workdir:
            remove_tree(launch.host_workdir)

    def _bwrap_args(self, server: bool = False) -> list[str]:
        size = str(self.config.disk_mb << 20)
        ns = ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        if self.root:
            # Privileged bwrap keeps only what the child needs to drop to the sandbox uid.
            caps = ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
            if server:
                caps += ["--cap-add", "CAP_SYS_ADMIN"]
        else:
            ns = ["--unshare-all"]
            caps = ["--cap-drop", "ALL"]
        args = [*ns, "--die-with-parent", "--new-session", *caps, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        args += ["--size", size, "--perms", "1777", "--tmpfs", "/tmp", "--size", size, "--perms", "1777", "--tmpfs", "/dev/shm"]
        for path in _under_private_tmp(self.exposed):  # e.g. a virtualenv under /tmp: bind it back
            for parent in _parents_between("/tmp", path):
                args += ["--perms", "0755", "--dir", parent]
            args += ["--ro-bind", path, path]
        for hidden, binds in _hide_plan(self.config.hidden_paths, self.exposed):
            args += ["--tmpfs", hidden]
            for path in binds:
                for parent in _parents_between(hidden, path):
                    args += ["--perms", "0755", "--dir", parent]
                args += ["--ro-bind", path, path]
        return args

    def _unshare_argv(self, drop: list[str], python: list[str]) -> list[str]:
        size = self.config.disk_mb << 20
        lines = ["set -e", f"mount -t tmpfs -o size={size},mode=1777 tmpfs /dev/shm"]
        keep = _under_private_tmp(self.exposed)  # staged on the new /dev/shm while /tmp is replaced
        for j, path in enumerate(keep):
            lines += [f"mkdir /dev/shm/.keep{j}", f"mount --bind {shlex.quote(path)} /dev/shm/.keep{j}"]
        lines.append(f"mount -t tmpfs -o size={size},mode=1777 tmpfs /tmp")
        for j, path in enumerate(keep):
            q = shlex.quote(path)
            lines += [f"mkdir -p {q}", f"mount --bind /dev/shm/.keep{j} {q}", f"umount /dev/shm/.keep{j}",
                      f"rmdir /dev/shm/.keep{j}", f"mount -o remount,bind,ro {q}" + ("" if self.root else " 2>/dev/null || true")]
        for i, (hidden, binds) in enumerate(_hide_plan(self.config.hidden_paths, self.exposed)):
            stage = [f"/tmp/.stage{i}_{j}" for j in range(len(binds))]
            for path, st in zip(binds, stage):
                lines += [f"mkdir {st}", f"mount --bind {shlex.quote(path)} {st}"]
            lines.append(f"mount -t tmpfs -o mode=0755 tmpfs {shlex.quote(hidden)}")
            for path, st in zip(binds, stage):
                q = shlex.quote(path)
                lines += [f"mkdir -p {q}", f"mount --bind {st} {q}", f"umount {st}", f"rmdir {st}"]
                # Read-only where permitted (in a user namespace the source's flags may be locked).
                lines.append(f"mount -o remount,bind,ro {q}" + ("" if self.root else " 2>/dev/null || true"))
        # ``cd`` makes the shell export OLDPWD: unset it so the code sees the allow-listed environment.
        lines += ["cd /tmp", "unset OLDPWD", 'set +e', '"$@"']  # sh stays pid 1 (signals to pid 1 are ignored; the code runs as pid 2)
        user = [] if self.root else ["--user", "--map-root-user"]
        unshare = ["unshare", *user, "--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child", "--mount-proc"]
        return [*_PDEATHSIG, *unshare, "--", "/bin/sh", "-c", "\n".join(lines), "sandbox", *drop, *python]


def _drop_privileges(uid: int | None) -> list[str]:
    """``setpriv`` prefix that becomes ``uid`` with no capabilities (empty when not root)."""
    if uid is None:
        return []
    return [
        "setpriv", "--pdeathsig", "KILL", "--reuid", str(uid), "--regid", str(uid), "--clear-groups",
        "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--",
    ]


def _exposed_paths(site_packages: bool) -> list[str]:
    """The Python installation (first) and, when asked, the parent's site-packages directories."""
    paths = [os.path.realpath(sys.base_prefix)]
    if not os.path.realpath(PYTHON).startswith(paths[0] + os.sep):
        paths.append(os.path.dirname(os.path.realpath(PYTHON)))
    if site_packages:
        for p in sys.path:
            real = os.path.realpath(p) if p else ""
            if real.endswith("site-packages") and os.path.isdir(real) and real not in paths:
                paths.append(real)
    return paths


def _under_private_tmp(exposed: list[str]) -> list[str]:
    """Exposed paths that the sandbox's private /tmp would hide (a checkout or venv in /tmp)."""
    return [e for e in exposed if e.startswith("/tmp" + os.sep)]


def _hide_plan(hidden: tuple[str, ...], exposed: list[str]) -> list[tuple[str, list[str]]]:
    """For each hidden directory that exists: the exposed paths below it to bind back. A
    directory that contains nothing exposed is hidden whole; one inside an exposed path is
    skipped (hiding it would hide part of Python)."""
    plan = []
    for h in hidden:
        h = os.path.realpath(h)
        if not os.path.isdir(h) or any(h == e or h.startswith(e + os.sep) for e in exposed):
            continue
        plan.append((h, [e for e in exposed if e.startswith(h + os.sep)]))
    return plan


def _parents_between(top: str, path: str) -> list[str]:
    """Directories strictly between ``top`` and ``path``, outermost first."""
    rel = Path(path).relative_to(top).parts[:-1]
    return [os.path.join(top, *rel[: i + 1]) for i in range(len(rel))]


def _world_reachable(path: str) -> bool:
    """Whether any user can traverse to ``path`` (every ancestor has o+x)."""
    p = Path(path)
    return all(os.stat(a).st_mode & 0o001 for a in [*reversed(p.parents), p])


def _own_process_count() -> int:
    uid = os.getuid()
    n = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                n += os.stat(f"/proc/{name}").st_uid == uid
            except OSError:
                pass
    return n


def _private_base_dir() -> str:
    base = tempfile.mkdtemp(prefix="agentrl-sandbox-")
    os.chmod(base, 0o711)  # the sandbox uid may enter its own run directory, not list others
    atexit.register(remove_tree, base)
    return base


def remove_tree(path: str) -> None:
    """Remove a run directory the code may have made deep or unwritable."""
    try:
        shutil.rmtree(path)
    except (OSError, RecursionError):  # unwritable or deeper than Python's recursion limit
        pass
    if os.path.lexists(path):
        subprocess.run(["chmod", "-R", "u+rwx", path], capture_output=True)
        subprocess.run(["rm", "-rf", "--one-file-system", path], capture_output=True)
