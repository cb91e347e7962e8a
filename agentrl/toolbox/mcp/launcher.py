"""The launcher every stdio MCP server runs under: the server dies with the trainer.

``python -I launcher.py TRAINER_PID -- COMMAND ARGS...`` starts COMMAND as its child, in its
own process group (the client spawns the launcher as a session leader), with stdin, stdout
and stderr inherited, and then waits for whichever comes first:

- the server exits: the launcher exits with the server's status (a signal N as 128 + N), so
  the client sees the server's own death;
- the trainer (TRAINER_PID, its parent) dies, however it died, SIGKILL included: the
  launcher kills its whole process group (the server and anything it started) with SIGKILL.

The trainer is watched through a pidfd (``os.pidfd_open``, Linux 5.3+), which becomes readable
the moment the process is gone; elsewhere the launcher polls its parent pid every 0.2 s. Run it
as a file with ``-I``: it imports the standard library only, so it starts in ~20 ms under any
interpreter and never sees the trainer's or the server's site-packages.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys

POLL_S = 0.2  # the fallback's period when pidfds are not available


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # not Linux 5.3+, or the process is already gone
        return None


def _kill_group() -> None:
    os.killpg(0, signal.SIGKILL)  # the launcher is in the group too: nothing is left behind


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: launcher.py TRAINER_PID -- COMMAND [ARGS...]\n")
        return 2
    trainer, command = int(argv[0]), argv[2:]
    watch = _pidfd(trainer)
    if os.getppid() != trainer:  # the trainer died before the watch was set up
        return 1
    try:
        child = subprocess.Popen(command)  # inherits stdin/stdout/stderr and the process group
    except OSError as exc:
        sys.stderr.write(f"agentrl MCP launcher: cannot start {command[0]!r}: {exc}\n")
        return 127
    # The server's end, as a second pidfd, so one poll() waits for both without a timer.
    child_fd = _pidfd(child.pid)
    poller = select.poll()
    for fd in (watch, child_fd):
        if fd is not None:
            poller.register(fd, select.POLLIN)
    signal.signal(signal.SIGTERM, lambda *_: (_kill_group()))  # a stop of the launcher stops its server
    while True:
        ready = {fd for fd, _ in poller.poll(None if watch is not None and child_fd is not None else POLL_S * 1000)}
        if (watch is not None and watch in ready) or (watch is None and os.getppid() != trainer):
            _kill_group()
        code = child.poll()
        if code is not None:
            return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
