"""The outcome of one sandboxed run and the text the model reads about it.

Example::

    from agentrl.tools.sandbox.result import ExecResult
    r = ExecResult(output="42\\n", exit_code=0, timed_out=False, output_limited=False, duration_s=0.02)
    assert r.observation() == "42\\n"
    r = ExecResult(output="", exit_code=None, timed_out=True, output_limited=False, duration_s=2.0, timeout_s=2.0)
    assert r.observation() == "[stopped: the code ran past the 2s time limit]"
"""

from __future__ import annotations

import signal
from dataclasses import dataclass


@dataclass
class ExecResult:
    """What happened. ``output`` is stdout and stderr interleaved, already capped (head + tail)."""

    output: str
    exit_code: int | None  # None when the run was stopped; negative: killed by that signal
    timed_out: bool
    output_limited: bool
    duration_s: float
    timeout_s: float = 0.0
    max_output_bytes: int = 0
    truncated: bool = False  # bytes were cut from the middle of the output
    restarted: bool = False  # stateful mode: an earlier interpreter (and its variables) is gone
    worker_exited: bool = False  # stateful mode: the code ended the interpreter
    server_lost: bool = False  # fresh mode: the fork server did not report how the call ended (its processes would not die)
    unstarted: bool = False  # the sandbox exited before it read the code: nothing of it ran (a failed launch, not the code)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.output_limited

    def observation(self) -> str:
        """Output plus one short note per abnormal ending, for the model to read."""
        notes = []
        if self.timed_out:
            notes.append(f"[stopped: the code ran past the {self.timeout_s:g}s time limit]")
        elif self.output_limited:
            notes.append(f"[stopped: the code printed more than {self.max_output_bytes} bytes]")
        elif self.server_lost:
            notes.append("[the sandbox could not confirm how the code ended (its processes would not stop); "
                         "it was restarted]")
        elif self.worker_exited:
            notes.append(f"[the interpreter exited (status {self.exit_code}); a new one starts on the next call]")
        elif self.exit_code is not None and self.exit_code < 0:
            notes.append(f"[the process was killed by signal {_signal_name(-self.exit_code)}]")
        elif self.exit_code not in (None, 0, 1):
            notes.append(f"[exit code {self.exit_code}]")
        if self.restarted:
            notes.append("[the interpreter was restarted: variables, imports and functions from earlier calls are gone]")
        text = self.output
        if notes:
            text = (text if not text or text.endswith("\n") else text + "\n") + "\n".join(notes)
        return text if text else "(no output)"


def exit_status(returncode: int | None, wrapped: bool) -> int | None:
    """The code's exit status; a launcher (bwrap, sh) reports death by signal N as 128 + N,
    turned here into Popen's convention, -N."""
    if returncode is not None and wrapped and 128 < returncode < 128 + 65:
        return -(returncode - 128)
    return returncode


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return str(num)
