"""What a sandboxed run may use: time, memory, processes, files, output, isolation.

Every limit comes from this configuration (set by whoever builds the tool), never from the
model's arguments.

Example::

    from agentrl.tools.sandbox import SandboxConfig
    cfg = SandboxConfig(timeout=5, memory_mb=512)
    assert cfg.cpu_seconds_per_call == 11
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

IsolationRequest = Literal["auto", "bwrap", "unshare", "rlimits"]
ISOLATION_REQUESTS: tuple[str, ...] = ("auto", "bwrap", "unshare", "rlimits")

# Directories replaced by an empty tmpfs inside the sandbox (where the isolation level can
# mount): home directories and runtime state are where credentials usually live. The Python
# installation is bound back read-only when it sits below one of them.
DEFAULT_HIDDEN: tuple[str, ...] = ("/root", "/home", "/run", "/mnt", "/media", "/srv", "/var/tmp")


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
    clearly if it is not available. ``site_packages`` makes the parent's site-packages
    importable (numpy and friends) at the price of a slower start. ``max_concurrency``
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
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1 or None, got {self.max_concurrency}")

    @property
    def cpu_seconds_per_call(self) -> int:
        return int(math.ceil(self.cpu_seconds if self.cpu_seconds is not None else 2 * self.timeout + 1))

    @property
    def cpu_seconds_per_worker(self) -> int:
        return int(math.ceil(self.worker_cpu_seconds if self.worker_cpu_seconds is not None else 20 * self.timeout))
