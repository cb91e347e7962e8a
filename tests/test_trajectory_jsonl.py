"""Rollout JSONL written by earlier versions still loads to the same values, into the typed
records (``verdict``, ``trained``, ``agent``); the on-disk keys stay flat and stable.

The lines are literal, as those versions wrote them (not produced by today's ``to_json``)."""

from __future__ import annotations

import json

from agentrl.inspect.summary import segment_note
from agentrl.types import AgentSegment, Message, Span, TrainerMarks, Trajectory, Verdict, read_jsonl

# An OpenAI-API agent's second segment, its agent timed out; written before the records were
# typed: flat reward/advantage/score/filtered/staleness/old_logprobs, agent facts under metadata.
FLAT_AGENT = (
    '{"token_ids": [1, 2, 3, 4], "prompt_len": 1, "loss_mask": [0, 1, 0, 1], "logprobs": [0.0, -0.5, 0.0, -0.25], '
    '"reward": 0.0, "advantage": -0.5, "group_id": "g", "sample_index": 1, "finish_reason": "stop", '
    '"policy_version": 2, "task_id": "t1", "family": "add", "turns": 2, "void_turns": 0, "score": {}, '
    '"filtered": true, "staleness": 1, "metadata": {"segment": 1, "segments": 2, "splits": 1, '
    '"agent_error": "timeout: the agent ran over 2 s", "step": 4}, "spans": [{"start": 0, "end": 1, "kind": "prompt"}, '
    '{"start": 1, "end": 2, "kind": "model"}, {"start": 2, "end": 3, "kind": "tool"}, {"start": 3, "end": 4, '
    '"kind": "model"}], "messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "5"}], '
    '"tool_calls": [], "old_logprobs": [0.0, -0.4, 0.0, -0.3]}'
)
# The built-in runner's attempt, scored and trained, same era (no agent facts).
FLAT_SCORED = (
    '{"token_ids": [1, 2], "prompt_len": 1, "loss_mask": [0, 1], "logprobs": [0.0, -0.5], "reward": 1.0, '
    '"advantage": 0.75, "group_id": "h", "sample_index": 0, "finish_reason": "stop", "policy_version": 0, '
    '"task_id": "t2", "family": "", "turns": 1, "void_turns": 0, "score": {"method": "exact"}, "filtered": false, '
    '"staleness": null, "metadata": {"step": 3}, "spans": [{"start": 0, "end": 1, "kind": "prompt"}, '
    '{"start": 1, "end": 2, "kind": "model"}], "messages": [{"role": "assistant", "content": "4"}], '
    '"tool_calls": [], "old_logprobs": [0.0, -0.45]}'
)
# An unscored line of the same era (an eval written before scoring, or a bare rollout).
FLAT_UNSCORED = (
    '{"token_ids": [1, 2], "prompt_len": 1, "loss_mask": [0, 1], "logprobs": [0.0, -0.5], "reward": null, '
    '"advantage": null, "group_id": "h", "sample_index": 0, "finish_reason": "stop", "policy_version": 0, '
    '"task_id": "t2", "family": "", "turns": 1, "void_turns": 0, "score": {}, "filtered": false, '
    '"staleness": null, "metadata": {"step": 3}, "spans": [{"start": 0, "end": 1, "kind": "prompt"}, '
    '{"start": 1, "end": 2, "kind": "model"}], "messages": [{"role": "assistant", "content": "4"}], '
    '"tool_calls": []}'
)
# Older still: the bookkeeping under metadata, next to the caller's own key.
OLDEST = (
    '{"token_ids": [1, 2], "prompt_len": 1, "loss_mask": [0, 1], "logprobs": [0.0, -0.5], "reward": 1.0, '
    '"advantage": 0.5, "group_id": "k", "sample_index": 3, "finish_reason": "length", "policy_version": 5, '
    '"metadata": {"task_id": "t7", "family": "mul", "turns": 3, "void_turns": 1, "score": {"method": "numeric"}, '
    '"filtered": true, "staleness": 2, "step": 4}, "spans": [{"start": 0, "end": 1, "kind": "prompt"}, '
    '{"start": 1, "end": 2, "kind": "model"}], "messages": [], "tool_calls": []}'
)
SPANS_2 = [Span(0, 1, "prompt"), Span(1, 2, "model")]


def test_flat_agent_line_loads_into_the_records():
    t = Trajectory.from_json(FLAT_AGENT)
    t.check()
    assert t == Trajectory(
        [1, 2, 3, 4], 1, [0, 1, 0, 1], [0.0, -0.5, 0.0, -0.25],
        [Span(0, 1, "prompt"), Span(1, 2, "model"), Span(2, 3, "tool"), Span(3, 4, "model")],
        [Message("user", "2+2?"), Message("assistant", "5")], group_id="g", sample_index=1, policy_version=2,
        task_id="t1", family="add", turns=2, verdict=Verdict(0.0, {}),
        trained=TrainerMarks(advantage=-0.5, filtered=True, staleness=1, old_logprobs=[0.0, -0.4, 0.0, -0.3]),
        agent=AgentSegment(index=1, segments=2, splits=1, error="timeout: the agent ran over 2 s"),
        metadata={"step": 4})
    assert (t.reward, t.advantage, t.old_logprobs) == (0.0, -0.5, [0.0, -0.4, 0.0, -0.3])
    assert segment_note(t) == "  · segment 2 of 2 (the agent rewrote its history)"


def test_lines_without_agent_facts_load_and_are_written_back_byte_for_byte():
    scored, unscored = Trajectory.from_json(FLAT_SCORED), Trajectory.from_json(FLAT_UNSCORED)
    assert scored.verdict == Verdict(1.0, {"method": "exact"}) and scored.agent is None
    assert scored.trained == TrainerMarks(advantage=0.75, old_logprobs=[0.0, -0.45])
    assert unscored.verdict is None and unscored.trained == TrainerMarks() and unscored.agent is None
    assert (unscored.reward, unscored.advantage, unscored.old_logprobs) == (None, None, None)
    assert scored.metadata == unscored.metadata == {"step": 3}
    assert (scored.to_json(), unscored.to_json()) == (FLAT_SCORED, FLAT_UNSCORED)  # the keys users' scripts read


def test_oldest_line_loads_its_bookkeeping_from_metadata():
    t = Trajectory.from_json(OLDEST)
    assert t == Trajectory([1, 2], 1, [0, 1], [0.0, -0.5], SPANS_2, [], group_id="k", sample_index=3,
                           finish_reason="length", policy_version=5, task_id="t7", family="mul", turns=3,
                           void_turns=1, verdict=Verdict(1.0, {"method": "numeric"}),
                           trained=TrainerMarks(advantage=0.5, filtered=True, staleness=2), metadata={"step": 4})


def test_every_shape_round_trips_and_agent_facts_leave_metadata(tmp_path):
    path = tmp_path / "step_000004.jsonl"
    path.write_text("\n".join([FLAT_AGENT, FLAT_SCORED, FLAT_UNSCORED, OLDEST]) + "\n")
    trajs = read_jsonl(str(path))
    assert trajs == [Trajectory.from_json(line) for line in (FLAT_AGENT, FLAT_SCORED, FLAT_UNSCORED, OLDEST)]
    for t in trajs:
        assert Trajectory.from_json(t.to_json()) == t
    new, old = json.loads(trajs[0].to_json()), json.loads(FLAT_AGENT)
    assert new["metadata"] == {"step": 4}
    assert new["agent"] == {"index": 1, "segments": 2, "splits": 1, "error": "timeout: the agent ran over 2 s"}
    for k in ("reward", "advantage", "score", "filtered", "staleness", "old_logprobs", "task_id", "turns"):
        assert new[k] == old[k], k
