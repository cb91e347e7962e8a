"""OpenAI-API agents: what is the infrastructure's fault (the endpoint lost under the agent,
an agent raising InfraError, injected faults) is retried and never scored; what is the
agent's own (an ordinary exception) stays reward 0. Real endpoint, real openai SDK."""

from __future__ import annotations

import pytest

pytest.importorskip("openai")

from agentrl import InfraError  # noqa: E402
from agentrl.chat import ChatTemplate  # noqa: E402
from agentrl.engines.scripted import PerRequestScriptedEngine  # noqa: E402
from agentrl.env import Score  # noqa: E402
from agentrl.models.tiny import ensure_tiny_model  # noqa: E402
from agentrl.rollout import RolloutConfig  # noqa: E402
from agentrl.rollout.agent_runner import AgentRunner, AgentSettings  # noqa: E402
from agentrl.run.retry import RetryPolicy, rollout_scored  # noqa: E402
from agentrl.toolbox.faults import FaultPlan  # noqa: E402
from agentrl.types import Task  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ensure_tiny_model())


def answer_engine(tok) -> PerRequestScriptedEngine:
    end = tok.convert_tokens_to_ids("<|im_end|>")
    return PerRequestScriptedEngine(lambda _p, _k: tok.encode("<answer>42</answer>", add_special_tokens=False) + [end])


class Env:
    system_prompt = None

    def score(self, task, messages):
        return Score(1.0 if messages and "<answer>42</answer>" in messages[-1].content else 0.0)


async def ask(client, task):
    r = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": task.prompt}])
    return r.choices[0].message.content


def test_the_endpoint_lost_under_the_agent_is_retried_not_scored(tok):
    state = {"cut": True}
    runner: AgentRunner

    async def agent(client, task):
        first = await ask(client, task)
        if task.id == "cut" and state.pop("cut", False):
            runner._server.stop()  # the endpoint goes away between two requests of the attempt
            return await ask(client, task)
        return first

    runner = AgentRunner(answer_engine(tok), ChatTemplate(tok), agent, RolloutConfig(max_new_tokens=16),
                         AgentSettings(timeout_s=20))
    tasks = [Task("cut", "What is 6*7?", "42")]
    try:
        first = runner.run(tasks, 1)
        (t,) = first.trajectories
        assert t.outcome == "infra" and t.failure.source == "agent" and t.failure.cause == "connection_lost"
        assert "APIConnectionError" in t.failure.message and t.reward is None and t.finish_reason == "error"
        state["cut"] = True
        batch = rollout_scored(runner, Env(), {"cut": tasks[0]}, tasks, 1, None, seed=0, group_prefix="",
                               policy=RetryPolicy(retries=1, backoff_s=0.0))
        (t,) = batch.trajectories
        assert t.failure is None and t.reward == 1.0 and [f.cause for f in t.retried] == ["connection_lost"]
    finally:
        runner.close()


def test_an_agents_own_error_is_its_reward_and_infra_error_is_not(tok):
    async def agent(client, task):
        await ask(client, task)
        if task.id == "judge":
            raise InfraError("the retrieval service is down", cause="retrieval_down")
        raise ValueError("the agent could not parse its own plan")

    runner = AgentRunner(answer_engine(tok), ChatTemplate(tok), agent, RolloutConfig(max_new_tokens=16))
    try:
        batch = runner.run([Task("judge", "q", "42"), Task("own", "q", "42")], 1)
    finally:
        runner.close()
    by = {t.task_id: t for t in batch.trajectories}
    assert by["judge"].failure.cause == "retrieval_down" and by["judge"].reward is None
    assert by["own"].failure is None and by["own"].reward == 0.0 and by["own"].outcome == "policy"


def test_injected_agent_faults_are_seeded_and_recorded_before_any_request(tok):
    async def agent(client, task):
        return await ask(client, task)

    plan = FaultPlan(rate=0.5, seed=1)
    runner = AgentRunner(answer_engine(tok), ChatTemplate(tok), agent, RolloutConfig(max_new_tokens=16),
                         AgentSettings(timeout_s=20), faults=plan)
    tasks = [Task(f"t{i}", "q", "42") for i in range(6)]
    try:
        runs = [[(t.group_id, t.sample_index, t.failure and t.failure.cause) for t in runner.run(tasks, 2, seed=4)
                 .trajectories] for _ in range(2)]
    finally:
        runner.close()
    assert runs[0] == runs[1]
    failed = [r for r in runs[0] if r[2] is not None]
    assert failed and {r[2] for r in failed} == {"injected"} and len(failed) < 12
    assert len(runs[0]) == 12  # an attempt that failed before its first request is still recorded
