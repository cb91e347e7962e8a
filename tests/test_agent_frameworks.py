"""Agents built with the ecosystem's frameworks, as shipped (issue 27, item 8): the OpenAI
Agents SDK with its default model class (``OpenAIResponsesModel``) and smolagents'
``ToolCallingAgent``, each through the examples' agents. First against the endpoint over a
scripted engine (what each framework sends and how it is captured, token by token), then
through one ``agentrl train`` step of the tiny configs each."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

openai = pytest.importorskip("openai", reason="pip install 'agentrl[serve]'")

from agentrl.chat import ChatTemplate  # noqa: E402
from agentrl.engines.scripted import PerRequestScriptedEngine  # noqa: E402
from agentrl.models.tiny import ensure_tiny_model  # noqa: E402
from agentrl.serve.server import EndpointServer  # noqa: E402
from agentrl.serve.service import AttemptBudget, ChatService  # noqa: E402
from agentrl.toolbox import ToolBox  # noqa: E402
from agentrl.types import Task, read_jsonl  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CALL = '<tool_call>\n{"name": "python", "arguments": {"code": "print(6*7)"}}\n</tool_call>'


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ensure_tiny_model())


def example(name: str):
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        return __import__(name)
    finally:
        sys.path.pop(0)


def budget(total: int = 4096) -> AttemptBudget:
    return AttemptBudget(max_total_tokens=total, max_sampled_tokens=1024, max_new_tokens=64, temperature=1.0, top_p=1.0)


def attempt(tok, script, agent, total: int = 4096):
    """Run ``agent(client)`` as one attempt on a scripted endpoint; its answer and capture."""
    service = ChatService(PerRequestScriptedEngine(script), ChatTemplate(tok), budget(total))
    with EndpointServer(service) as server:
        key = service.open_attempt(budget(total))

        async def go():
            async with openai.AsyncOpenAI(base_url=server.base_url(key), api_key="x", max_retries=0) as client:
                return await agent(client)

        answer = asyncio.run(go())
        return answer, service.close_attempt(key)


def test_the_agents_sdk_agent_is_one_segment_with_the_schema_it_was_warm_started_on(tok):
    pytest.importorskip("agents", reason="pip install 'agentrl[agents]'")
    ex = example("agents_sdk_agent")
    end = tok.convert_tokens_to_ids("<|im_end|>")

    def script(prompt, _turn):
        body = "<answer>42</answer>" if "<tool_response>" in tok.decode(prompt) else CALL
        return tok.encode(body, add_special_tokens=False) + [end]

    answer, cap = attempt(tok, script, lambda client: ex.solve(client, Task("t", "What is 6*7?", "42")), 512)
    assert answer == "<answer>42</answer>"
    assert (len(cap.segments), cap.splits, cap.segments[0].turns) == (1, 0, 2)
    seg = cap.segments[0]
    # What the SDK sent (Responses tools, converted) is what the warm start renders.
    env = ex.AgentsSDKArithmeticEnv(seed=0, num_train=8, num_test=2)
    assert seg.tools == ToolBox(env.tools(), default_timeout=10).schemas()
    assert seg.messages[0].role == "system" and seg.messages[0].content == ex.SYSTEM
    assert [s.kind for s in seg.seq.spans] == ["prompt", "model", "template", "tool", "template", "model"]
    assert [m.content for m in seg.messages if m.role == "tool"] == ["42\n"]


def test_the_agents_sdk_agent_scores_a_model_that_runs_out_of_tokens_as_no_answer(tok):
    """The SDK raises ModelBehaviorError on an incomplete response: the model's failure, so the
    example returns None (reward 0 from the checker), not an agent error."""
    pytest.importorskip("agents", reason="pip install 'agentrl[agents]'")
    ex = example("agents_sdk_agent")
    answer, cap = attempt(tok, lambda p, k: tok.encode(" many words" * 80, add_special_tokens=False),
                          lambda client: ex.solve(client, Task("t", "What is 6*7?", "42")), 512)
    assert answer is None and cap.segments[0].finish_reason == "length"


def test_smolagents_tool_calling_agent_as_shipped_forces_calls_and_splits_per_step(tok):
    """smolagents sends tool_choice "required": the format's call opening is written into the
    turn (a template span, mask 0) and the model samples the rest. Its next step re-sends the
    call as "Calling tools:" text with the result as a user "Observation:", so it starts a
    segment of its own, whose observation is a prompt span, never a tool span."""
    pytest.importorskip("smolagents", reason="pip install smolagents")
    ex = example("smolagents_agent")
    end = tok.convert_tokens_to_ids("<|im_end|>")
    forced = '<tool_call>\n{"name": "'

    def script(prompt, _turn):
        text = tok.decode(prompt)
        assert text.endswith(forced)  # every request forces a call
        last_user = text.rsplit("<|im_start|>user", 1)[-1]
        rest = 'final_answer", "arguments": {"answer": "42"}}' if "42" in last_user else \
            'python", "arguments": {"code": "print(6*7)"}}'
        return tok.encode(rest + "\n</tool_call>", add_special_tokens=False) + [end]

    task = Task("t", "What is 6*7?", "42")
    answer, cap = attempt(tok, script, lambda client: ex.solve(client, task))
    assert answer == "<answer>42</answer>"
    assert (len(cap.segments), cap.splits) == (2, 1) and [s.turns for s in cap.segments] == [1, 1]
    first, second = cap.segments
    assert [s.kind for s in first.seq.spans] == ["prompt", "template", "model"]  # the forced opening, then sampled
    assert set(first.seq.loss_mask[:first.seq.spans[2].start]) == {0}
    assert "You are an expert assistant who can solve any task using tool calls" in first.messages[0].content
    assert [t["function"]["name"] for t in first.tools] == ["python", "final_answer"]
    assert [s.kind for s in second.seq.spans] == ["prompt", "template", "model"]
    assert "Calling tools:" in tok.decode(second.seq.token_ids) and "42" in second.messages[-2].content
    assert second.messages[-2].role == "user"  # the observation


def train_one_step(config: str, tmp_path: Path, *overrides: str):
    """``agentrl train`` of an example for one step (no warm start, no evaluation); its step-1
    metrics and trajectories."""
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "agentrl", "train", str(ROOT / "examples" / config),
                           f"output_dir={out}", "train.steps=1", "warmstart.enabled=false", "eval.num_tasks=0",
                           "train.prompts_per_step=2", "algo.num_samples=2", *overrides],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [metrics] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
                 if json.loads(line)["step"] == 1]
    trajs = read_jsonl(str(out / "rollouts" / "step_000001.jsonl"))
    for t in trajs:
        t.check()
    return metrics, trajs


@pytest.mark.slow
def test_the_agents_sdk_example_trains_a_step(tmp_path):
    pytest.importorskip("agents", reason="pip install 'agentrl[agents]'")
    metrics, trajs = train_one_step("agents_sdk_tiny.yaml", tmp_path)
    assert metrics["agent/errors"] == 0.0 and len({(t.group_id, t.sample_index) for t in trajs}) == 4
    assert all(t.num_model_tokens > 0 for t in trajs)
    assert all(t.messages[0].role == "system" and "python tool" in t.messages[0].content for t in trajs)


@pytest.mark.slow
def test_the_smolagents_example_trains_a_step(tmp_path):
    pytest.importorskip("smolagents", reason="pip install smolagents")
    metrics, trajs = train_one_step("smolagents_tiny.yaml", tmp_path)
    assert metrics["agent/errors"] == 0.0 and metrics["agent/segments"] >= 1
    firsts = [t for t in trajs if t.agent.index == 0]
    assert len(firsts) == 4 and all(t.num_model_tokens > 0 for t in trajs)
    for t in firsts:  # smolagents' own prompt, and its first step a forced call
        assert "solve any task using tool calls" in t.messages[0].content and t.spans[1].kind == "template"


def test_smolagents_losing_the_endpoint_is_an_infrastructure_failure():
    """smolagents wraps the client's connection error in its AgentGenerationError: the
    attempt is still the infrastructure's failure (retried, never scored), found by the
    exception it was raised from."""
    pytest.importorskip("smolagents", reason="pip install smolagents")
    from agentrl.rollout.agent_runner import infra_failure

    ex = example("smolagents_agent")
    with pytest.raises(Exception) as raised:
        ex.run_agent("http://127.0.0.1:9/v1", "What is 6*7?")
    assert type(raised.value).__name__ == "AgentGenerationError"
    failure = infra_failure(raised.value)
    assert failure is not None and failure.cause == "connection_lost" and "APIConnectionError" in failure.message
