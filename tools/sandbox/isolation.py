"""How a sandboxed interpreter is launched: the isolation level, its command line, and what
the sandbox sees of the host's files.

The rule, at every level: the code sees only what its interpreter needs, read-only: the
system directories (``/usr``, ``/etc`` and the ``/bin``, ``/lib*`` links into ``/usr``), the
Python installation (its standard library), and the packages ``SandboxConfig.packages``
allows (by default numpy, sympy and mpmath where installed), each with its whole
distribution. Everything else of the host is hidden: the checkout, home directories, the
virtualenv and every other package in site-packages (so an environment's answer data, such
as HumanEval's, is out of reach), ``.env`` and credential files, and ``hidden_paths`` even
inside a shown tree. :class:`~.config.HostView` is that plan (:func:`~.config.host_view`);
docs/sandbox.md lists what is shown and hidden and says how to allow a package.

Levels, strongest first (``isolation_level`` names the one in use):

- ``bwrap``: bubblewrap. A new root holding only the host view (bound read-only) plus a
  minimal ``/dev``, ``/proc`` and ``/sys``; no network (own empty network namespace); private
  sized tmpfs for /tmp (the working directory) and /dev/shm; own pid/ipc/uts namespaces,
  ``--cap-drop ALL``, ``--die-with-parent``, ``--new-session``. Started as root, bwrap runs
  privileged (no user namespace, which would map the sandbox onto host root), sets
  ``no_new_privs`` and keeps only CAP_SETUID and CAP_SETGID, which the child uses as its
  first act to become a leased unprivileged uid (after which it has no capabilities and,
  under no_new_privs, cannot gain any).
- ``unshare``: the same namespaces through util-linux ``unshare`` where permitted; the child
  builds the same view itself (:func:`child.enter_root`) and pivots into it, detaching the
  host's root, then becomes its leased uid under no_new_privs.
- ``rlimits``: no namespaces. The host view is enforced by Landlock (:mod:`.landlock`, Linux
  >= 5.13): outside it, files cannot be read, listed or executed (``PermissionError``);
  names inside hidden site-packages directories can still be listed, and ``stat`` still
  tells whether a path exists. Writes, and the network, stay as the uid's permissions allow.
  Without Landlock this level hides nothing, and :func:`describe_level` says so.

Always: an unprivileged uid when started as root, rlimits set inside the child before any
user code (soft = hard), an allow-listed environment, a private working directory, and the
parent's kill of the whole process group plus stragglers (see :mod:`.process`).

The same launch starts a fresh-mode fork server (``child.py server``, :mod:`.serve`) at every
level: it runs inside the same view and namespaces, and each call it forks gets the
guarantees above plus a mount and IPC namespace of its own (see :mod:`.forkserver`).

Example::

    from agentrl.tools.sandbox.config import SandboxConfig
    from agentrl.tools.sandbox.isolation import Isolation
    iso = Isolation.for_config(SandboxConfig())
    print(iso.level, iso.view.shown)  # "bwrap" where bubblewrap works
"""

from __future__ import annotations

import atexit
import functools
import marshal
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from . import landlock
from .config import PYTHON, SYSTEM_DIRS, Mount, SandboxConfig, host_view, missing_parents, unshare_steps
from .uids import UidLeases

LEVELS: tuple[str, ...] = ("bwrap", "unshare", "rlimits")

# What each level means, in one phrase (the trainer's "tool isolation:" line).
MEANINGS: dict[str, str] = {
    "bwrap": "bubblewrap: no network, sees only the system directories, the standard library and the "
             "allowed packages (read-only), private /tmp, own pid namespace, no capabilities; the strongest level",
    "unshare": "util-linux unshare: no network, the same read-only view of the host as bwrap, private /tmp, "
               "own pid namespace; as a normal user the code keeps root's capabilities in its user namespace",
    "rlimits": "no namespaces: resource limits, an allow-listed environment and a private working directory; "
               "Landlock keeps the host's files outside the view unreadable (names inside site-packages stay "
               "listable), but the code can reach the network and write where its uid may",
    "e2b": "E2B cloud sandboxes: the code runs on E2B's machines, not this one",
}
_RLIMITS_WITHOUT_LANDLOCK = (
    "no namespaces: resource limits, an allow-listed environment and a private working directory only; "
    "this kernel has no Landlock, so the code can read every file its uid may (the checkout, other packages' "
    "data), reach the network and write where its uid may"
)


def describe_level(level: str) -> str:
    """``level`` with what it isolates and, below ``bwrap``, how to get the strongest level.

    >>> describe_level("bwrap")
    'bwrap (bubblewrap: no network, sees only the system directories, ...; the strongest level)'
    >>> "apt-get install bubblewrap" in describe_level("rlimits") or shutil.which("bwrap") is not None
    True
    """
    meaning = MEANINGS.get(level, "a level this version does not describe")
    if level == "rlimits" and landlock_abi() < 1:
        meaning = _RLIMITS_WITHOUT_LANDLOCK
    text = f"{level} ({meaning})"
    if level not in ("unshare", "rlimits"):
        return text
    if shutil.which("bwrap") is None:
        return f"{text}; for bwrap, the strongest level, install bubblewrap (sudo apt-get install bubblewrap)"
    return (f"{text}; bubblewrap is installed but failed its start-up check here (often: unprivileged user "
            "namespaces are disabled); python_tool(isolation='bwrap') raises with the reason")


@functools.cache
def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: none), probed once."""
    return landlock.abi_version()


CHILD_SOURCE = (Path(__file__).with_name("child.py")).read_text()
# The child program travels precompiled (marshal, same interpreter binary): loading it takes
# ~0.2 ms where compiling its source on every start took several.
CHILD_CODE = marshal.dumps(compile(CHILD_SOURCE, "<sandbox>", "exec")).hex()
# Runs in the child at the rlimits level (docstrings dropped: it travels in every launch).
LANDLOCK_CODE = compile(Path(__file__).with_name("landlock.py").read_text(), "<sandbox-landlock>", "exec", optimize=2)
BOOT = "import marshal,sys;exec(marshal.loads(bytes.fromhex(sys.argv.pop(1))))"
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
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}  # syscall numbers


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
        self.view = host_view(config)
        self.exposed = [p for p in self.view.shown if p not in SYSTEM_DIRS]  # bound paths the private /tmp must keep
        self.extra_path = os.pathsep.join(self.view.sys_path)
        self.nproc = config.max_processes if self.root else _own_process_count() + config.max_processes + 64
        self.base_dir = _private_base_dir() if level == "rlimits" else None
        if level == "rlimits" and self.root:
            needed = [*self.view.required, *(self.view.sys_path if config.site_packages else ())]
            blocked = [p for p in needed if not _world_reachable(p)]
            if blocked:
                raise RuntimeError(
                    f"the sandbox user cannot reach {blocked[0]} (a parent directory is not world-searchable); "
                    "install bubblewrap (apt-get install bubblewrap) so the sandbox can bind it, or make the "
                    f"path searchable (chmod o+x on its parents), or use a Python outside it"
                )
        self._view_arg = self._confinement()

    @classmethod
    def for_config(cls, config: SandboxConfig) -> "Isolation":
        """The strongest working level allowed by ``config.isolation``; probed once per process."""
        key = (config.isolation, config.site_packages, tuple(config.packages), config.hidden_paths, config.uid_base,
               config.uid_count, os.geteuid(), tuple(sys.path))
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
        limits = child_args[1] + self._view_arg
        if self.level != "rlimits" and uid is not None:
            # The child drops to ``uid`` itself (see child.set_limits), after building its view
            # at the unshare level: one exec fewer than setpriv, ~4 ms of CPU per call.
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
            return Launch(self._unshare_argv(python), env, "/", uid, None, True)
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

    def _confinement(self) -> str:
        """The ``VIEW=`` item of the child's spec: the root the child builds (unshare) or its
        Landlock rules (rlimits); empty under bwrap, which builds the root itself."""
        if self.level == "unshare":
            if os.uname().machine not in _PIVOT_ROOT:
                raise RuntimeError(f"the unshare level does not know pivot_root on {os.uname().machine}; install bubblewrap")
            steps = [("tmpfs", "", "0:0755"), *(s for m in self.view.root(self.config.disk_mb << 20) for s in unshare_steps(m))]
            spec: tuple[object, ...] = ("root", _new_root_mount_point(), steps, _PIVOT_ROOT[os.uname().machine])
        elif self.level == "rlimits" and landlock_abi() >= 1:
            handled, rules = landlock.plan_view(self.view, landlock_abi())
            spec = ("landlock", LANDLOCK_CODE, [*rules, (self.base_dir, handled)], handled)
        else:
            return ""
        return ",VIEW=" + marshal.dumps(spec).hex()

    def _bwrap_args(self, server: bool = False) -> list[str]:
        ns = ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        if self.root:
            # Privileged bwrap keeps only what the child needs to drop to the sandbox uid.
            caps = ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
            if server:
                caps += ["--cap-add", "CAP_SYS_ADMIN"]
        else:
            ns = ["--unshare-all"]
            caps = ["--cap-drop", "ALL"]
        args = [*ns, "--die-with-parent", "--new-session", *caps]
        done: list[Mount] = []
        for m in self.view.root(self.config.disk_mb << 20):
            for parent in missing_parents(m.path, done):  # bwrap would make them 0700: unreachable for the uid
                args += ["--perms", "0755", "--dir", parent]
                done.append(Mount("dir", parent))
            done.append(m)
            if m.kind == "ro":
                args += ["--ro-bind", m.path, m.path]
            elif m.kind == "link":
                args += ["--symlink", m.arg, m.path]
            elif m.kind == "tmpfs":
                size, mode = m.arg.split(":")
                args += ["--size", size, "--perms", mode, "--tmpfs", m.path]
            else:
                args += [f"--{m.kind}", m.path]
        for path in ("/", *self.view.masks):  # read-only once everything inside is mounted
            args += ["--remount-ro", path]
        return args

    def _unshare_argv(self, python: list[str]) -> list[str]:
        # sh stays pid 1 (signals to pid 1 are ignored; the code runs as pid 2). Its working
        # directory is the host's root, so the child's pivot_root moves it into the sandbox's.
        user = [] if self.root else ["--user", "--map-root-user"]
        unshare = ["unshare", *user, "--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child", "--mount-proc"]
        return [*_PDEATHSIG, *unshare, "--", "/bin/sh", "-c", '"$@"', "sandbox", *python]


@functools.cache
def _new_root_mount_point() -> str:
    """A directory of ours on which each unshare sandbox mounts its new root, inside its own
    mount namespace (the host never sees anything mounted there). One per user, kept: a
    SIGKILLed trainer would otherwise leave one behind per process."""
    path = os.path.join(tempfile.gettempdir(), f"agentrl-sandbox-root-{os.geteuid()}")
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():  # planted by someone else: use a fresh one
        path = tempfile.mkdtemp(prefix="agentrl-sandbox-root-")
        atexit.register(remove_tree, path)
    return path


def _drop_privileges(uid: int | None) -> list[str]:
    """``setpriv`` prefix that becomes ``uid`` with no capabilities (empty when not root)."""
    if uid is None:
        return []
    return [
        "setpriv", "--pdeathsig", "KILL", "--reuid", str(uid), "--regid", str(uid), "--clear-groups",
        "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--",
    ]


def _under_private_tmp(exposed: list[str]) -> list[str]:
    """Bound paths that the sandbox's private /tmp would hide (a checkout or venv in /tmp)."""
    return [e for e in exposed if e.startswith("/tmp" + os.sep)]


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
