"""Live streaming (``stream=true``) of both APIs: one event per sampled token from an engine
that streams (the HF engine), the same tokens and the same capture as without streaming, text
that may open a tool call or a stop string held back, and one chunk from an engine that does
not stream."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

openai = pytest.importorskip("openai", reason="pip install 'agentrl[serve]'")

from agentrl.chat import ChatTemplate  # noqa: E402
from agentrl.engines.base import EngineCapabilities, SamplingParams  # noqa: E402
from agentrl.engines.hf import HFEngine  # noqa: E402
from agentrl.engines.scripted import PerRequestScriptedEngine  # noqa: E402
from agentrl.models.tiny import ensure_tiny_model  # noqa: E402
from agentrl.serve.server import EndpointServer  # noqa: E402
from agentrl.serve.service import ChatService  # noqa: E402
from agentrl.serve.streaming import TextStream, call_markers  # noqa: E402
from test_openai_endpoint import SYSTEM, TOOLS, budget  # noqa: E402

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ensure_tiny_model())


@pytest.fixture(scope="module")
def hf(tok):
    engine = HFEngine.from_pretrained(ensure_tiny_model(), seed=0)
    service = ChatService(engine, ChatTemplate(tok), budget(max_new_tokens=64))
    with EndpointServer(service) as server:
        yield engine, service, server


class StreamingScriptedEngine(PerRequestScriptedEngine):
    """The scripted engine, handing over its ids one at a time as an engine that streams."""

    capabilities = EngineCapabilities(shares_trainer_weights=True, background_sampling=True, can_sleep=False,
                                      per_request_async=True, streams=True)

    async def agenerate_stream(self, prompt, params, on_tokens):
        gen = await self.agenerate(prompt, params)
        for t in gen.token_ids:
            on_tokens([t])
            await asyncio.sleep(0)
        return gen


def test_the_engine_hands_over_each_id_as_sampled_and_samples_the_same(tok):
    engine = HFEngine.from_pretrained(ensure_tiny_model(), seed=0)
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=11)
    got: list[list[int]] = []

    async def go():
        streamed = await engine.agenerate_stream([1, 2, 3], params, got.append)
        return streamed, await engine.agenerate([1, 2, 3], params)

    streamed, plain = asyncio.run(go())
    assert got == [[t] for t in streamed.token_ids] and streamed.token_ids == plain.token_ids
    assert streamed.logprobs == plain.logprobs


def test_a_48_token_chat_stream_arrives_token_by_token_with_the_same_tokens(hf):
    engine, service, server = hf
    client = openai.OpenAI(base_url=server.base_url(), api_key="x", max_retries=0)
    plain = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=48, seed=5)
    key = service.open_attempt(budget(max_new_tokens=64))
    chunks, steps_at_first = [], None
    for ch in openai.OpenAI(base_url=server.base_url(key), api_key="x", max_retries=0).chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=48, seed=5, stream=True, stream_options={"include_usage": True}):
        if steps_at_first is None and ch.choices and ch.choices[0].delta.content:
            steps_at_first = engine.batcher_stats.steps
        chunks.append(ch)
    steps_at_end = engine.batcher_stats.steps
    deltas = [ch.choices[0].delta.content for ch in chunks if ch.choices and ch.choices[0].delta.content]
    # One per decode step while the writer keeps up (fewer, longer ones when it lags), and the
    # first arrived while the engine was still sampling.
    assert len(deltas) >= 8, len(deltas)
    assert steps_at_first < steps_at_end
    assert "".join(deltas) == plain.choices[0].message.content
    end = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason][0]
    assert end.choices[0].finish_reason == "length" and end.choices[0].model_extra["token_ids"] == \
        plain.choices[0].model_extra["token_ids"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 48
    seg = service.close_attempt(key).segments[0]
    assert seg.seq.token_ids[seg.seq.spans[1].start:] == plain.choices[0].model_extra["token_ids"]


def test_a_48_token_responses_stream_is_live_and_equal_to_the_plain_response(hf):
    _, service, server = hf

    def attempt(stream: bool):
        key = service.open_attempt(budget(seed=3, seed_key=("g", 0)))  # the same seed stream each time
        client = openai.OpenAI(base_url=server.base_url(key), api_key="x", max_retries=0)
        if stream:
            events = list(client.responses.create(model="m", input="hi", max_output_tokens=48, stream=True))
        else:
            events = [client.responses.create(model="m", input="hi", max_output_tokens=48)]
        return events, service.close_attempt(key).segments[0].seq

    [plain], plain_seq = attempt(False)
    events, seq = attempt(True)
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    final = events[-1].response
    assert events[-1].type == "response.incomplete" and final.incomplete_details.reason == "max_output_tokens"
    assert len(deltas) >= 8 and "".join(deltas) == final.output_text == plain.output_text
    assert final.model_extra["token_ids"] == plain.model_extra["token_ids"] and seq.token_ids == plain_seq.token_ids
    done = [e for e in events if e.type == "response.output_text.done"]
    assert [e.text for e in done] == [plain.output_text]


def test_the_first_text_reaches_the_client_while_the_engine_is_still_sampling(tok):
    """An engine that samples half the turn, then waits until the client has read a delta: it
    goes on only if the stream is live (else it would wait for ever: 20 s, then fail)."""
    import threading

    ids = tok.encode(" one two three four five six seven eight", add_special_tokens=False)
    gate, seen = threading.Event(), []

    class Gated(StreamingScriptedEngine):
        async def agenerate_stream(self, prompt, params, on_tokens):
            gen = await self.agenerate(prompt, params)
            half = len(ids) // 2
            on_tokens(gen.token_ids[:half])
            seen.append(await asyncio.get_running_loop().run_in_executor(None, gate.wait, 20))
            on_tokens(gen.token_ids[half:])
            return gen

    service = ChatService(Gated(lambda _p, _k: ids), ChatTemplate(tok), budget())
    with EndpointServer(service) as server:
        client = openai.OpenAI(base_url=server.base_url(), api_key="x", max_retries=0)
        deltas = []
        for ch in client.chat.completions.create(model="m", messages=MESSAGES, stream=True):
            if ch.choices and ch.choices[0].delta.content:
                deltas.append(ch.choices[0].delta.content)
                gate.set()
        gate.clear()
        text = []
        for e in client.responses.create(model="m", input="hi", stream=True):
            if e.type == "response.output_text.delta":
                text.append(e.delta)
                gate.set()
    assert seen == [True, True] and len(deltas) >= 2 and len(text) >= 2
    assert "".join(deltas) == "".join(text) == tok.decode(ids).strip()


def test_text_that_may_open_a_call_is_held_back_and_calls_come_whole(tok):
    end = tok.convert_tokens_to_ids("<|im_end|>")
    turn = 'Let me compute it. <tool_call>\n{"name": "python", "arguments": {"code": "print(6*7)"}}\n</tool_call>'
    ids = tok.encode(turn, add_special_tokens=False) + [end]
    service = ChatService(StreamingScriptedEngine(lambda _p, _k: ids), ChatTemplate(tok), budget())
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "6*7?"}]
    with EndpointServer(service) as server:
        client = openai.OpenAI(base_url=server.base_url(), api_key="x", max_retries=0)
        chunks = list(client.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True))
        rtools = [{"type": "function", **t["function"]} for t in TOOLS]
        events = list(client.responses.create(model="m", input="6*7?", tools=rtools, stream=True))
    deltas = [ch.choices[0].delta.content for ch in chunks if ch.choices[0].delta.content]
    assert len(deltas) >= 3 and "".join(deltas) == "Let me compute it."  # live, and never a piece of the call
    [calls] = [ch.choices[0].delta.tool_calls for ch in chunks if ch.choices[0].delta.tool_calls]
    assert json.loads(calls[0].function.arguments) == {"code": "print(6*7)"}
    text = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(text) == "Let me compute it." and len(text) >= 3
    kinds = [e.type for e in events]
    assert kinds.index("response.function_call_arguments.done") > kinds.index("response.output_item.done")
    assert [o.type for o in events[-1].response.output] == ["message", "function_call"]


def test_stop_strings_whitespace_and_partial_characters_are_held_until_known(tok):
    chat = ChatTemplate(tok)
    assert call_markers(chat) == ("<tool_call>",)
    text = TextStream(chat, tools=TOOLS, stop=["END"])
    pieces = [text.push(tok.encode(w, add_special_tokens=False)) for w in ["\n Hi", " there", " ", "<tool", "_call>"]]
    assert pieces == ["Hi", " there", "", "", ""]
    assert text.finish("Hi there") == ""
    text = TextStream(chat, tools=None, stop=["END"])
    assert [text.push(tok.encode(w, add_special_tokens=False)) for w in ["a", " E", "N", "D"]] == ["a", "", "", ""]
    assert text.finish("a") == ""
    text = TextStream(chat, tools=None, stop=[])
    pieces = [text.push([i]) for i in tok.encode("a ☃ b", add_special_tokens=False)]
    assert "".join(pieces) == "a ☃ b" and not any("\ufffd" in p for p in pieces)  # never half a character


def test_an_engine_that_does_not_stream_sends_its_completion_in_one_chunk(tok):
    ids = tok.encode("one two three", add_special_tokens=False)
    service = ChatService(PerRequestScriptedEngine(lambda _p, _k: ids), ChatTemplate(tok), budget())
    with EndpointServer(service) as server:
        client = openai.OpenAI(base_url=server.base_url(), api_key="x", max_retries=0)
        chunks = list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True))
        contents = [ch.choices[0].delta.content for ch in chunks if ch.choices[0].delta.content]
        assert contents == ["one two three"]
        got = httpx.post(server.base_url() + "/chat/completions", timeout=30,
                         json={"messages": MESSAGES, "stream": True, "max_tokens": 10**6})
        assert got.status_code == 400 and got.json()["error"]["param"] == "max_tokens"  # refused before streaming
        got = httpx.post(server.base_url() + "/responses", timeout=30,
                         json={"input": "hi", "stream": True, "previous_response_id": "resp_x"})
        assert got.status_code == 400 and got.json()["error"]["param"] == "previous_response_id"


def test_an_engine_failure_after_the_stream_began_ends_it_with_the_error(tok):
    ids = tok.encode("one two three", add_special_tokens=False)

    class Failing(StreamingScriptedEngine):
        async def agenerate_stream(self, prompt, params, on_tokens):
            on_tokens(ids[:2])
            raise RuntimeError("the GPU fell off")

    service = ChatService(Failing(lambda _p, _k: ids), ChatTemplate(tok), budget())
    with EndpointServer(service) as server:
        client = openai.OpenAI(base_url=server.base_url(), api_key="x", max_retries=0)
        with pytest.raises(openai.APIError, match="the GPU fell off"):
            list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True))
        events = list(client.responses.create(model="m", input="hi", stream=True))
    assert events[-1].type == "response.failed" and "the GPU fell off" in events[-1].response.error.message
    assert events[-1].response.error.code == "server_error"


def test_a_streamed_forced_call_sends_no_text_and_the_call_whole(tok):
    end = tok.convert_tokens_to_ids("<|im_end|>")
    rest = tok.encode('{"a": 2, "b": 3}}\n</tool_call>', add_special_tokens=False) + [end]
    service = ChatService(StreamingScriptedEngine(lambda _p, _k: rest), ChatTemplate(tok), budget())
    add = [{"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
    with EndpointServer(service) as server:
        key = service.open_attempt(budget())
        client = openai.OpenAI(base_url=server.base_url(key), api_key="x", max_retries=0)
        chunks = list(client.chat.completions.create(model="m", messages=MESSAGES, tools=add, stream=True,
                                                     tool_choice={"type": "function", "function": {"name": "add"}}))
        seq = service.close_attempt(key).segments[0].seq
    assert not any(ch.choices[0].delta.content for ch in chunks)
    [calls] = [ch.choices[0].delta.tool_calls for ch in chunks if ch.choices[0].delta.tool_calls]
    assert (calls[0].function.name, json.loads(calls[0].function.arguments)) == ("add", {"a": 2, "b": 3})
    assert [s.kind for s in seq.spans] == ["prompt", "template", "model"] and seq.token_ids[seq.spans[2].start:] == rest


def test_concurrent_streamed_attempts_capture_what_unstreamed_ones_do(tok):
    """AgentRunner, 2 tasks x G=2, two turns each, on the HF engine: agents that stream (both
    APIs) and agents that do not, with the same seed, give the same trajectories."""
    from agentrl.rollout import RolloutConfig
    from agentrl.rollout.agent_runner import AgentRunner
    from agentrl.types import Task

    async def chat_agent(client, task, stream: bool):
        messages = [{"role": "user", "content": task.prompt}]
        for _ in range(2):
            if stream:
                parts = [ch.choices[0].delta.content or "" async for ch in await client.chat.completions.create(
                    model="m", messages=messages, max_tokens=12, stream=True) if ch.choices]
                text = "".join(parts)
            else:
                r = await client.chat.completions.create(model="m", messages=messages, max_tokens=12)
                text = r.choices[0].message.content
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "and?"}]
        return text

    async def responses_agent(client, task, stream: bool):
        previous, text = None, ""
        for prompt in (task.prompt, "and?"):
            kw = dict(model="m", input=prompt, max_output_tokens=12, previous_response_id=previous)
            if stream:
                events = [e async for e in await client.responses.create(**kw, stream=True)]
                final = events[-1].response
                assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == final.output_text
            else:
                final = await client.responses.create(**kw)
            previous, text = final.id, final.output_text
        return text

    engine = HFEngine.from_pretrained(ensure_tiny_model(), seed=0)
    chat = ChatTemplate(tok)
    tasks = [Task("a", "hi", ""), Task("b", "hello there", "")]
    got = {}
    for name, agent in (("chat", chat_agent), ("responses", responses_agent)):
        for stream in (False, True):
            runner = AgentRunner(engine, chat, lambda c, t, a=agent, s=stream: a(c, t, s),
                                 RolloutConfig(max_new_tokens=12, max_total_tokens=256))
            try:
                batch = runner.run(tasks, 2, seed=3)
            finally:
                runner.close()
            assert all(t.agent.error is None and t.agent.segments == 1 for t in batch.trajectories)
            got[name, stream] = [(t.group_id, t.sample_index, t.token_ids, t.loss_mask) for t in batch.trajectories]
    assert got["chat", True] == got["chat", False] and got["responses", True] == got["responses", False]
