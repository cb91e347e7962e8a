"""The step's prompt draw and the signal-group count (agentrl.run.collect), on hand-made cases."""

from __future__ import annotations

from types import SimpleNamespace

from agentrl.run.collect import draw_tasks, signal_groups
from agentrl.types import Task

POOL = [Task(id=str(i), prompt=f"q{i}", answer=str(i)) for i in range(10)]


def ids(tasks: list[Task]) -> list[str]:
    return [t.id for t in tasks]


def test_the_draw_is_a_function_of_seed_step_and_refill_round():
    first = ids(draw_tasks(POOL, 0, 1, 4))
    assert first == ids(draw_tasks(POOL, 0, 1, 4))  # every rank, every rerun
    assert len(set(first)) == 4  # without replacement while the pool is large enough
    others = {tuple(ids(draw_tasks(POOL, 0, 2, 4))), tuple(ids(draw_tasks(POOL, 1, 1, 4))),
              tuple(ids(draw_tasks(POOL, 0, 1, 4, draw=1)))}
    assert tuple(first) not in others


def test_more_prompts_than_the_pool_draws_with_replacement():
    drawn = ids(draw_tasks(POOL[:3], 0, 1, 7))
    assert len(drawn) == 7 and set(drawn) <= {"0", "1", "2"}


def test_signal_groups_count_groups_whose_rewards_differ():
    t = [SimpleNamespace(group_id=g, reward=r, sample_index=i, failure=None) for i, (g, r) in
         enumerate([("a", 1.0), ("a", 0.0), ("b", 1.0), ("b", 1.0), ("c", 0.0), ("c", 0.25), ("d", 0.5)])]
    assert signal_groups(t) == 2  # a and c; b all equal; d alone
