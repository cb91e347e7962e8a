"""Held-out evaluation: greedy accuracy per task family, and optional pass@k.

Attempts whose infrastructure failed are retried as in training (``agentrl.run.retry``); those
whose failure stood are left out of the accuracy and counted (``eval/infra_excluded``)."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass, field

from agentrl.rollout.base import Runner
from agentrl.run.retry import RetryPolicy, rollout_scored
from agentrl.types import EVAL_GROUP_PREFIX, Task, Trajectory


@dataclass
class EvalResult:
    accuracy: float  # greedy (or temperature when greedy is off) mean reward
    by_family: dict[str, float]
    pass_k: float | None = None
    k: int = 0
    trajectories: list[Trajectory] = field(default_factory=list)
    infra_excluded: int = 0  # attempts left out: their infrastructure failure stood after the retries

    def metrics(self) -> dict[str, float]:
        out = {"eval/accuracy": self.accuracy}
        if self.infra_excluded:
            out["eval/infra_excluded"] = float(self.infra_excluded)
        out.update({f"eval/accuracy/{f}": v for f, v in sorted(self.by_family.items())})
        if self.pass_k is not None:
            out[f"eval/pass@{self.k}"] = self.pass_k
        return out


def accuracy_of(trajs: list[Trajectory], tasks_by_id: dict[str, Task]) -> EvalResult:
    """Mean reward of scored trajectories, overall and per task family (infrastructure
    failures left out and counted). An attempt of several segments (compacted, or an agent's
    split history) counts once: its segments share one verdict."""
    fam: dict[str, list[float]] = defaultdict(list)
    last = {(t.group_id, t.sample_index, t.task_id): t for t in trajs}
    attempts = list(last.values()) if len(last) < len(trajs) else trajs
    ran = [t for t in attempts if t.failure is None]
    for t in ran:
        fam[tasks_by_id[t.task_id].family].append(t.reward or 0.0)
    acc = sum(t.reward or 0.0 for t in ran) / max(1, len(ran))
    return EvalResult(acc, {f: sum(v) / len(v) for f, v in fam.items()}, trajectories=trajs,
                      infra_excluded=len(attempts) - len(ran))


def evaluate(runner: Runner, env, tasks: list[Task], *, greedy: bool = True, pass_k: int = 0,
             seed: int = 0, retry: RetryPolicy | None = None) -> EvalResult:
    """Run every task once (greedy by default) and, if ``pass_k``, k samples each.
    ``retry``: how infrastructure failures are retried (default: ``RetryPolicy()``)."""
    by_id = {t.id: t for t in tasks}
    base_cfg = runner.config
    retry = retry or RetryPolicy()
    try:
        if greedy:
            runner.config = dataclasses.replace(base_cfg, temperature=0.0)
        batch = rollout_scored(runner, env, by_id, tasks, 1, env.system_prompt, seed=seed,
                               group_prefix=EVAL_GROUP_PREFIX, policy=retry)
        result = accuracy_of(batch.trajectories, by_id)
        if pass_k > 0:
            runner.config = base_cfg
            kb = rollout_scored(runner, env, by_id, tasks, pass_k, env.system_prompt, seed=seed + 1,
                                group_prefix=EVAL_GROUP_PREFIX, policy=retry)
            solved = defaultdict(bool)
            for t in kb.trajectories:
                solved[t.group_id] |= (t.reward or 0.0) >= 1.0
            result.pass_k, result.k = sum(solved.values()) / max(1, len(solved)), pass_k
        return result
    finally:
        runner.config = base_cfg
