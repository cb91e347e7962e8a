"""The OpenAI-compatible endpoint with the real ``openai`` SDK against the real server (no
mocked transport): chat, tool-call round trips merged token-exactly, history rewrites split,
attribution and isolation of attempts, hostile requests, agent failures, 64 agents at once."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

openai = pytest.importorskip("openai", reason="pip install 'agentrl[serve]'")

from agentrl.algo.objective import Objective  # noqa: E402
from agentrl.algo.update import compute_advantages  # noqa: E402
from agentrl.chat import ChatTemplate  # noqa: E402
from agentrl.engines.hf import HFEngine  # noqa: E402
from agentrl.engines.scripted import PerRequestScriptedEngine, ScriptedEngine  # noqa: E402
from agentrl.env import Score  # noqa: E402
from agentrl.models.tiny import ensure_tiny_model  # noqa: E402
from agentrl.rollout import RolloutConfig, RolloutRunner  # noqa: E402
from agentrl.run.scoring import score_all  # noqa: E402
from agentrl.rollout.agent_runner import AgentRunner, AgentSettings, agent_metrics  # noqa: E402
from agentrl.serve.protocol import parse_messages as parse_request_messages  # noqa: E402
from agentrl.serve.server import EndpointServer  # noqa: E402
from agentrl.serve.service import AttemptBudget, ChatService  # noqa: E402
from agentrl.toolbox import ToolBox, tool  # noqa: E402
from agentrl.types import Message, Task, ToolCall, Trajectory  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SYSTEM = "Use the python tool, then reply <answer>N</answer>."


@tool
def python(code: str) -> str:
    """Run code.

    Args:
        code: the code.
    """
    return "42\n"


TOOLS = ToolBox([python]).schemas()


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ensure_tiny_model())


@pytest.fixture(scope="module")
def hf_engine():
    return HFEngine.from_pretrained(ensure_tiny_model(), seed=0)


def tool_script(tok):
    """A call while the prompt holds no tool result (a tool response, or the rewritten
    history's summary of one), then the answer."""
    end = tok.convert_tokens_to_ids("<|im_end|>")

    def script(prompt: list[int], _turn: int) -> list[int]:
        text = tok.decode(prompt)
        if "<tool_response>" in text or "printed 42" in text:
            body = "<answer>42</answer>"
        else:
            body = '<tool_call>\n{"name": "python", "arguments": {"code": "print(6*7)"}}\n</tool_call>'
        return tok.encode(body, add_special_tokens=False) + [end]

    return script


def budget(**kw) -> AttemptBudget:
    base = dict(max_total_tokens=512, max_sampled_tokens=400, max_new_tokens=64, temperature=1.0, top_p=1.0)
    return AttemptBudget(**{**base, **kw})


@pytest.fixture()
def scripted(tok):
    service = ChatService(PerRequestScriptedEngine(tool_script(tok)), ChatTemplate(tok), budget())
    with EndpointServer(service) as server:
        yield service, server


def runner_on(scripted, agent, config: RolloutConfig | None = None, settings: AgentSettings | None = None):
    """An AgentRunner that serves its attempts from the ``scripted`` fixture's service and server."""
    service, server = scripted
    runner = AgentRunner(service.engine, service.chat, agent, config, settings)
    runner._server, runner.service = server, service
    return runner


async def tool_agent(client, task, edit_history: bool = False):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task.prompt}]
    for _ in range(3):
        r = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        msg = r.choices[0].message
        if not msg.tool_calls:
            return msg.content
        assert r.choices[0].finish_reason == "tool_calls"
        if edit_history:  # summarise the call instead of keeping it: the history no longer extends
            messages = [messages[0], {"role": "user", "content": f"{task.prompt} (python printed 42)"}]
            continue
        messages.append(msg.model_dump(exclude_none=True))
        for call in msg.tool_calls:
            assert json.loads(call.function.arguments) == {"code": "print(6*7)"} and call.id.startswith("call_")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "42\n"})
    return None


def test_plain_chat_models_and_logprobs(hf_engine, tok):
    service = ChatService(hf_engine, ChatTemplate(tok), budget())
    with EndpointServer(service) as server:
        client = openai.OpenAI(base_url=server.base_url(), api_key="x", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["agentrl"]
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=7,
                                           logprobs=True, seed=3)
        choice = r.choices[0]
        assert choice.finish_reason == "length" and r.usage.completion_tokens == 7 and r.model == "tiny"
        assert len(choice.logprobs.content) == 7 and all(lp.logprob <= 0 for lp in choice.logprobs.content)
        again = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=7, seed=3)
        assert again.choices[0].message.content == choice.message.content  # the seed fixes the sample


def test_tool_round_trip_is_one_trajectory_equal_to_the_native_rollout(scripted, tok):
    service, server = scripted
    key = service.open_attempt(budget())
    task = Task("t0", "What is 6*7?", "42")

    async def go():
        client = openai.AsyncOpenAI(base_url=server.base_url(key), api_key="x", max_retries=0)
        try:
            return await tool_agent(client, task)
        finally:
            await client.close()

    assert asyncio.run(go()) == "<answer>42</answer>"
    [got] = service.close_attempt(key).trajectories(group_id="t0", sample_index=0, task_id="t0", family="f",
                                                    policy_version=0)
    got.check()
    native = RolloutRunner(ScriptedEngine(tool_script(tok)), ChatTemplate(tok), ToolBox([python], tokenizer=tok),
                           RolloutConfig(max_turns=3, max_new_tokens=64)).run([task], 1, SYSTEM).trajectories[0]
    assert (got.token_ids, got.loss_mask, got.spans, got.logprobs) == \
        (native.token_ids, native.loss_mask, native.spans, native.logprobs)
    assert [s.kind for s in got.spans] == ["prompt", "model", "template", "tool", "template", "model"]
    assert [(c.name, c.arguments, c.result) for c in got.tool_calls] == [("python", {"code": "print(6*7)"}, "42\n")]


def test_a_history_rewrite_splits_the_attempt(scripted, tok):
    runner = runner_on(scripted, lambda c, t: tool_agent(c, t, edit_history=True),
                       RolloutConfig(max_new_tokens=64, max_total_tokens=512))
    batch = runner.run([Task("t0", "What is 6*7?", "42")], 2)
    first, second = batch.trajectories[:2]
    for t in batch.trajectories:
        t.check()
    assert (first.agent.index, second.agent.index, first.agent.splits, second.agent.segments) == (0, 1, 1, 2)
    assert first.metadata == {} and second.metadata == {}  # agentrl keeps nothing of its own there
    assert [s.kind for s in first.spans] == ["prompt", "model"]  # the abandoned tool call
    assert [s.kind for s in second.spans] == ["prompt", "model"]  # the rewritten prompt, then the answer
    assert "(python printed 42)" in tok.decode(second.token_ids[: second.prompt_len])
    assert second.messages[-1].content == "<answer>42</answer>"
    assert agent_metrics(batch.trajectories) == {"agent/splits": 1.0, "agent/segments": 2.0, "agent/errors": 0.0}
    from agentrl.inspect.summary import segment_note

    assert "segment 2 of 2" in segment_note(second) and segment_note(batch.trajectories[-1]) != ""


class _Env:
    def score(self, task, messages):
        said = [m for m in messages if m.role == "assistant"]
        return Score(1.0 if said and said[-1].content == "right" else 0.0)


def _traj(group: str, sample: int, answer: str) -> Trajectory:
    return Trajectory([1, 2], 1, [0, 1], [0.0, -0.5], [], [Message("assistant", answer)], group_id=group,
                      sample_index=sample, task_id="t")


def test_split_attempts_are_scored_once_and_count_once_in_their_group():
    """Attempt 0 of group g is split in two (its last segment answers right), attempt 1 is wrong:
    rewards r = [1, 0] per attempt, mean 0.5, population std 0.5 -> A = [+1, -1], and both
    segments of attempt 0 carry +1 (counted per trajectory it would be mean 2/3)."""
    trajs = [_traj("g", 0, "wrong"), _traj("g", 0, "right"), _traj("g", 1, "wrong")]
    score_all(_Env(), {"t": Task("t", "", "")}, trajs)
    assert [t.reward for t in trajs] == [1.0, 1.0, 0.0]
    compute_advantages(trajs, Objective())
    assert [t.advantage for t in trajs] == pytest.approx([1.0, 1.0, -1.0])
    single = [_traj("g", 0, "right"), _traj("g", 1, "wrong")]
    score_all(_Env(), {"t": Task("t", "", "")}, single)
    compute_advantages(single, Objective())
    assert [t.advantage for t in single] == pytest.approx([1.0, -1.0])


def test_attempts_are_isolated(scripted):
    service, server = scripted
    a, b = service.open_attempt(budget()), service.open_attempt(budget())
    client_a = openai.OpenAI(base_url=server.base_url(a), api_key="x", max_retries=0)
    client_a.chat.completions.create(model="m", messages=[{"role": "user", "content": "only A"}])
    assert service.close_attempt(b).segments == []  # B saw nothing of A's request
    assert len(service.close_attempt(a).segments) == 1
    with pytest.raises(openai.NotFoundError, match="unknown or finished attempt"):
        client_a.chat.completions.create(model="m", messages=[{"role": "user", "content": "late"}])


def test_hostile_and_malformed_requests_get_openai_errors(scripted):
    service, server = scripted
    url = server.base_url() + "/chat/completions"
    ok = {"messages": [{"role": "user", "content": "hi"}]}
    cases = [
        (b"{not json", 400, "not valid JSON"),
        (json.dumps([1, 2]).encode(), 400, "JSON object"),
        (json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode(), 400, "role"),
        (json.dumps({"messages": []}).encode(), 400, "non-empty"),
        (json.dumps({**ok, "max_tokens": 10**12}).encode(), 400, "max_tokens"),
        (json.dumps({**ok, "max_tokens": -3}).encode(), 400, "max_tokens"),
        (json.dumps({**ok, "tool_choice": "required"}).encode(), 400, "tool_choice"),
        (json.dumps({**ok, "tool_choice": {"type": "function", "function": {"name": "python"}}}).encode(), 400,
         "tool_choice"),
        (json.dumps({**ok, "stream": "yes"}).encode(), 400, "stream"),
        (json.dumps({**ok, "n": 2}).encode(), 400, "n=2"),
        (json.dumps({**ok, "temperature": 7}).encode(), 400, "temperature"),
        (json.dumps({**ok, "top_p": 0}).encode(), 400, "top_p"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}]}).encode(),
         400, "tool_call_id"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}).encode(),
         400, "assistant"),
        (json.dumps({**ok, "tools": [{"type": "retrieval"}]}).encode(), 400, "tools[0]"),
        (b"x" * (10 << 20), 413, "limit"),
    ]
    with httpx.Client(timeout=30) as http:
        for body, status, words in cases:
            r = http.post(url, content=body, headers={"content-type": "application/json"})
            assert r.status_code == status, (body[:80], r.text)
            err = r.json()["error"]
            assert words in err["message"] and err["type"] == "invalid_request_error", (body[:80], err)
        assert http.get(server.base_url().rsplit("/v1", 1)[0] + "/nope").status_code == 404
        assert http.get(url).status_code == 405
        r = http.post(url, json=ok)  # still serving; no tools offered: the call text stays content
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "stop"
        assert "<tool_call>" in r.json()["choices"][0]["message"]["content"]
    assert service.stats.refused >= len(cases)


def test_agents_that_fail_get_reward_zero_and_the_batch_goes_on(scripted, tok):
    async def agent(client, task):
        if task.id == "boom-late":
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": task.prompt}])
            raise RuntimeError("the agent broke")
        if task.id == "boom-early":
            raise ValueError("before any request")
        if task.id == "slow":
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": task.prompt}])
            await asyncio.sleep(30)
        return await tool_agent(client, task)

    runner = runner_on(scripted, agent, RolloutConfig(max_new_tokens=64),
                       AgentSettings(timeout_s=2.0, max_sampled_tokens=400))
    tasks = [Task(i, "What is 6*7?", "42") for i in ("ok", "boom-late", "boom-early", "slow")]
    start = time.monotonic()
    batch = runner.run(tasks, 1)
    assert time.monotonic() - start < 20
    by = {t.task_id: t for t in batch.trajectories}
    assert set(by) == {"ok", "boom-late", "boom-early", "slow"}  # the early failure is recorded too
    assert by["ok"].reward is None and by["ok"].agent.error is None
    assert by["boom-late"].reward == 0.0 and "the agent broke" in by["boom-late"].agent.error
    assert by["boom-early"].reward == 0.0 and by["boom-early"].agent.error == "ValueError: before any request"
    assert by["boom-early"].token_ids == [] and by["boom-early"].failure is None
    assert by["slow"].reward == 0.0 and by["slow"].agent.error.startswith("timeout")
    assert agent_metrics(batch.trajectories)["agent/errors"] == pytest.approx(3 / 4)


def test_64_concurrent_agents_each_get_their_own_trajectory(hf_engine, tok):
    """16 tasks x G=4 agents at once on the tiny model, two requests each (the second extends
    the first with a follow-up question): every attempt is one trajectory holding its own
    task's prompt, and the engine batched requests of different attempts together."""

    async def agent(client, task):
        messages = [{"role": "user", "content": task.prompt}]
        r = await client.chat.completions.create(model="m", messages=messages, max_tokens=8)
        messages += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "sure?"}]
        r = await client.chat.completions.create(model="m", messages=messages, max_tokens=8)
        return r.choices[0].message.content

    runner = AgentRunner(hf_engine, ChatTemplate(tok), agent, RolloutConfig(max_new_tokens=8, max_total_tokens=256))
    try:
        joins = hf_engine.batcher_stats.joins
        batch = runner.run([Task(f"t{i}", f"task number {i} asks", "") for i in range(16)], 4, seed=1)
    finally:
        runner.close()
    assert len(batch.trajectories) == 64 and runner.service.stats.requests == 128
    assert hf_engine.batcher_stats.joins > joins
    for t in batch.trajectories:
        t.check()
        assert t.turns == 2 and t.agent.segments == 1
        assert f"task number {t.task_id[1:]} asks" in tok.decode(t.token_ids[: t.prompt_len])
        assert tok.decode(t.token_ids).count("sure?") == 1


def test_the_example_agent_offers_the_schema_it_was_warm_started_on():
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import openai_agent as ex
    finally:
        sys.path.pop(0)
    env = ex.ArithmeticAgentEnv(seed=0, num_train=8, num_test=2)
    assert ToolBox(env.tools(), default_timeout=10).schemas() == ex.TOOLS
    assert ex.calculate("print(str(12*34).zfill(8))") == "00000408\n"
    assert ex.calculate("__import__('os').system('true')").startswith("Error")


def test_serve_cli_answers_the_sdk():
    proc = subprocess.Popen([sys.executable, "-m", "agentrl", "serve", "tiny", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = ""
        while "serving" not in line:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "agentrl serve exited"
        base = line.split(" at ")[1].split()[0]
        client = openai.OpenAI(base_url=base, api_key="x", max_retries=0)
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        assert r.usage.completion_tokens == 3
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.slow
def test_openai_agent_example_learns(tmp_path):
    """examples/openai_agent_tiny.yaml, shortened: the agent's held-out accuracy rises."""
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "agentrl", "train", str(ROOT / "examples/openai_agent_tiny.yaml"),
                           f"output_dir={out}", "train.steps=5", "eval.every=5", "eval.num_tasks=32"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    acc = [m["eval/accuracy"] for m in evals if "eval/accuracy" in m]
    assert acc[0] <= 0.2 and acc[-1] >= 0.6, acc
    steps = [m for m in evals if "agent/splits" in m]
    assert steps and all(m["agent/errors"] == 0 for m in steps)
    assert max(m["agent/splits"] for m in steps) == 0  # the agent keeps its history


def test_stop_strings_are_left_out_of_the_content_but_not_out_of_the_tokens(tok):
    ids = tok.encode("the answer is 42 END and more", add_special_tokens=False)
    service = ChatService(PerRequestScriptedEngine([ids]), ChatTemplate(tok), budget())
    key = service.open_attempt(budget())
    with EndpointServer(service) as server:
        client = openai.OpenAI(base_url=server.base_url(key), api_key="x", max_retries=0)
        r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "?"}], stop=["END"])
    assert r.choices[0].message.content == "the answer is 42" and r.choices[0].finish_reason == "stop"
    seg = service.close_attempt(key).segments[0]
    assert seg.seq.token_ids[seg.seq.spans[1].start:] == ids  # the sampled ids, whole


def test_a_sync_agent_is_refused_with_the_fix(scripted):
    runner = runner_on(scripted, lambda client, task: "not a coroutine")
    with pytest.raises(TypeError, match="async def agent"):
        runner.run([Task("t", "q", "a")], 1)


def test_streaming_gives_the_same_tool_call_and_the_same_capture(scripted, tok):
    """stream=true (server-sent events, read by the SDK): the tool call, its id and the answer
    arrive as chunks, usage last; the attempt is captured as without streaming."""
    service, server = scripted
    key = service.open_attempt(budget())
    client = openai.OpenAI(base_url=server.base_url(key), api_key="x", max_retries=0)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is 6*7?"}]
    chunks = list(client.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True,
                                                 stream_options={"include_usage": True}))
    calls = [c for ch in chunks if ch.choices for c in (ch.choices[0].delta.tool_calls or [])]
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finish == ["tool_calls"] and chunks[-1].usage.completion_tokens > 0 and len(calls) == 1
    assert calls[0].function.name == "python" and json.loads(calls[0].function.arguments) == {"code": "print(6*7)"}
    messages += [{"role": "assistant", "content": None, "tool_calls": [
        {"id": calls[0].id, "type": "function", "function": {"name": "python", "arguments": calls[0].function.arguments}}]},
        {"role": "tool", "tool_call_id": calls[0].id, "content": "42\n"}]
    text = "".join(ch.choices[0].delta.content or "" for ch in
                   client.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True) if ch.choices)
    assert text == "<answer>42</answer>"
    [got] = service.close_attempt(key).trajectories(group_id="t", sample_index=0, task_id="t", family="f",
                                                    policy_version=0)
    got.check()
    assert [s.kind for s in got.spans] == ["prompt", "model", "template", "tool", "template", "model"]


CALLING = "\nCalling tools:\n[{'id': 'call_1', 'type': 'function', 'function': {'name': 'python_interpreter', " \
          "'arguments': 'print(6*7)'}}]"


def _smolagents_service(tok):
    """A code agent's script: a code block ended by the stop string, then the answer once the
    prompt holds an observation."""
    end = tok.convert_tokens_to_ids("<|im_end|>")

    def script(prompt: list[int], _turn: int) -> list[int]:
        if "Observation:" in tok.decode(prompt):
            return tok.encode("Thought: it printed 42.\n<answer>42</answer>", add_special_tokens=False) + [end]
        return tok.encode("Thought: compute it.\nCode:\n```py\nprint(6*7)\n```<end_code> and then more",
                          add_special_tokens=False) + [end]

    return ChatService(PerRequestScriptedEngine(script, tokenizer=tok), ChatTemplate(tok), budget())


def test_a_history_that_resends_the_turn_as_text_with_user_observations_stays_one_segment(tok):
    """smolagents' CodeAgent, by hand: it stops on <end_code>, re-sends the model's turn as text
    (the stop string put back, "Calling tools: [...]" appended) and the result as a user
    "Observation:" message. The rendering still starts with what the model was given and
    sampled, so the attempt stays one segment; the observation is a prompt span, never tool."""
    service = _smolagents_service(tok)
    key = service.open_attempt(budget())
    stop = ["<end_code>", "Observation:", "Calling tools:"]
    messages = [{"role": "system", "content": "Solve with code."}, {"role": "user", "content": "What is 6*7?"}]
    with EndpointServer(service) as server:
        client = openai.OpenAI(base_url=server.base_url(key), api_key="x", max_retries=0)
        first = client.chat.completions.create(model="m", messages=messages, stop=stop).choices[0].message.content
        assert first == "Thought: compute it.\nCode:\n```py\nprint(6*7)\n```"
        messages += [{"role": "assistant", "content": [{"type": "text", "text": first + "<end_code>" + CALLING}]},
                     {"role": "user", "content": [{"type": "text", "text": "Observation:\nExecution logs:\n42\n"}]}]
        answer = client.chat.completions.create(model="m", messages=messages, stop=stop).choices[0].message.content
    assert answer == "Thought: it printed 42.\n<answer>42</answer>"
    cap = service.close_attempt(key)
    assert (len(cap.segments), cap.splits, cap.segments[0].turns) == (1, 0, 2)
    [t] = cap.trajectories(group_id="g", sample_index=0, task_id="t", family="f", policy_version=0)
    t.check()
    assert [s.kind for s in t.spans] == ["prompt", "model", "template", "prompt", "template", "model"]
    observation = t.spans[3]
    assert tok.decode(t.token_ids[observation.start:observation.end]) == "Observation:\nExecution logs:\n42\n"
    assert CALLING in tok.decode(t.token_ids[t.spans[2].start:t.spans[2].end])
    # the engine was given exactly the rendering of the agent's second request
    second = parse_request_messages(messages)
    rendered = ChatTemplate(tok).render(second, None, add_generation_prompt=True)
    assert tok.decode(t.token_ids[: t.spans[5].start]) == rendered
    assert t.messages[-1].content == answer and len(t.messages) == 5


def test_a_rewritten_model_turn_still_splits_and_user_followups_are_prompt_spans(scripted, tok):
    """smolagents' ToolCallingAgent re-sends the model's structured call as "Calling tools:"
    text: not the turn that was sampled, so a new segment starts. A plain follow-up user
    message extends the segment as a prompt span."""
    service, server = scripted
    key = service.open_attempt(budget())
    client = openai.OpenAI(base_url=server.base_url(key), api_key="x", max_retries=0)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is 6*7?"}]
    r = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    assert r.choices[0].message.tool_calls
    rewritten = messages + [{"role": "assistant", "content": CALLING.strip()},
                            {"role": "user", "content": "Observation:\n42"}]
    client.chat.completions.create(model="m", messages=rewritten, tools=TOOLS)
    cap = service.close_attempt(key)
    assert (len(cap.segments), cap.splits) == (2, 1)

    key = service.open_attempt(budget())
    client = openai.OpenAI(base_url=server.base_url(key), api_key="x", max_retries=0)
    messages = [{"role": "user", "content": "hi"}]
    r = client.chat.completions.create(model="m", messages=messages)
    messages += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "sure?"}]
    client.chat.completions.create(model="m", messages=messages)
    [t] = service.close_attempt(key).trajectories(group_id="g", sample_index=0, task_id="t", family="f",
                                                  policy_version=0)
    assert [s.kind for s in t.spans] == ["prompt", "model", "template", "prompt", "template", "model"]


# -- forced tool calls (tool_choice "required" or a named function) ------------------------------

ADD = [{"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]
NAMED = {"type": "function", "function": {"name": "add"}}


def _forced_turn(service, key, server, tools, choice, messages=None):
    client = openai.OpenAI(base_url=server.base_url(key), api_key="x", max_retries=0)
    return client.chat.completions.create(model="m", messages=messages or [{"role": "user", "content": "2+3?"}],
                                          tools=tools, tool_choice=choice)


def test_a_forced_call_is_written_not_sampled_and_the_attempt_goes_on(tok):
    """hermes (the tiny model): tool_choice names `add`, so the template's call opening through
    `"arguments": ` is written into the turn (mask 0, a template span) and the model samples the
    rest; the call round-trips into one segment. "required" stops before the name; "none"
    leaves a call the model writes as text."""
    end = tok.convert_tokens_to_ids("<|im_end|>")

    def script(prompt: list[int], _turn: int) -> list[int]:
        text = tok.decode(prompt)
        if "<tool_response>" in text:
            return tok.encode("<answer>5</answer>", add_special_tokens=False) + [end]
        if text.endswith('"arguments": '):
            return tok.encode('{"a": 2, "b": 3}}\n</tool_call>', add_special_tokens=False) + [end]
        if text.endswith('{"name": "'):
            return tok.encode('add", "arguments": {"a": 2, "b": 3}}\n</tool_call>', add_special_tokens=False) + [end]
        return tok.encode('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 1}}\n</tool_call>',
                          add_special_tokens=False) + [end]

    service = ChatService(PerRequestScriptedEngine(script), ChatTemplate(tok), budget())
    with EndpointServer(service) as server:
        key = service.open_attempt(budget())
        r = _forced_turn(service, key, server, ADD, NAMED)
        msg = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls" and msg.tool_calls[0].function.name == "add"
        assert json.loads(msg.tool_calls[0].function.arguments) == {"a": 2, "b": 3}
        messages = [{"role": "user", "content": "2+3?"}, msg.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "5"}]
        assert _forced_turn(service, key, server, ADD, "auto", messages).choices[0].message.content == \
            "<answer>5</answer>"
        [t] = service.close_attempt(key).trajectories(group_id="g", sample_index=0, task_id="t", family="f",
                                                      policy_version=0)
        t.check()
        assert [s.kind for s in t.spans] == ["prompt", "template", "model", "template", "tool", "template", "model"]
        forced = t.spans[1]
        assert tok.decode(t.token_ids[forced.start:forced.end]) == '<tool_call>\n{"name": "add", "arguments": '
        assert set(t.loss_mask[forced.start:forced.end]) == {0}
        assert set(t.loss_mask[t.spans[2].start:t.spans[2].end]) == {1}

        key = service.open_attempt(budget())
        r = _forced_turn(service, key, server, ADD, "required")
        assert r.choices[0].message.tool_calls[0].function.name == "add"
        seg = service.close_attempt(key).segments[0]
        assert tok.decode(seg.seq.token_ids[seg.seq.spans[1].start:seg.seq.spans[1].end]) == '<tool_call>\n{"name": "'

        key = service.open_attempt(budget())
        r = _forced_turn(service, key, server, ADD, "none")
        assert r.choices[0].message.tool_calls is None and "<tool_call>" in r.choices[0].message.content
        assert [s.kind for s in service.close_attempt(key).segments[0].seq.spans] == ["prompt", "model"]

        url = server.base_url() + "/chat/completions"
        for body, words in [({"tools": ADD, "tool_choice": {"type": "function", "function": {"name": "sub"}}},
                             "not among the tools"),
                            ({"tool_choice": "required"}, "needs tools"),
                            ({"tools": ADD, "tool_choice": {"type": "function", "function": {"name": "<|im_end|>"}}},
                             "function name")]:
            got = httpx.post(url, json={"messages": [{"role": "user", "content": "x"}], **body}, timeout=30)
            assert got.status_code == 400 and words in got.json()["error"]["message"], got.text
            assert got.json()["error"]["param"] == "tool_choice"


trl_spec = __import__("importlib.util").util.find_spec("trl")
CORPUS = Path(trl_spec.origin).parent / "chat_templates" if trl_spec else None
MARKERS = r"<\|[^|<>\s]{1,40}\|>|<\|[A-Za-z_\"]{1,40}>|<[A-Za-z_]{1,40}\|>|<｜[^｜<>]{1,40}｜>"
FORCED = [("qwen2_5.jinja", "hermes"), ("qwen3.jinja", "hermes"), ("llama3_1.jinja", "llama3_json"),
          ("qwen3_6.jinja", "qwen_xml"), ("glm4moe_training.jinja", "glm4"), ("gptoss.jinja", "harmony"),
          ("gemma4.jinja", "gemma4"), ("lfm2_2_5.jinja", "pythonic"), ("muse_glimmer.jinja", "atem_xml"),
          ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "mistral")]


def _family_chat(name: str) -> ChatTemplate:
    """A template of the corpus (or the fixtures) over the Qwen2.5 tokenizer, its markers added
    as special tokens (as tests/test_formats_rollout.py does)."""
    import re

    from transformers import AutoTokenizer

    from fixture_paths import QWEN25, TEMPLATES

    path = TEMPLATES / name if (TEMPLATES / name).exists() else CORPUS / name
    source = path.read_text()
    family = AutoTokenizer.from_pretrained(QWEN25)
    family.add_special_tokens({"additional_special_tokens": sorted(set(re.findall(MARKERS, source)))})
    return ChatTemplate(family, str(path))


@pytest.mark.skipif(CORPUS is None, reason="needs trl's chat templates: pip install trl (make test installs it)")
@pytest.mark.parametrize("name, fmt", FORCED)
def test_forced_calls_in_every_format_write_the_templates_own_opening(name, fmt):
    """For a template of each format: the forced text is the start of the template's own
    rendering of the call, the model (scripted) samples the rest, the endpoint hands back a
    call of the named function, and the capture has the forced ids as a mask-0 template span."""
    from agentrl.serve.service import forced_call

    chat = _family_chat(name)
    tok = chat.tokenizer
    assert chat.tool_call_format == fmt
    user = [Message("user", "2+3?")]
    prompt = chat.render(user, ADD, add_generation_prompt=True)
    call = ToolCall("add", {"a": 2, "b": 3}, "call00002")  # an id of 9 characters, as Mistral's template requires
    full = chat.render([*user, Message("assistant", "", [call])], ADD)
    turn = full[len(prompt):]
    turn = turn[:min(turn.find(m) + len(m) for m in (*chat.format.stop_tokens, chat.turn_end) if m in turn)]
    how = forced_call(chat)
    for choice, forced in ((NAMED, how.text("add")), ("required", how.text(None))):
        assert turn.startswith(forced) and forced, (turn, forced)
        rest = tok.encode(turn[len(forced):], add_special_tokens=False)
        service = ChatService(PerRequestScriptedEngine(lambda _p, _k: rest), chat, budget())
        key = service.open_attempt(budget())
        with EndpointServer(service) as server:
            r = _forced_turn(service, key, server, ADD, choice)
        [call] = r.choices[0].message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)) == ("add", {"a": 2, "b": 3})
        assert r.choices[0].finish_reason == "tool_calls"
        seq = service.close_attempt(key).segments[0].seq
        assert [s.kind for s in seq.spans] == ["prompt", "template", "model"]
        span = seq.spans[1]
        assert tok.decode(seq.token_ids[span.start:span.end]) == forced
        assert set(seq.loss_mask[span.start:span.end]) == {0}
        assert seq.token_ids[seq.spans[2].start:] == rest


@pytest.mark.skipif(CORPUS is None, reason="needs trl's chat templates: pip install trl (make test installs it)")
def test_a_forced_call_the_template_cannot_write_is_refused_with_the_reason(tok):
    """DeepSeek-V3's template opens a reasoning block in its generation prompt that a call turn
    does not continue; code_block runs calls inside the turn: tool_choice "required" gets a 400
    naming tool_choice and why, and nothing is captured."""
    for chat, words in [(_family_chat("deepseekv3_training.jinja"), "does not continue the generation prompt"),
                        (ChatTemplate(tok, tool_call_format="code_block"), "inside the turn")]:
        service = ChatService(PerRequestScriptedEngine(lambda _p, _k: [1]), chat, budget())
        key = service.open_attempt(budget())
        with EndpointServer(service) as server, pytest.raises(openai.BadRequestError, match=words) as got:
            _forced_turn(service, key, server, ADD, "required")
        assert got.value.body["param"] == "tool_choice" and service.close_attempt(key).segments == []
