"""The checker's verdict on every attempt of a batch (``score_all``), and what a checker that
raises becomes: an infrastructure failure of the attempt that names the task (docs/design.md,
"Failures")."""

from __future__ import annotations

import dataclasses

from agentrl.types import Failure, Task, Trajectory, Verdict


def score_all(env, tasks_by_id: dict[str, Task], trajs: list[Trajectory]) -> None:
    """Set each trajectory's ``verdict`` (reward and the checker's info) in place, once per attempt.

    An attempt split into several trajectories (an OpenAI-API agent that rewrote its history:
    same ``group_id`` and ``sample_index``) is scored on its last one, and every segment
    carries that verdict. A verdict set before scoring (an agent that failed: 0) stands. An
    attempt whose infrastructure failed (``failure``) is not scored. A checker that raises is
    an infrastructure failure of the attempt (source ``checker``; its message names the task
    and the attempt), not a reward and not a crash: the run retries and counts it."""
    last: dict[tuple[str, int], Trajectory] = {}
    for t in trajs:
        last[(t.group_id, t.sample_index)] = t
    for t in last.values():
        if t.verdict is None and t.failure is None:
            try:
                s = env.score(tasks_by_id[t.task_id], t.messages)
                t.verdict = Verdict(float(s.reward), dict(s.info))
            except Exception as e:
                t.failure = dataclasses.replace(Failure.of("checker", e), message=_checker_message(env, t, e)[:1000])
    for t in trajs:
        head = last[(t.group_id, t.sample_index)]
        v = head.verdict
        if v is not None and t.verdict is not v:  # the attempt's earlier segments get a copy
            t.verdict = Verdict(v.reward, dict(v.info))
        if head.failure is not None and t is not head:
            t.failure = head.failure


def _checker_message(env, traj: Trajectory, e: Exception) -> str:
    last = traj.messages[-1].content if traj.messages else ""
    return (f"{type(env).__name__}.score raised on task {traj.task_id!r} (attempt {traj.sample_index} of group "
            f"{traj.group_id!r}): {type(e).__name__}: {e}. If this is a bug of the checker, fix it: "
            f"score(task, messages) must return a Score for any transcript, e.g. reward 0 for a malformed or "
            f"missing answer; raise agentrl.InfraError only when a service it needs failed. The attempt's last "
            f"message began {str(last)[:120]!r}")
