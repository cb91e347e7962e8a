"""Worker threads for sync tools: reused when idle, never handed a second job while busy."""

from __future__ import annotations

import threading
import time

from agentrl.toolbox.threads import ToolThreads


def _run(pool: ToolThreads, fn) -> None:  # noqa: ANN001
    done = threading.Event()

    def job() -> None:
        fn()
        done.set()

    pool.submit(job)
    assert done.wait(5)


def test_sequential_jobs_reuse_one_thread() -> None:
    pool = ToolThreads()
    seen: list[int] = []
    for _ in range(5):
        _run(pool, lambda: seen.append(threading.get_ident()))
        deadline = time.monotonic() + 5
        while pool.idle == 0 and time.monotonic() < deadline:  # the worker is released after the job
            time.sleep(0.001)
    assert len(set(seen)) == 1 and pool.idle == 1


def test_a_hung_job_keeps_its_thread_and_the_next_job_runs_at_once() -> None:
    pool = ToolThreads()
    release, started = threading.Event(), threading.Event()
    hung: list[int] = []

    def hang() -> None:
        hung.append(threading.get_ident())
        started.set()
        release.wait(10)

    pool.submit(hang)
    assert started.wait(5)
    other: list[int] = []
    _run(pool, lambda: other.append(threading.get_ident()))  # does not wait for the hung job
    assert other[0] != hung[0]
    release.set()


def test_idle_workers_exit() -> None:
    pool = ToolThreads(idle_s=0.05)
    _run(pool, lambda: None)
    names_before = sum(t.name == "agentrl-tool" for t in threading.enumerate())
    deadline = time.monotonic() + 5
    while pool.idle and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.idle == 0
    time.sleep(0.05)
    assert sum(t.name == "agentrl-tool" for t in threading.enumerate()) < names_before
