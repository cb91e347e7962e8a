"""Which sandbox isolation levels the level-parametrized tests run at on this machine.

Every level this machine offers runs. A level it does not offer is still listed (and skips,
naming the fix) unless the reruns in a private mount namespace cover it: as root,
``test_isolation_fallbacks`` and ``test_forkserver_suite_without_bubblewrap`` rerun these
modules with bubblewrap hidden and the interpreter reachable, so the unshare and rlimits
levels run there (a root whose Python sits below an unreadable /root cannot run the rlimits
level directly). bubblewrap itself is never "covered": without it those tests skip, saying
how to install it.
"""

from __future__ import annotations

import dataclasses
import functools

import private_mount

from agentrl.tools.sandbox import SandboxConfig
from agentrl.tools.sandbox.isolation import LEVELS, Isolation


@functools.cache
def available(level: str) -> bool:
    try:
        Isolation.for_config(dataclasses.replace(SandboxConfig(), isolation=level))
    except RuntimeError:
        return False
    return True


def covered_by_reruns(level: str) -> bool:
    return level in ("unshare", "rlimits") and private_mount.available()


def level_params() -> list[str]:
    """The levels to parametrize over here."""
    return [lvl for lvl in LEVELS if available(lvl) or not covered_by_reruns(lvl)]
