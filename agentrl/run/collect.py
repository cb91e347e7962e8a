"""One step's data: the step's prompts (a seeded draw), the rollout, the checker's rewards,
DAPO's refill until the batch has enough groups with signal, and the metrics the step logs.

Pure functions of their arguments: the trainer passes its config, environment, task pool,
runner and rank, so the asynchronous producer's thread can run ``collect_step`` with its own
runner.
"""

from __future__ import annotations

import random

import numpy as np

from agentrl.algo.update import UpdateStats
from agentrl.rollout.agent_runner import AgentRunner, agent_failures, failed_step_streak
from agentrl.rollout.compaction import compaction_metrics
from agentrl.run.config import Config
from agentrl.run.retry import RetryPolicy, infra_metrics, rollout_scored
from agentrl.scale import distributed as dist
from agentrl.run.rank_merge import StepShard
from agentrl.types import Task, Trajectory

RANK_SEED_STRIDE = 1_000_003  # rank r samples with seed + r * stride: ranks draw independent attempts


def draw_tasks(pool: list[Task], seed: int, step: int, n: int, draw: int = 0) -> list[Task]:
    """The ``n`` prompts of ``step`` (refill round ``draw``): the same on every rank and rerun.

    >>> from agentrl.types import Task
    >>> pool = [Task(id=str(i), prompt=str(i), answer=str(i)) for i in range(10)]
    >>> [t.id for t in draw_tasks(pool, 0, 1, 3)] == [t.id for t in draw_tasks(pool, 0, 1, 3)]
    True
    """
    rng = random.Random(seed * 1_000_003 + step * 9_973 + draw * 101)
    if n <= len(pool):
        return rng.sample(pool, n)
    return [rng.choice(pool) for _ in range(n)]


def draw_seed(cfg: Config, step: int, draw: int, rank: int = 0) -> int:
    """The rollout seed of ``step``'s draw ``draw`` on ``rank`` (its attempt-turn seeds follow:
    ``agentrl.engines.base.attempt_seed``)."""
    return cfg.seed * 7 + step * 131 + draw + RANK_SEED_STRIDE * rank


def signal_groups(trajs: list[Trajectory]) -> int:
    """Groups whose attempts do not all have the same reward (the ones GRPO learns from),
    among the attempts that ran (infrastructure failures have no reward) in groups of 2 or more."""
    by: dict[str, dict[int, float | None]] = {}
    for t in trajs:
        if t.failure is None:
            by.setdefault(t.group_id, {})[t.sample_index] = t.reward
    return sum(len(v) > 1 and len(set(v.values())) > 1 for v in by.values())


def intact_groups(trajs: list[Trajectory]) -> int:
    """Groups with at least 2 attempts that ran (the others are dropped: docs/design.md, "Failures")."""
    ran: dict[str, set[int]] = {}
    for t in trajs:
        if t.failure is None:
            ran.setdefault(t.group_id, set()).add(t.sample_index)
    return sum(len(v) >= 2 for v in ran.values())


def collect_step(cfg: Config, env, pool: list[Task], tasks_by_id: dict[str, Task], runner, step: int,
                 rank: int = 0, world: int = 1) -> tuple[list[Trajectory], dict[str, float]]:
    """Roll out, score and (DAPO dynamic sampling) refill until the batch has signal.

    Every rank draws the same global prompt list and rolls out its own slice of whole groups
    (``shard_whole_groups``); the refill decision counts signal groups of all ranks.
    """
    G = cfg.algo.num_samples
    trajs: list[Trajectory] = []
    t_roll = t_tools = 0.0
    draws = 0
    policy = RetryPolicy(cfg.rollout.infra_retries, cfg.rollout.infra_backoff_s)
    while True:
        tasks = dist.shard_whole_groups(draw_tasks(pool, cfg.seed, step, cfg.train.prompts_per_step, draws),
                                        rank, world)
        batch = rollout_scored(runner, env, tasks_by_id, tasks, G, env.system_prompt,
                               seed=draw_seed(cfg, step, draws, rank),
                               group_prefix=f"s{step}d{draws}/", policy=policy)
        t_roll += batch.stats.total_s
        t_tools += batch.stats.tools_s
        trajs.extend(batch.trajectories)
        draws += 1
        if not cfg.algo.refill_batch or draws > cfg.algo.max_refills or (G < 2 and not cfg.algo.drop_zero_variance):
            break
        # DAPO: enough groups with signal; without drop_zero_variance, enough groups that ran
        # (groups dropped for infrastructure failures are refilled)
        have = signal_groups(trajs) if cfg.algo.drop_zero_variance else intact_groups(trajs)
        if dist.sum_floats([have])[0] >= cfg.train.prompts_per_step:
            break
    if isinstance(runner, AgentRunner):
        watch_agent_failures(cfg, runner, trajs, step, rank)
    return trajs, {"time/rollout": t_roll, "time/tools": t_tools, "batch/draws": float(draws)}


def watch_agent_failures(cfg: Config, runner: AgentRunner, trajs: list[Trajectory], step: int, rank: int = 0) -> None:
    """An OpenAI-API agent's failures, step by step: the first error of a step that had any is
    printed (rank 0), and ``agent.max_failed_steps`` consecutive steps in which every attempt's
    agent failed (on every rank together) stop the run with their errors (``AgentStopError``)."""
    failed, attempts, errors = agent_failures(trajs)
    failed_all, attempts_all = (int(x) for x in dist.sum_floats([failed, attempts]))
    if rank == 0 and failed:
        from tqdm import tqdm

        tqdm.write(f"step {step}: {failed_all} of {attempts_all} agent attempts failed "
                   f"(agent/errors {failed_all / max(1, attempts_all):.2f}); "
                   f"first: {errors[0][:500]}")
    runner.failed_steps = failed_step_streak(runner.failed_steps, failed_all, attempts_all,
                                             cfg.agent.max_failed_steps, step, errors)


def step_metrics(shard: StepShard, st: UpdateStats, lr: float, version: int) -> dict[str, float]:
    """The logged metrics of a step, from the merged shards of every rank and the update."""
    trajs, zero_var, n_groups = shard.trajectories, shard.zero_variance_groups, shard.groups
    n = max(1, len(trajs))
    # infrastructure failures have no reward: the mean is over the attempts that ran
    rewards = np.array([t.reward or 0.0 for t in trajs if t.failure is None] or [0.0])
    calls = sum(len(t.tool_calls) for t in trajs)
    errors = sum(1 for t in trajs for c in t.tool_calls if c.error)
    return {
        "reward/mean": float(rewards.mean()), "reward/std": float(rewards.std()),
        "groups/zero_variance_frac": zero_var / max(1, n_groups),
        "groups/with_signal": float(n_groups - zero_var),
        "tools/calls_per_traj": calls / n, "tools/error_rate": errors / max(1, calls),
        "turns/mean": sum(t.turns for t in trajs) / n,
        "finish/length_frac": sum(t.finish_reason == "length" for t in trajs) / n,
        "finish/max_turns_frac": sum(t.finish_reason == "max_turns" for t in trajs) / n,
        "response/len_mean": sum(t.num_model_tokens for t in trajs) / n,
        "void_turns/frac": sum(t.void_turns > 0 for t in trajs) / n,
        "filter/dropped_zero_variance": float(shard.dropped_zero_variance),
        "filter/masked_truncated": float(shard.masked_truncated),
        "filter/dropped_void": float(shard.dropped_void),
        **st.metrics(),
        **infra_metrics(trajs, shard.excluded_infra, shard.dropped_infra_groups),
        **compaction_metrics(trajs),  # only when the rollout compacts (rollout.compaction)
        "lr": lr, "policy_version": float(version),
    }
