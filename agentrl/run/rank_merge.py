"""One step's (or one evaluation's) results from every rank, merged on rank 0 before logging.

Each rank rolls out, scores and filters its own whole groups; rank 0 gathers a ``StepShard``
per rank (``agentrl.scale.distributed.gather_to_main``) and merges them, so the metrics and the
rollouts file describe the global batch whatever the number of ranks.

    >>> kw = dict(trajectories=[], groups=2, dropped_zero_variance=0, dropped_void=0, draws=1)
    >>> a = StepShard(**kw, zero_variance_groups=1, masked_truncated=0, time_rollout=1.0, time_tools=0.5)
    >>> b = StepShard(**kw, zero_variance_groups=0, masked_truncated=1, time_rollout=2.0, time_tools=0.1)
    >>> m = merge_step_shards([a, b])
    >>> m.zero_variance_groups, m.groups, m.masked_truncated, m.time_rollout
    (1, 4, 1, 2.0)
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrl.run.evaluate import EvalResult, accuracy_of
from agentrl.types import Task, Trajectory


@dataclass(kw_only=True)
class StepShard:
    """What one rank contributes to a step's metrics and rollouts file."""

    trajectories: list[Trajectory]
    zero_variance_groups: int
    groups: int
    dropped_zero_variance: int
    masked_truncated: int
    dropped_void: int
    time_rollout: float  # seconds; the step waits for the slowest rank, so ranks merge by max
    time_tools: float
    draws: int
    excluded_infra: int = 0  # attempts left out for infrastructure failures (theirs or their group's)
    dropped_infra_groups: int = 0


def merge_step_shards(shards: list[StepShard]) -> StepShard:
    """Concatenate trajectories in rank order (the global prompt order), sum counts, max times."""
    if not shards:
        raise ValueError("no shards to merge")
    return StepShard(
        trajectories=[t for s in shards for t in s.trajectories],
        zero_variance_groups=sum(s.zero_variance_groups for s in shards),
        groups=sum(s.groups for s in shards),
        dropped_zero_variance=sum(s.dropped_zero_variance for s in shards),
        masked_truncated=sum(s.masked_truncated for s in shards),
        dropped_void=sum(s.dropped_void for s in shards),
        time_rollout=max(s.time_rollout for s in shards),
        time_tools=max(s.time_tools for s in shards),
        draws=max(s.draws for s in shards),
        excluded_infra=sum(s.excluded_infra for s in shards),
        dropped_infra_groups=sum(s.dropped_infra_groups for s in shards),
    )


def merge_eval_results(results: list[EvalResult], tasks_by_id: dict[str, Task]) -> EvalResult:
    """Greedy accuracy over every rank's trajectories; pass@k weighted by each rank's tasks."""
    if len(results) == 1:
        return results[0]
    out = accuracy_of([t for r in results for t in r.trajectories], tasks_by_id)
    weighted = [(r.pass_k, len(r.trajectories)) for r in results if r.pass_k is not None]
    if weighted:
        out.pass_k = sum(p * n for p, n in weighted) / max(1, sum(n for _, n in weighted))
        out.k = max(r.k for r in results)
    return out
