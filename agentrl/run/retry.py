"""Infrastructure failures are retried, then left out (docs/design.md, "Failures").

An attempt whose infrastructure failed (``Trajectory.failure``: a tool raised
``agentrl.InfraError``, an OpenAI-API agent lost its endpoint, the checker raised) is not the
model's doing, so it must not become a reward 0 in its group's mean and std. After the batch
ran and was scored, :func:`rollout_scored` re-runs every failed attempt with a new seed stream,
up to ``rollout.infra_retries`` rounds with exponential backoff (``rollout.infra_backoff_s``,
doubled each round); an attempt whose checker raised is scored again instead (its rollout was
fine). The retried attempt takes the failed one's place (same group, same sample index) and
lists the failures before it in ``retried``. An attempt still failing after the last round
keeps its ``failure``: ``compute_advantages`` then gives it no advantage and keeps it out of
its group's statistics and the loss; a group left with fewer than two attempts that ran is
dropped whole.

:func:`infra_metrics` counts what happened per step; :func:`check_failure_rate` stops a run
whose failures stood for more than ``train.max_infra_fail_frac`` of a step's attempts.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from agentrl.rollout.base import Runner, RolloutBatch, RolloutStats
from agentrl.scale import distributed as dist
from agentrl.run.scoring import score_all
from agentrl.types import Failure, Task, Trajectory

RETRY_SEED_STRIDE = 104_729  # retry round k samples with seed + k * stride (+ 7 per call of the round)

Attempt = tuple[str, int]  # (group_id, sample_index)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently failed attempts are retried."""

    retries: int = 2  # rounds of retries after the first try (0: no retry)
    backoff_s: float = 1.0  # wait before the first retry round; doubled each round


class InfraStopError(RuntimeError):
    """A step whose infrastructure failures stood for too many attempts: the run stops here.
    ``failures``: the failures that stood, in batch order."""

    def __init__(self, message: str, failures: list[Failure]) -> None:
        super().__init__(message)
        self.failures = failures


def rollout_scored(runner: Runner, env, tasks_by_id: dict[str, Task], tasks: list[Task], num_samples: int,
                   system_prompt: str | None, *, seed: int | None, group_prefix: str,
                   policy: RetryPolicy, sleep=time.sleep) -> RolloutBatch:
    """``runner.run`` then ``score_all``, with the failed attempts retried (module docstring).
    Trajectories stay task-major, each retried attempt in its place."""
    batch = runner.run(tasks, num_samples, system_prompt, seed=seed, group_prefix=group_prefix)
    score_all(env, tasks_by_id, batch.trajectories)
    trajs, stats = batch.trajectories, batch.stats
    for round_ in range(1, policy.retries + 1):
        failed = _failed_attempts(trajs)
        if not failed:
            break
        if policy.backoff_s > 0:
            sleep(policy.backoff_s * 2 ** (round_ - 1))
        rescore = {k: f for k, f in failed.items() if f.source == "checker"}
        rerun = {k: f for k, f in failed.items() if f.source != "checker"}
        for t in trajs:
            if (t.group_id, t.sample_index) in rescore:
                t.retried, t.failure = [*t.retried, t.failure], None
        new = _rerun(runner, tasks_by_id, rerun, trajs, system_prompt, group_prefix,
                     None if seed is None else seed + RETRY_SEED_STRIDE * round_, stats)
        trajs = _replace(trajs, new)
        score_all(env, tasks_by_id, trajs)
    stats.sampled_tokens = sum(t.num_model_tokens for t in trajs)
    return RolloutBatch(trajs, stats)


def _failed_attempts(trajs: list[Trajectory]) -> dict[Attempt, Failure]:
    out: dict[Attempt, Failure] = {}
    for t in trajs:
        if t.failure is not None:
            out.setdefault((t.group_id, t.sample_index), t.failure)
    return out


def _replace(trajs: list[Trajectory], new: dict[Attempt, list[Trajectory]]) -> list[Trajectory]:
    """``trajs`` with each rerun attempt's segments in place of its old ones."""
    out: list[Trajectory] = []
    for t in trajs:
        key = (t.group_id, t.sample_index)
        if key not in new:
            out.append(t)
        elif new[key] is not None:
            out.extend(new[key])
            new[key] = None  # its later old segments are dropped
    return out


def _rerun(runner: Runner, tasks_by_id: dict[str, Task], failed: dict[Attempt, Failure], trajs: list[Trajectory],
           system_prompt: str | None, group_prefix: str, seed: int | None,
           stats: RolloutStats) -> dict[Attempt, list[Trajectory]]:
    """Run each failed attempt again: {attempt: its new segments}, numbered as the old one."""
    if not failed:
        return {}
    task_of: dict[Attempt, str] = {}
    first: dict[Attempt, Trajectory] = {}
    for t in trajs:
        key = (t.group_id, t.sample_index)
        if key in failed and key not in first:
            first[key], task_of[key] = t, t.task_id
    by_task: dict[tuple[str, str], list[Attempt]] = defaultdict(list)
    for key in failed:
        by_task[(key[0], task_of[key])].append(key)
    # one run per number of failed attempts a task has: runner.run samples the same G for every task
    by_count: dict[int, list[tuple[str, str]]] = defaultdict(list)
    for gt, keys in by_task.items():
        by_count[len(keys)].append(gt)
    out: dict[Attempt, list[Trajectory]] = {}
    for call, (count, groups) in enumerate(sorted(by_count.items())):
        tasks = [tasks_by_id[task_id] for _, task_id in groups]
        batch = runner.run(tasks, count, system_prompt, seed=None if seed is None else seed + 7 * call,
                           group_prefix=group_prefix)
        _add_stats(stats, batch.stats)
        new: dict[Attempt, list[Trajectory]] = defaultdict(list)
        for t in batch.trajectories:
            new[(t.group_id, t.sample_index)].append(t)
        for (group, _), keys in zip(groups, (by_task[g] for g in groups)):
            for i, key in enumerate(keys):
                old = first[key]
                segs = new[(group, i)]
                for t in segs:
                    t.sample_index = key[1]
                    t.retried = [*old.retried, failed[key]]
                out[key] = segs
    return out


def _add_stats(into: RolloutStats, more: RolloutStats) -> None:
    into.generate_s += more.generate_s
    into.tools_s += more.tools_s
    into.total_s += more.total_s
    into.turns += more.turns


def infra_metrics(trajs: list[Trajectory], excluded: int, groups_dropped: int) -> dict[str, float]:
    """``infra/*`` of a step: ``failed`` (tries that failed, retried or not: tool calls retried
    in place, attempts rerun, failures that stood), ``retried`` (calls and attempts run again), ``excluded`` (attempts left out: their failure stood, or their group
    was dropped), ``groups_dropped``, and the failed tries by ``source/<where>`` and
    ``cause/<slug>``. Counted once per attempt, however many segments it has."""
    tries: list[Failure] = []
    retried = 0
    for t in _attempt_heads(trajs):
        in_place = [f for c in t.tool_calls for f in c.retried]
        tries += [*t.retried, *in_place, *([t.failure] if t.failure is not None else [])]
        retried += len(t.retried) + len(in_place)
    out = {"infra/failed": float(len(tries)), "infra/retried": float(retried),
           "infra/excluded": float(excluded), "infra/groups_dropped": float(groups_dropped)}
    for name, n in Counter(f.source for f in tries).items():
        out[f"infra/source/{_metric_name(name)}"] = float(n)
    for name, n in Counter(f.cause for f in tries).items():
        out[f"infra/cause/{_metric_name(name)}"] = float(n)
    return out


def check_failure_rate(trajs: list[Trajectory], max_frac: float, step: int) -> None:
    """Raise :class:`InfraStopError` when more than ``max_frac`` of the step's attempts ended
    with an infrastructure failure that stood after the retries; the message gives the counts
    by source and cause and the first failure's text."""
    heads = _attempt_heads(trajs)
    stood = [t.failure for t in heads if t.failure is not None]
    if not heads or len(stood) / len(heads) <= max_frac:
        return
    by = Counter(f"{f.source} ({f.cause})" for f in stood)
    causes = ", ".join(f"{k}: {n}" for k, n in by.most_common())
    raise InfraStopError(
        f"step {step}: {len(stood)} of {len(heads)} attempts failed for reasons outside the model after the "
        f"retries (over train.max_infra_fail_frac={max_frac:g}); by source and cause: {causes}. First: "
        f"{stood[0].message} — fix the failing service, or raise train.max_infra_fail_frac / "
        f"rollout.infra_retries. The step's rollouts (with each failure) are in the run's rollouts folder.",
        stood)


def stop_on_infra_failures(trajs: list[Trajectory], max_frac: float, step: int,
                           write: Callable[[list[Trajectory]], None]) -> None:
    """:func:`check_failure_rate` on the step's attempts of every rank (they decide together);
    on a stop, rank 0 first ``write``s every rank's trajectories, each with its failure."""
    failed = {(t.group_id, t.sample_index) for t in trajs if t.failure is not None}
    bad, total = dist.sum_floats([len(failed), len({(t.group_id, t.sample_index) for t in trajs})])
    if total == 0 or bad / total <= max_frac:
        return
    parts = dist.gather_to_main(trajs)
    if parts is None:
        raise InfraStopError(f"step {step}: the run stopped on infrastructure failures (rank 0 says why)", [])
    everything = [t for p in parts for t in p]
    write(everything)
    check_failure_rate(everything, max_frac, step)


def _attempt_heads(trajs: list[Trajectory]) -> list[Trajectory]:
    seen: dict[Attempt, Trajectory] = {}
    for t in trajs:
        seen.setdefault((t.group_id, t.sample_index), t)
    return list(seen.values())


def _metric_name(text: str) -> str:
    return text.replace(":", "_").replace("/", "_")
