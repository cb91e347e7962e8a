"""Run a command in a private mount namespace that changes what this host offers the sandbox,
leaving the host itself unchanged.

Two changes, each optional:

- ``expose_python``: /root is replaced by an empty world-searchable tmpfs and this host's Python
  installation bound back, so the sandbox's unprivileged uid can reach an interpreter that
  lives below an unreadable /root (pyenv as root) — the rlimits level then works as root;
- ``hide_bwrap``: bubblewrap's binary is covered by /dev/null (not executable), so the sandbox
  falls back to the levels a user without bubblewrap gets.

Needs root and ``unshare --mount``; callers skip otherwise.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys


def available() -> bool:
    """Root with mount namespaces."""
    return os.geteuid() == 0 and subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode == 0


def shell_command(inner: str, stage: str, *, expose_python: bool = True, hide_bwrap: bool = False) -> list[str]:
    """argv running the shell line ``inner`` in the changed namespace. ``stage`` is an empty
    directory outside /root used while /root is replaced."""
    steps = ["mount --make-rprivate /"]
    if expose_python:
        prefix = shlex.quote(os.path.realpath(sys.base_prefix))
        steps += [f"mount --bind {prefix} {shlex.quote(stage)}", "mount -t tmpfs -o mode=0755 tmpfs /root",
                  f"mkdir -p {prefix}", f"mount --move {shlex.quote(stage)} {prefix}"]
    bwrap = shutil.which("bwrap")
    if hide_bwrap and bwrap:
        steps.append(f"mount --bind /dev/null {shlex.quote(os.path.realpath(bwrap))}")
    return ["unshare", "--mount", "sh", "-c", " && ".join([*steps, inner])]


def rerun_pytest(args: str, *, env: str = "", timeout: float = 600) -> str:
    """Run ``pytest -v -rs args`` (test paths and options, shell words) from the repository root
    in the changed namespace (interpreter reachable, bubblewrap hidden); ``env`` is prefixed as
    ``NAME=value`` words. Returns the output; raises AssertionError (with its tail) on failure."""
    import tempfile
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    stage = tempfile.mkdtemp(prefix="agentrl-stage-")
    try:
        os.chmod(stage, 0o755)
        inner = f"cd {shlex.quote(str(repo))} && {env} exec {sys.executable} -m pytest -v -rs -p no:cacheprovider {args}"
        done = subprocess.run(shell_command(inner, stage, expose_python=True, hide_bwrap=True),
                              capture_output=True, text=True, timeout=timeout)
    finally:
        os.rmdir(stage)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    return out
