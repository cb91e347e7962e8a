"""What a sandboxed run may use: time, memory, processes, files, output, isolation.

Every limit comes from this configuration (set by whoever builds the tool), never from the
model's arguments.

Example::

    from agentrl.tools.sandbox import SandboxConfig
    cfg = SandboxConfig(timeout=5, memory_mb=512)
    assert cfg.cpu_seconds_per_call == 11
"""

from __future__ import annotations

import functools
import glob
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

IsolationRequest = Literal["auto", "bwrap", "unshare", "rlimits"]
ISOLATION_REQUESTS: tuple[str, ...] = ("auto", "bwrap", "unshare", "rlimits")

# Never shown, even where they lie inside a directory the sandbox sees (see docs/sandbox.md):
# home directories and runtime state are where credentials usually live. Outside the bound
# directories nothing of the host is shown anyway; this list matters when, say, the Python
# installation's tree contains one of them.
DEFAULT_HIDDEN: tuple[str, ...] = ("/root", "/home", "/run", "/mnt", "/media", "/srv", "/var/tmp")
# Third-party packages the code may import by default, where installed: what tool calls in
# maths and code tasks reach for. sympy needs mpmath. Anything else in site-packages (an
# environment's answer data included) stays hidden.
DEFAULT_PACKAGES: tuple[str, ...] = ("numpy", "sympy", "mpmath")
# What the interpreter and the commands it may run need of the system: bound read-only, or
# recreated as the links they are (merged /usr).
SYSTEM_DIRS: tuple[str, ...] = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
_SITE_NAMES = ("site-packages", "dist-packages")
PYTHON = os.path.realpath(sys.executable)
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")  # what bubblewrap's --dev offers


@dataclass(frozen=True)
class SandboxConfig:
    """Limits and isolation of the local sandbox.

    ``timeout`` is wall-clock seconds per call, enforced by the parent (a SIGKILL of the
    whole sandbox). ``memory_mb`` is the address-space limit (RLIMIT_AS), ``max_processes``
    counts processes and threads of the sandbox user (RLIMIT_NPROC), ``max_file_mb`` caps one
    file (RLIMIT_FSIZE), ``disk_mb`` the private /tmp (a sized tmpfs, where the level can
    mount one). ``max_output_chars`` is what the model reads (head + tail kept);
    ``max_output_bytes`` is how much output is read at all before the run is stopped.
    ``isolation`` picks the strongest available level with ``"auto"``; naming a level fails
    clearly if it is not available.

    ``packages``: top-level import names of the installed packages the code may import (each
    with its whole distribution: ``numpy`` brings ``numpy.libs`` and its ``.dist-info``);
    list dependencies too. Names not installed are skipped. Everything else of the host is
    hidden: the checkout, home directories, other packages and their data files (see
    docs/sandbox.md for what each level shows). ``site_packages=True`` shows the parent's
    whole site-packages directories instead, every package and data file in them (an
    environment's answers included): for trusted code only. ``max_concurrency``
    bounds runs at once (default: CPU count). ``uid_base`` is the first of the unprivileged
    user ids used when started as root.

    ``fork_server`` (fresh mode): fork each call from a warm interpreter already inside the
    sandbox (see :mod:`.forkserver`) instead of starting one interpreter per call; each
    server is replaced after ``fork_server_calls`` calls or any anomaly. It needs root (every
    call gets a leased uid of its own); elsewhere fresh mode starts one interpreter per call.
    """

    timeout: float = 10.0
    memory_mb: int = 1024
    # CPU seconds per fresh call (RLIMIT_CPU), a backstop behind the wall-clock kill: default
    # 2 * timeout + 1, so a CPU-bound loop always meets the wall limit first and the model reads
    # the same time-limit note at every isolation level (not a bare "Killed").
    cpu_seconds: float | None = None
    worker_cpu_seconds: float | None = None  # whole life of a stateful worker; default 20 * timeout
    max_processes: int = 64
    max_file_mb: int = 16
    max_open_files: int = 256
    disk_mb: int = 64
    max_output_chars: int = 4000
    max_output_bytes: int = 1 << 20
    isolation: IsolationRequest = "auto"
    site_packages: bool = False
    packages: tuple[str, ...] = DEFAULT_PACKAGES
    max_concurrency: int | None = None
    uid_base: int = 1_000_000
    uid_count: int = 4096
    hidden_paths: tuple[str, ...] = DEFAULT_HIDDEN
    extra_env: dict[str, str] = field(default_factory=dict)
    fork_server: bool = True
    fork_server_calls: int = 1000

    def __post_init__(self) -> None:
        if not (self.timeout > 0 and math.isfinite(self.timeout)):
            raise ValueError(f"sandbox timeout must be a positive number of seconds, got {self.timeout}")
        if self.isolation not in ISOLATION_REQUESTS:
            raise ValueError(f"isolation must be one of {ISOLATION_REQUESTS}, got {self.isolation!r}")
        for name in ("memory_mb", "max_processes", "max_file_mb", "max_open_files", "disk_mb", "max_output_chars", "max_output_bytes", "uid_count", "fork_server_calls"):
            if getattr(self, name) < 1:
                raise ValueError(f"sandbox {name} must be at least 1, got {getattr(self, name)}")
        if self.max_output_bytes < self.max_output_chars:
            raise ValueError("max_output_bytes must be at least max_output_chars")
        object.__setattr__(self, "packages", tuple(self.packages))  # a list would not hash (the level cache keys on it)
        bad = [p for p in self.packages if not p.isidentifier()]
        if bad:
            raise ValueError(f"packages are top-level import names such as 'numpy', got {bad[0]!r}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1 or None, got {self.max_concurrency}")

    @property
    def cpu_seconds_per_call(self) -> int:
        return int(math.ceil(self.cpu_seconds if self.cpu_seconds is not None else 2 * self.timeout + 1))

    @property
    def cpu_seconds_per_worker(self) -> int:
        return int(math.ceil(self.worker_cpu_seconds if self.worker_cpu_seconds is not None else 20 * self.timeout))


# ---- what the sandbox sees of the host's files (every level; see docs/sandbox.md) ----


@dataclass(frozen=True)
class Mount:
    """One step of building the sandbox's root: ``ro`` (bind the host path read-only), ``link``
    (a symlink to ``arg``), ``tmpfs`` (``arg``: ``SIZE:MODE``), ``dev`` or ``proc``."""

    kind: str
    path: str
    arg: str = ""


@dataclass(frozen=True)
class HostView:
    """What the sandbox sees of the host: ``shown`` trees read-only (files allowed), ``links``
    ``(path, target)``, ``masks`` (directories inside a shown tree shown empty: other packages'
    site-packages, ``hidden_paths``, a checkout), ``sys_path`` (the site directories the code
    imports from) and ``required`` (the interpreter's own paths, which must be reachable)."""

    shown: tuple[str, ...]
    links: tuple[tuple[str, str], ...]
    masks: tuple[str, ...]
    sys_path: tuple[str, ...]
    required: tuple[str, ...]

    def root(self, disk_bytes: int) -> list["Mount"]:
        """Every step that builds the sandbox's root at a namespace level, in order (a directory
        before what is mounted inside it): the view, then /dev, /proc, /sys and the private,
        ``disk_bytes``-sized /tmp and /dev/shm."""
        size = str(disk_bytes)
        ops = [*(Mount("ro", p) for p in self.shown), *(Mount("link", p, t) for p, t in self.links),
               *(Mount("tmpfs", m, "65536:0755") for m in self.masks), Mount("dev", "/dev"), Mount("proc", "/proc"),
               Mount("tmpfs", "/tmp", f"{size}:1777"), Mount("tmpfs", "/dev/shm", f"{size}:1777")]
        if os.path.isdir("/sys"):
            ops.append(Mount("ro", "/sys"))
        return sorted(ops, key=lambda m: Path(m.path).parts)


def host_view(config: SandboxConfig) -> HostView:
    """The view for ``config`` on this host (cached: it reads package metadata)."""
    try:
        cwd = os.getcwd()
    except OSError:  # the trainer's directory was removed: there is no checkout to hide there
        cwd = "/"
    return _host_view(config.site_packages, config.packages, tuple(config.hidden_paths), tuple(sys.path), cwd)


@functools.lru_cache(maxsize=64)
def _host_view(site_packages: bool, packages: tuple[str, ...], hidden: tuple[str, ...], path: tuple[str, ...],
               cwd: str) -> HostView:
    python = _python_paths()
    sites = _site_dirs(path)
    on_path = [s for s in sites if s in {os.path.realpath(p) for p in path if p}]
    if site_packages:
        allowed, sys_path = on_path, on_path
    else:
        allowed = sorted({e for name in packages for e in _package_entries(name, on_path)})
        sys_path = [s for s in on_path if any(e.startswith(s + os.sep) for e in allowed)]
    links, system = [], []
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            links.append((d, os.readlink(d)))
        elif os.path.isdir(d):
            system.append(d)
    roots = [*system, *python, *allowed]
    candidates = [*sites, *(os.path.realpath(h) for h in hidden), *_checkouts(cwd)]
    masks = {m for m in candidates if m not in allowed and os.path.isdir(m)}
    roots = list(dict.fromkeys(roots))
    # Keep only what changes the view: a root not already shown from above, a mask inside something shown.
    shown = [r for r in roots if _nearest_above(r, roots, masks) not in roots]
    masks = {m for m in masks if _nearest_above(m, roots, masks) in roots}
    return HostView(tuple(sorted(shown)), tuple(links), tuple(sorted(masks)), tuple(sys_path), tuple(python))


def _inside(path: str, top: str) -> bool:
    return path.startswith(top.rstrip(os.sep) + os.sep)


def _nearest_above(path: str, roots: list[str], masks: set[str]) -> str | None:
    """The innermost root or mask strictly above ``path`` (None: nothing is)."""
    above = [p for p in (*roots, *masks) if _inside(path, p)]
    return max(above, key=len, default=None)


def _python_paths() -> list[str]:
    """The Python installation (first), its standard library and extension modules, and where
    the interpreter lives outside it (a copied virtualenv), its directory and ``pyvenv.cfg``."""
    import _ctypes  # an extension module: its folder is lib-dynload

    paths = [os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix, os.path.dirname(os.__file__),
                                            os.path.dirname(_ctypes.__file__))]
    here = os.path.dirname(PYTHON)
    if not _inside(PYTHON, paths[0]):
        paths += [here, *[p for p in [os.path.join(os.path.dirname(here), "pyvenv.cfg")] if os.path.isfile(p)]]
    return list(dict.fromkeys(p for p in paths if os.path.exists(p)))


def _site_dirs(path: tuple[str, ...]) -> list[str]:
    """Every site-packages directory of this host's Pythons that we can find (the parent's
    path first): all hidden unless a package in them is allowed."""
    import site

    found = [p for p in path if p]
    for getter in ("getsitepackages", "getusersitepackages"):
        try:
            got = getattr(site, getter)()
            found += [got] if isinstance(got, str) else list(got)
        except (AttributeError, OSError):
            pass
    for prefix in dict.fromkeys([sys.base_prefix, sys.prefix, "/usr", "/usr/local"]):
        for name in _SITE_NAMES:
            found += glob.glob(os.path.join(prefix, "lib*", "python3*", name)) + glob.glob(os.path.join(prefix, "lib", "python3", name))
    real = [os.path.realpath(p) for p in found]
    return list(dict.fromkeys(p for p in real if os.path.basename(p) in _SITE_NAMES and os.path.isdir(p)))


def _package_entries(name: str, sites: list[str]) -> list[str]:
    """The top-level entries of site-packages that make up the installed package importable as
    ``name`` (its distributions' files: ``numpy/``, ``numpy.libs/``, ``numpy-*.dist-info``), from
    the first site directory that has it, as import would; [] when it is not installed."""
    for site_dir in sites:
        names = os.listdir(site_dir)
        tops = _distribution_tops(site_dir, names, name) or {name}  # no metadata: the module itself
        # A top-level name stands for its directory and its module files (six -> six.py).
        entries = [e for e in names if e in tops or (e.split(".")[0] in tops and not e.endswith(("-info", ".pth")))]
        if any(e == name or e.startswith(name + ".") for e in entries):
            return [os.path.join(site_dir, e) for e in sorted(entries) if e != "__pycache__"]
    return []


def _distribution_tops(site_dir: str, names: list[str], name: str) -> set[str]:
    """Top-level names (and metadata folders) of the distributions in ``site_dir`` that provide
    module ``name``. Reads the distribution named like the module first, every RECORD only if needed."""
    metas = [m for m in names if m.endswith((".dist-info", ".egg-info"))]
    same = [m for m in metas if m.split("-")[0].lower() == name.lower()]
    for group in (same, [m for m in metas if m not in same]):
        hits: set[str] = set()
        for meta in group:
            tops = _record_tops(os.path.join(site_dir, meta))
            if name in {t.split(".")[0] for t in tops}:
                hits |= {meta, *tops}
        if hits:
            return hits
    return set()


def _record_tops(meta: str) -> set[str]:
    """First path components of a distribution's files inside its site directory."""
    for listing in ("RECORD", "installed-files.txt", "top_level.txt"):
        try:
            with open(os.path.join(meta, listing), encoding="utf-8", errors="replace") as f:
                lines = [line.split(",")[0].strip() for line in f]
        except OSError:
            continue
        if listing == "installed-files.txt":  # egg-info: paths relative to the egg-info folder
            lines = [os.path.normpath(os.path.join(os.path.basename(meta), line)) for line in lines]
        return {line.split("/")[0] for line in lines if line and not line.startswith(("..", "/"))} - {os.path.basename(meta)}
    return set()


def _checkouts(cwd: str) -> list[str]:
    """The agentrl checkout and the trainer's working directory, when they look like a project:
    hidden even if they lie inside a shown tree (a checkout in /usr/src)."""
    found = []
    for d in (Path(__file__).resolve().parents[2], Path(cwd).resolve()):
        if any((d / marker).exists() for marker in (".git", "pyproject.toml", "setup.py")):
            found.append(str(d))
    return found


def missing_parents(path: str, done: list[Mount]) -> list[str]:
    """Directories above ``path`` that nothing mounted so far provides: not a mount point, and
    not inside a read-only bind (a tmpfs, /tmp or a hidden directory, starts empty)."""
    missing = []
    for parent in [str(p) for p in reversed(Path(path).parents)][1:]:
        around = [m for m in done if m.path == parent or parent.startswith(m.path.rstrip("/") + "/")]
        nearest = max(around, key=lambda m: len(m.path), default=None)
        if nearest is None or (nearest.path != parent and nearest.kind != "ro"):
            missing.append(parent)
    return missing


def unshare_steps(m: Mount) -> list[tuple[str, str, str]]:
    """``m`` as the steps :func:`child.enter_root` knows: a ``dev`` is bubblewrap's minimal
    /dev (the harmless devices on a tmpfs), ``proc`` a bind of the pid namespace's /proc."""
    if m.kind == "dev":
        links = [("link", "/dev/" + n, t) for n, t in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                                                      ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2"))]
        devices = [("bind", "/dev/" + n, "") for n in DEVICES if os.path.exists("/dev/" + n)]
        return [("tmpfs", m.path, "0:0755"), *devices, *links]
    return [("bind" if m.kind == "proc" else m.kind, m.path, m.arg)]
