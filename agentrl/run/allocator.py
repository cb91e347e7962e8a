"""The C allocator a training run uses: jemalloc where it is installed, else the C library's.

A GRPO step alternates two allocation patterns in one process: the rollout's decode steps and
KV caches, then the update's activations and gradients, micro-batch after micro-batch. glibc's
malloc serves both from per-thread arenas whose freed memory stays scattered across partly
used pages; even after ``malloc_trim`` (agentrl/run/memory.py) the resident set grows step
after step. Measured on the SmolLM2 TIR example (docs/results.md), the update's peak resident
set over steps 1-4 was 4.07-5.81 GB with glibc and 3.21-4.68 GB with jemalloc.

The allocator is chosen when the process starts (``LD_PRELOAD``), so ``agentrl train`` starts
itself again once, with jemalloc preloaded, when it finds the library (Debian/Ubuntu:
``apt install libjemalloc2``) — the same thing ``python -m torch.backends.xeon.run_cpu``
does for CPU training. ``AGENTRL_ALLOCATOR=system`` keeps the C library's malloc. The run's
first lines say which allocator it runs under.

>>> plan = reexec_plan({}, "/usr/lib/libjemalloc.so.2")
>>> plan["LD_PRELOAD"], plan[REEXEC_GUARD]
('/usr/lib/libjemalloc.so.2', '1')
>>> reexec_plan({"AGENTRL_ALLOCATOR": "system"}, "/usr/lib/libjemalloc.so.2") is None
True
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

CHOICE = "AGENTRL_ALLOCATOR"  # "system": the C library's malloc; unset or "jemalloc": jemalloc if found
REEXEC_GUARD = "_AGENTRL_ALLOCATOR_SET"  # set in the restarted process: never restart twice
JEMALLOC_NAMES = ("libjemalloc.so.2", "libjemalloc.so")
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
                "/usr/local/lib", "/opt/homebrew/lib")


def find_jemalloc(dirs: tuple[str, ...] = LIBRARY_DIRS) -> str | None:
    """The path of an installed jemalloc shared library, or None."""
    for d in dirs:
        for name in JEMALLOC_NAMES:
            p = Path(d) / name
            if p.is_file():
                return str(p)
    return None


def reexec_plan(env: dict[str, str], jemalloc: str | None) -> dict[str, str] | None:
    """The environment to start ``agentrl train`` again with, or None to go on as is: not on
    Linux, no jemalloc, ``AGENTRL_ALLOCATOR=system``, already restarted, or already preloaded."""
    if not sys.platform.startswith("linux") or jemalloc is None or env.get(REEXEC_GUARD):
        return None
    if env.get(CHOICE, "jemalloc") == "system" or "jemalloc" in env.get("LD_PRELOAD", ""):
        return None
    preload = " ".join(p for p in (jemalloc, env.get("LD_PRELOAD", "")) if p)
    return {**env, "LD_PRELOAD": preload, REEXEC_GUARD: "1"}


def restart_with_jemalloc(argv: list[str]) -> None:
    """Replace this process by ``python -m agentrl argv`` under jemalloc, where
    :func:`reexec_plan` says to; return otherwise. Call it first, before any work: the
    process is replaced (same pid, so torchrun and job schedulers keep track of it)."""
    choice = os.environ.get(CHOICE, "jemalloc")
    if choice not in ("jemalloc", "system"):
        raise SystemExit(f"{CHOICE}={choice!r}: use 'jemalloc' (the default where it is installed) or 'system'")
    env = reexec_plan(dict(os.environ), find_jemalloc())
    if env is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "agentrl", *argv], env)


def current_allocator() -> str:
    """The allocator this process runs under, read from its mapped libraries."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "the C library's malloc"
    for name in ("jemalloc", "tcmalloc", "mimalloc"):
        if f"lib{name}" in maps:
            return name
    return "the C library's malloc" + ("" if os.environ.get(CHOICE) == "system" else
                                       " (jemalloc keeps the peak lower: apt install libjemalloc2)")
