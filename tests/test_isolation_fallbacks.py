"""The python tool's whole test module at the isolation levels a user without bubblewrap gets.

The module's observation and limit tests are parametrized over every level this machine
offers. Two situations hide levels from it: bubblewrap installed (the fallbacks still have
to work for users who lack it), and a root whose Python lives below an unreadable /root
(pyenv), where the sandbox uid cannot reach the interpreter at the rlimits level. This test
reruns the module in a private mount namespace with bubblewrap hidden and the interpreter
made reachable, so the unshare and rlimits levels are tested on this machine too.
"""

from __future__ import annotations

import re
from pathlib import Path

import private_mount
import pytest

TESTS = Path(__file__).resolve().parent


@pytest.mark.slow
def test_python_tool_suite_without_bubblewrap() -> None:
    if not private_mount.available():
        pytest.skip("needs root and mount namespaces (run as root to test every isolation level)")
    out = private_mount.rerun_pytest(str(TESTS / "test_python_tool.py"))
    summary = out.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, summary
    # Inside, only bubblewrap is missing: every skip names it, and the other levels ran.
    skips = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    assert skips and all("bwrap" in line for line in skips), "\n".join(skips)
    for level in ("unshare", "rlimits"):
        assert len(re.findall(rf"\[{level}\] PASSED", out)) >= 10, f"the {level} level did not run:\n{out[-3000:]}"
        assert not re.search(rf"\[{level}\] (SKIPPED|FAILED)", out), out[-3000:]
