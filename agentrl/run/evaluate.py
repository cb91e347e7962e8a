"""Held-out evaluation: greedy accuracy per task family, and optional pass@k."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass, field

from agentrl.rollout.base import Runner
from agentrl.types import EVAL_GROUP_PREFIX, Task, Trajectory, Verdict


@dataclass
class EvalResult:
    accuracy: float  # greedy (or temperature when greedy is off) mean reward
    by_family: dict[str, float]
    pass_k: float | None = None
    k: int = 0
    trajectories: list[Trajectory] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        out = {"eval/accuracy": self.accuracy}
        out.update({f"eval/accuracy/{f}": v for f, v in sorted(self.by_family.items())})
        if self.pass_k is not None:
            out[f"eval/pass@{self.k}"] = self.pass_k
        return out


def score_all(env, tasks_by_id: dict[str, Task], trajs: list[Trajectory]) -> None:
    """Set each trajectory's ``verdict`` (reward and the checker's info) in place, once per attempt.

    An attempt split into several trajectories (an OpenAI-API agent that rewrote its history:
    same ``group_id`` and ``sample_index``) is scored on its last one, and every segment
    carries that verdict. A verdict set before scoring (an agent that failed: 0) stands."""
    last: dict[tuple[str, int], Trajectory] = {}
    for t in trajs:
        last[(t.group_id, t.sample_index)] = t
    for t in last.values():
        if t.verdict is None:
            s = _score(env, tasks_by_id[t.task_id], t)
            t.verdict = Verdict(float(s.reward), dict(s.info))
    for t in trajs:
        v = last[(t.group_id, t.sample_index)].verdict
        if v is not None and t.verdict is not v:  # the attempt's earlier segments get a copy
            t.verdict = Verdict(v.reward, dict(v.info))


class CheckerError(RuntimeError):
    """An environment's ``score(task, messages)`` raised; names the environment and the task."""


def _score(env, task: Task, traj: Trajectory):
    try:
        return env.score(task, traj.messages)
    except Exception as e:
        last = traj.messages[-1].content if traj.messages else ""
        raise CheckerError(
            f"{type(env).__name__}.score raised on task {task.id!r} (attempt {traj.sample_index} of group "
            f"{traj.group_id!r}): {type(e).__name__}: {e}. Fix the checker: score(task, messages) must return a "
            f"Score for any transcript, e.g. reward 0 for a malformed or missing answer, never raise. The "
            f"attempt's last message began {str(last)[:120]!r}") from e


def accuracy_of(trajs: list[Trajectory], tasks_by_id: dict[str, Task]) -> EvalResult:
    """Mean reward of scored trajectories, overall and per task family."""
    fam: dict[str, list[float]] = defaultdict(list)
    for t in trajs:
        fam[tasks_by_id[t.task_id].family].append(t.reward or 0.0)
    acc = sum(t.reward or 0.0 for t in trajs) / max(1, len(trajs))
    return EvalResult(acc, {f: sum(v) / len(v) for f, v in fam.items()}, trajectories=trajs)


def evaluate(runner: Runner, env, tasks: list[Task], *, greedy: bool = True, pass_k: int = 0,
             seed: int = 0) -> EvalResult:
    """Run every task once (greedy by default) and, if ``pass_k``, k samples each."""
    by_id = {t.id: t for t in tasks}
    base_cfg = runner.config
    try:
        if greedy:
            runner.config = dataclasses.replace(base_cfg, temperature=0.0)
        batch = runner.run(tasks, 1, env.system_prompt, seed=seed, group_prefix=EVAL_GROUP_PREFIX)
        score_all(env, by_id, batch.trajectories)
        result = accuracy_of(batch.trajectories, by_id)
        if pass_k > 0:
            runner.config = base_cfg
            kb = runner.run(tasks, pass_k, env.system_prompt, seed=seed + 1, group_prefix=EVAL_GROUP_PREFIX)
            score_all(env, by_id, kb.trajectories)
            solved = defaultdict(bool)
            for t in kb.trajectories:
                solved[t.group_id] |= (t.reward or 0.0) >= 1.0
            result.pass_k, result.k = sum(solved.values()) / max(1, len(solved)), pass_k
        return result
    finally:
        runner.config = base_cfg
