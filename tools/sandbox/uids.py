"""Unprivileged user ids for sandboxes started by root, one per live sandbox.

A distinct uid per sandbox means the code cannot signal, trace or read the memory of the
parent or of another sandbox, RLIMIT_NPROC (counted per uid) bounds each sandbox alone, and
every process left behind can be found and killed by its uid. Leases are ``flock``-ed files,
so several trainer processes on one host never hand out the same uid; a crashed holder's
locks vanish with it, and whatever it left running under a uid is killed when another
process first leases that uid.

Example::

    from agentrl.tools.sandbox.uids import UidLeases
    leases = UidLeases(base=1_000_000, count=64)
    with leases.lease() as uid:
        assert 1_000_000 <= uid < 1_000_064
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import random
import stat
import tempfile
import threading
from typing import Iterator

from .process import kill_uid


class UidLeases:
    """Hands out uids in ``[base, base + count)`` exclusively across threads and processes."""

    def __init__(self, base: int, count: int, lock_dir: str | None = None) -> None:
        self.base = base
        self.count = count
        self.lock_dir = lock_dir or _default_lock_dir()
        self._held: set[int] = set()
        self._released: dict[int, None] = {}  # uids this process claimed and released, oldest first
        self._mutex = threading.Lock()

    def acquire(self, reuse: bool = False) -> tuple[int, int]:
        """Lease a uid; returns ``(uid, lock_fd)``. Release with :meth:`release`.

        ``reuse``: prefer a uid this process released before (already claimed, so no sweep of
        its processes is needed) — for callers that know a released uid has no process left
        (the fork server: a call's pid namespace is gone before it reports)."""
        start = random.randrange(self.count)
        with self._mutex:
            recent = list(self._released) if reuse else []
        for uid in itertools.chain(reversed(recent), (self.base + (start + i) % self.count for i in range(self.count))):
            with self._mutex:
                if uid in self._held:
                    continue
                self._held.add(uid)
            fd = os.open(os.path.join(self.lock_dir, f"{uid}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                with self._mutex:
                    self._held.discard(uid)
                continue
            self._claim(uid, fd)
            return uid, fd
        raise RuntimeError(
            f"all {self.count} sandbox uids from {self.base} are in use; raise SandboxConfig.uid_count "
            "or lower max_concurrency / the number of live stateful sessions"
        )

    def _claim(self, uid: int, fd: int) -> None:
        """Record this process as the uid's holder. A uid last held by another process (which
        may have crashed with sandboxes alive) is first cleared of every process it owns."""
        me = str(os.getpid()).encode()
        if os.pread(fd, 32, 0).strip() != me:
            kill_uid(uid)
            os.ftruncate(fd, 0)
            os.pwrite(fd, me, 0)

    def release(self, uid: int, fd: int) -> None:
        os.close(fd)  # closing drops the flock
        with self._mutex:
            self._held.discard(uid)
            self._released.pop(uid, None)
            self._released[uid] = None
            while len(self._released) > 64:
                del self._released[next(iter(self._released))]

    @contextlib.contextmanager
    def lease(self, reuse: bool = False) -> Iterator[int]:
        uid, fd = self.acquire(reuse)
        try:
            yield uid
        finally:
            self.release(uid, fd)


def _default_lock_dir() -> str:
    """A root-owned directory nobody else can write (refuses a planted one)."""
    path = os.path.join(tempfile.gettempdir(), f"agentrl-sandbox-uids-{os.geteuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise RuntimeError(f"{path} is not a private directory of this user; remove it and retry")
    return path
