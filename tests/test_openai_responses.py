"""The Responses API (``POST /v1/responses``) with the real ``openai`` SDK against the real
server: a request becomes the same messages and tools as a Chat Completions one and is
captured by the same code, so a tool round trip (the whole history re-sent, or
``previous_response_id``) is one segment equal to the Chat Completions capture, and the
trained tokens are the responses' ``token_ids``."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

openai = pytest.importorskip("openai", reason="pip install 'agentrl[serve]'")

from agentrl.chat import ChatTemplate  # noqa: E402
from agentrl.engines.hf import HFEngine  # noqa: E402
from agentrl.engines.scripted import PerRequestScriptedEngine  # noqa: E402
from agentrl.models.tiny import ensure_tiny_model  # noqa: E402
from agentrl.serve.server import EndpointServer  # noqa: E402
from agentrl.serve.service import ChatService  # noqa: E402
from test_openai_endpoint import ADD, SYSTEM, TOOLS, budget, tool_agent, tool_script  # noqa: E402

RTOOLS = [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
           "parameters": t["function"]["parameters"], "strict": False} for t in TOOLS]
RADD = [{"type": "function", "name": "add", "description": "Add two integers.",
         "parameters": ADD[0]["function"]["parameters"]}]


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ensure_tiny_model())


@pytest.fixture()
def scripted(tok):
    service = ChatService(PerRequestScriptedEngine(tool_script(tok)), ChatTemplate(tok), budget())
    with EndpointServer(service) as server:
        yield service, server


def one_segment(service, key):
    cap = service.close_attempt(key)
    [t] = cap.trajectories(group_id="g", sample_index=0, task_id="t", family="f", policy_version=0)
    t.check()
    return cap, t


def trained(t) -> list[int]:
    return [i for i, m in zip(t.token_ids, t.loss_mask) if m]


def chat_capture(scripted):
    """The Chat Completions capture of the same tool round trip (the reference)."""
    service, server = scripted
    key = service.open_attempt(budget())

    async def go():
        client = openai.AsyncOpenAI(base_url=server.base_url(key), api_key="x", max_retries=0)
        try:
            from agentrl.types import Task

            return await tool_agent(client, Task("t", "What is 6*7?", "42"))
        finally:
            await client.close()

    assert asyncio.run(go()) == "<answer>42</answer>"
    return one_segment(service, key)[1]


def test_a_round_trip_resending_the_items_is_one_segment_equal_to_chat_completions(scripted):
    service, server = scripted
    reference = chat_capture(scripted)
    key = service.open_attempt(budget())
    client = openai.OpenAI(base_url=server.base_url(key), api_key="x", max_retries=0)
    items: list = [{"role": "user", "content": "What is 6*7?"}]
    r = client.responses.create(model="m", instructions=SYSTEM, input=items, tools=RTOOLS)
    [call] = r.output
    assert (call.type, call.name, json.loads(call.arguments)) == ("function_call", "python", {"code": "print(6*7)"})
    assert call.call_id.startswith("call_") and call.id.startswith("fc_") and r.status == "completed"
    items += [o.model_dump(exclude_none=True) for o in r.output]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "42\n"})
    r2 = client.responses.create(model="m", instructions=SYSTEM, input=items, tools=RTOOLS)
    assert r2.output_text == "<answer>42</answer>" and r2.output[0].type == "message"
    cap, got = one_segment(service, key)
    assert (got.token_ids, got.loss_mask, got.spans, got.logprobs) == \
        (reference.token_ids, reference.loss_mask, reference.spans, reference.logprobs)
    assert trained(got) == r.model_extra["token_ids"] + r2.model_extra["token_ids"]
    assert r2.usage.output_tokens == len(r2.model_extra["token_ids"]) and r2.usage.input_tokens > r.usage.input_tokens
    assert [(c.name, c.result) for c in got.tool_calls] == [("python", "42\n")]
    assert got.messages[2].name is None and got.messages[3].name == "python"  # the output named after its call


def test_previous_response_id_continues_the_attempts_stored_conversation(scripted):
    service, server = scripted
    reference = chat_capture(scripted)
    key = service.open_attempt(budget())
    client = openai.OpenAI(base_url=server.base_url(key), api_key="x", max_retries=0)
    r = client.responses.create(model="m", instructions=SYSTEM, input="What is 6*7?", tools=RTOOLS)
    call = r.output[0]
    r2 = client.responses.create(model="m", instructions=SYSTEM, previous_response_id=r.id, tools=RTOOLS,
                                 input=[{"type": "function_call_output", "call_id": call.call_id, "output": "42\n"}])
    assert r2.previous_response_id == r.id and r2.output_text == "<answer>42</answer>"
    other = service.open_attempt(budget())  # another attempt cannot continue it
    with pytest.raises(openai.BadRequestError) as got:
        openai.OpenAI(base_url=server.base_url(other), api_key="x", max_retries=0).responses.create(
            model="m", previous_response_id=r.id, input="and then?")
    assert got.value.body["param"] == "previous_response_id" and "not a stored response" in str(got.value)
    service.close_attempt(other)
    _, t = one_segment(service, key)
    assert (t.token_ids, t.loss_mask, t.spans) == (reference.token_ids, reference.loss_mask, reference.spans)
    assert trained(t) == r.model_extra["token_ids"] + r2.model_extra["token_ids"]

    key = service.open_attempt(budget())  # store=false keeps nothing to continue
    client = openai.OpenAI(base_url=server.base_url(key), api_key="x", max_retries=0)
    r = client.responses.create(model="m", input="hi", store=False)
    with pytest.raises(openai.BadRequestError, match="only with store=true"):
        client.responses.create(model="m", previous_response_id=r.id, input="and then?")
    service.close_attempt(key)


def test_streamed_responses_send_the_event_types_and_capture_the_same(scripted):
    service, server = scripted
    reference = chat_capture(scripted)
    key = service.open_attempt(budget())
    client = openai.OpenAI(base_url=server.base_url(key), api_key="x", max_retries=0)
    events = list(client.responses.create(model="m", instructions=SYSTEM, input="What is 6*7?", tools=RTOOLS,
                                          stream=True))
    assert [e.type for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    first = events[-1].response
    assert events[0].response.id == first.id and events[0].response.status == "in_progress"
    call = first.output[0]
    assert json.loads(events[4].arguments) == {"code": "print(6*7)"} and events[5].item.call_id == call.call_id
    with client.responses.stream(model="m", instructions=SYSTEM, previous_response_id=first.id, tools=RTOOLS,
                                 input=[{"type": "function_call_output", "call_id": call.call_id,
                                         "output": "42\n"}]) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", "response.output_text.delta", "response.output_text.done",
                     "response.content_part.done", "response.output_item.done", "response.completed"]
    assert final.output_text == "<answer>42</answer>"
    _, t = one_segment(service, key)
    assert (t.token_ids, t.loss_mask, t.spans) == (reference.token_ids, reference.loss_mask, reference.spans)
    assert trained(t) == first.model_extra["token_ids"] + final.model_extra["token_ids"]


def test_tool_choice_forces_a_call_through_the_formats_opening(tok):
    end = tok.convert_tokens_to_ids("<|im_end|>")

    def script(prompt: list[int], _turn: int) -> list[int]:
        text = tok.decode(prompt)
        if text.endswith('"arguments": '):
            return tok.encode('{"a": 2, "b": 3}}\n</tool_call>', add_special_tokens=False) + [end]
        if text.endswith('{"name": "'):
            return tok.encode('add", "arguments": {"a": 2, "b": 3}}\n</tool_call>', add_special_tokens=False) + [end]
        return tok.encode("no call", add_special_tokens=False) + [end]

    service = ChatService(PerRequestScriptedEngine(script), ChatTemplate(tok), budget())
    with EndpointServer(service) as server:
        for choice, forced in [({"type": "function", "name": "add"}, '<tool_call>\n{"name": "add", "arguments": '),
                               ("required", '<tool_call>\n{"name": "')]:
            key = service.open_attempt(budget())
            client = openai.OpenAI(base_url=server.base_url(key), api_key="x", max_retries=0)
            r = client.responses.create(model="m", input="2+3?", tools=RADD, tool_choice=choice)
            assert [(o.name, json.loads(o.arguments)) for o in r.output] == [("add", {"a": 2, "b": 3})]
            seq = service.close_attempt(key).segments[0].seq
            assert [s.kind for s in seq.spans] == ["prompt", "template", "model"]
            assert tok.decode(seq.token_ids[seq.spans[1].start:seq.spans[1].end]) == forced
            assert seq.token_ids[seq.spans[2].start:] == r.model_extra["token_ids"]
        r = openai.OpenAI(base_url=server.base_url(), api_key="x", max_retries=0).responses.create(
            model="m", input="2+3?", tools=RADD, tool_choice="none")
        assert r.output_text == "no call"
        for choice, words in [({"type": "function", "name": "sub"}, "not among the tools"),
                              ({"type": "allowed_tools", "mode": "auto", "tools": []}, "allowed_tools"),
                              ({"type": "web_search"}, "built-in tools")]:
            got = httpx.post(server.base_url() + "/responses", json={"input": "x", "tools": RADD,
                                                                     "tool_choice": choice}, timeout=30)
            assert got.status_code == 400 and words in got.json()["error"]["message"], got.text
            assert got.json()["error"]["param"] == "tool_choice"


@pytest.mark.parametrize("body, param, words", [
    ({"tools": [{"type": "web_search"}]}, "tools[0]", "built-in tool 'web_search'"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["v"]}]}, "tools[0]", "built-in tool 'file_search'"),
    ({"tools": [{"type": "computer_use_preview", "display_width": 1, "display_height": 1,
                 "environment": "linux"}]}, "tools[0]", "built-in tool"),
    ({"background": True}, "background", "only false"),
    ({"reasoning": {"summary": "auto"}}, "reasoning", "reasoning summaries"),
    ({"reasoning": {"effort": "high"}}, "reasoning", "reasoning setting"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}}, "text.format", "constrained decoding"),
    ({"text": {"verbosity": "low"}}, "text", "model='agentrl'"),
    ({"include": ["reasoning.encrypted_content"]}, "include", "only 'message.output_text.logprobs'"),
    ({"conversation": "conv_1"}, "conversation", "previous_response_id"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0]", "input_image"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", "previous_response_id"),
    ({"input": [{"type": "reasoning", "id": "rs_1", "summary": []}]}, "input[0].type", "reasoning items"),
    ({"input": [{"role": "assistant", "content": "x"}]}, "input", "continuing the assistant's turn"),
    ({"top_k": 5}, "top_k", "refused rather than ignored"),
])
def test_unsupported_fields_are_refused_naming_them(scripted, body, param, words):
    _, server = scripted
    got = httpx.post(server.base_url() + "/responses", json={"input": "hi", **body}, timeout=30)
    assert got.status_code == 400, got.text
    err = got.json()["error"]
    assert err["param"] == param and words in err["message"], err


def test_budgets_and_limits_are_the_chat_completions_ones(tok):
    ids = tok.encode("one two three four five six", add_special_tokens=False)
    service = ChatService(PerRequestScriptedEngine(lambda _p, _k: ids), ChatTemplate(tok), budget())
    with EndpointServer(service) as server:
        key = service.open_attempt(budget(max_sampled_tokens=5))
        client = openai.OpenAI(base_url=server.base_url(key), api_key="x", max_retries=0)
        r = client.responses.create(model="m", input="count", max_output_tokens=3)
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
        assert r.usage.output_tokens == 3 and r.output_text == tok.decode(ids[:3])
        r = client.responses.create(model="m", input=[{"role": "user", "content": "count"},
                                                      {"type": "message", "role": "assistant",
                                                       "content": [{"type": "output_text", "text": r.output_text}]},
                                                      {"role": "user", "content": "more"}])
        assert r.usage.output_tokens == 2  # the attempt's budget of 5 sampled tokens
        with pytest.raises(openai.BadRequestError, match="budget of 5 tokens"):
            client.responses.create(model="m", input="again")
        cap = service.close_attempt(key)
        assert (len(cap.segments), cap.sampled_tokens) == (1, 5)


def test_the_real_model_trains_on_the_response_token_ids(tok):
    engine = HFEngine.from_pretrained(ensure_tiny_model(), seed=0)
    service = ChatService(engine, ChatTemplate(tok), budget())
    with EndpointServer(service) as server:
        key = service.open_attempt(budget(seed=7))
        client = openai.OpenAI(base_url=server.base_url(key), api_key="x", max_retries=0)
        r = client.responses.create(model="tiny", input="hi", max_output_tokens=6,
                                    include=["message.output_text.logprobs"])
        r2 = client.responses.create(model="tiny", input="more?", previous_response_id=r.id, max_output_tokens=5,
                                     stream=False)
        _, t = one_segment(service, key)
    assert trained(t) == r.model_extra["token_ids"] + r2.model_extra["token_ids"] and len(trained(t)) == 11
    part = r.output[0].content[0]
    assert len(part.logprobs) == 6 and [lp.logprob for lp in part.logprobs] == t.logprobs[t.spans[1].start:
                                                                                           t.spans[1].end]


def test_an_openai_agents_sdk_agent_with_a_function_tool_runs_as_one_segment(scripted):
    """The OpenAI Agents SDK with its default model class (OpenAIResponsesModel) and a
    function tool: one attempt, one segment, the SDK's own history re-sent each turn."""
    agents = pytest.importorskip("agents", reason="pip install 'agentrl[agents]'")
    service, server = scripted
    agents.set_tracing_disabled(True)

    @agents.function_tool
    def python(code: str) -> str:
        """Run code.

        Args:
            code: the code.
        """
        return "42\n"

    async def run(key, streamed: bool):
        client = openai.AsyncOpenAI(base_url=server.base_url(key), api_key="x", max_retries=0)
        model = agents.OpenAIResponsesModel(model="agentrl", openai_client=client)
        agent = agents.Agent(name="calc", instructions=SYSTEM, tools=[python], model=model)
        try:
            if not streamed:
                return await agents.Runner.run(agent, "What is 6*7?")
            # streamed, each turn continuing the last by previous_response_id
            result = agents.Runner.run_streamed(agent, "What is 6*7?", auto_previous_response_id=True)
            async for _ in result.stream_events():
                pass
            return result
        finally:
            await client.close()

    for streamed in (False, True):
        key = service.open_attempt(budget())
        result = asyncio.run(run(key, streamed))
        assert result.final_output == "<answer>42</answer>"
        _, t = one_segment(service, key)
        assert [s.kind for s in t.spans] == ["prompt", "model", "template", "tool", "template", "model"]
        assert [(c.name, c.arguments, c.result) for c in t.tool_calls] == [("python", {"code": "print(6*7)"}, "42\n")]
        assert sum(r.usage.output_tokens for r in result.raw_responses) == len(trained(t))


def test_an_empty_turn_is_still_a_message_item_so_resending_it_extends_the_segment(tok):
    end = tok.convert_tokens_to_ids("<|im_end|>")
    service = ChatService(PerRequestScriptedEngine(lambda _p, _k: [end]), ChatTemplate(tok), budget())
    with EndpointServer(service) as server:
        key = service.open_attempt(budget())
        client = openai.OpenAI(base_url=server.base_url(key), api_key="x", max_retries=0)
        r = client.responses.create(model="m", input="hi")
        assert [(o.type, o.content[0].text) for o in r.output] == [("message", "")]
        client.responses.create(model="m", input=[{"role": "user", "content": "hi"},
                                                  *[o.model_dump(exclude_none=True) for o in r.output],
                                                  {"role": "user", "content": "well?"}])
        cap = service.close_attempt(key)
    assert (len(cap.segments), cap.segments[0].turns) == (1, 2)
