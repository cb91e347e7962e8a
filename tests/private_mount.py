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
