"""Responses API bodies: the ``response`` object of a completion (output items ``message`` and
``function_call``, whose ``call_id`` the next request's ``function_call_output`` answers) and
its stream of server-sent events, sent live as the turn is sampled (``streaming.py``).

Besides OpenAI's fields a response carries ``token_ids``: the ids the model sampled for it
(the ids the trainer trains on), as a chat completion's choice does.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from agentrl.serve.protocol import Completion
from agentrl.serve.responses import ResponsesRequest
from agentrl.serve.streaming import LiveTokens, TextStream, live_ids, sse, stream_error


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _text_part(text: str, c: Completion | None, want_logprobs: bool) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    if want_logprobs and c is not None:
        part["logprobs"] = [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                            for t, lp in zip(c.token_texts, c.logprobs)]
    return part


def message_item(item_id: str, text: str, c: Completion | None, want_logprobs: bool,
                 status: str = "completed") -> dict[str, Any]:
    content = [_text_part(text, c, want_logprobs)] if status == "completed" else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def call_items(c: Completion) -> list[dict[str, Any]]:
    return [{"type": "function_call", "id": new_id("fc"), "call_id": call.id, "name": call.name,
             "arguments": json.dumps(call.arguments), "status": "completed"} for call in c.message.tool_calls]


def response_object(rid: str, req: ResponsesRequest, model: str, created: int, *, status: str = "completed",
                    output: list[dict[str, Any]] | None = None, c: Completion | None = None) -> dict[str, Any]:
    """The ``response`` object (``status`` "in_progress" while streaming: no output yet)."""
    chat = req.chat
    body: dict[str, Any] = {
        "id": rid, "object": "response", "created_at": created, "status": status, "error": None,
        "incomplete_details": None, "instructions": req.instructions, "max_output_tokens": chat.max_tokens,
        "model": model, "output": output or [], "parallel_tool_calls": True,
        "previous_response_id": req.previous_response_id, "reasoning": None, "store": req.store,
        "temperature": chat.temperature, "top_p": chat.top_p, "text": {"format": req.text_format},
        "tool_choice": req.tool_choice, "tools": req.tools, "truncation": "disabled", "metadata": req.metadata,
        "usage": None,
    }
    if c is not None:
        if c.finish_reason == "length":
            body["status"], body["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
        body["usage"] = {"input_tokens": c.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
                         "output_tokens": len(c.token_ids), "output_tokens_details": {"reasoning_tokens": 0},
                         "total_tokens": c.prompt_tokens + len(c.token_ids)}
        body["token_ids"] = c.token_ids
    return body


def response_body(rid: str, req: ResponsesRequest, c: Completion, model: str) -> dict[str, Any]:
    """The whole response of a completion (a message item when it wrote text or made no call,
    then one function_call item per call)."""
    # A turn without calls is a message even when empty: re-sent, it is the turn that was sampled.
    text = c.message.content or not c.message.tool_calls
    output = [message_item(new_id("msg"), c.message.content, c, req.chat.logprobs)] if text else []
    return response_object(rid, req, model, int(time.time()), output=output + call_items(c), c=c)


async def response_events(chat, req: ResponsesRequest, model: str, rid: str, live: LiveTokens, task):
    """The server-sent events of a streamed response, as OpenAI sends them: created and
    in_progress; the message item (added, its text part, a text delta whenever safe text was
    sampled, done) once there is text; each function call (added, its arguments, done) once
    the turn is parsed; completed (or incomplete, at max_output_tokens). A failure after the
    stream began is a ``response.failed`` event."""
    seq = iter(range(1 << 62))
    created = int(time.time())

    def event(kind: str, **fields) -> str:
        return sse({"type": kind, "sequence_number": next(seq), **fields})

    start = response_object(rid, req, model, created, status="in_progress")
    yield event("response.created", response=start)
    yield event("response.in_progress", response=start)
    text = TextStream(chat, req.chat.tools if req.chat.tool_choice != "none" else None, req.chat.stop, live.forced)
    msg_id, opened = new_id("msg"), False

    def open_message():
        yield event("response.output_item.added", output_index=0,
                    item=message_item(msg_id, "", None, False, status="in_progress"))
        yield event("response.content_part.added", item_id=msg_id, output_index=0, content_index=0,
                    part=_text_part("", None, False))

    async for ids in live_ids(live):
        if delta := text.push(ids):
            if not opened:
                for e in open_message():
                    yield e
                opened = True
            yield event("response.output_text.delta", item_id=msg_id, output_index=0, content_index=0,
                        delta=delta, logprobs=[])
    try:
        _, c = await task
    except Exception as e:  # noqa: BLE001 - the status line was sent: the client reads the failure here
        err = stream_error(e)
        yield event("response.failed", response={**start, "status": "failed", "error": {
            "code": err.code or ("server_error" if err.status >= 500 else "invalid_request"), "message": err.message}})
        return
    output = []
    if c.message.content or opened or not c.message.tool_calls:
        if not opened:
            for e in open_message():
                yield e
        if rest := text.finish(c.message.content):
            yield event("response.output_text.delta", item_id=msg_id, output_index=0, content_index=0,
                        delta=rest, logprobs=[])
        item = message_item(msg_id, c.message.content, c, req.chat.logprobs)
        part = item["content"][0]
        yield event("response.output_text.done", item_id=msg_id, output_index=0, content_index=0,
                    text=c.message.content, logprobs=part["logprobs"])
        yield event("response.content_part.done", item_id=msg_id, output_index=0, content_index=0, part=part)
        yield event("response.output_item.done", output_index=0, item=item)
        output.append(item)
    for item in call_items(c):
        at = len(output)
        yield event("response.output_item.added", output_index=at, item={**item, "arguments": "",
                                                                         "status": "in_progress"})
        yield event("response.function_call_arguments.delta", item_id=item["id"], output_index=at,
                    delta=item["arguments"])
        yield event("response.function_call_arguments.done", item_id=item["id"], output_index=at,
                    name=item["name"], arguments=item["arguments"])
        yield event("response.output_item.done", output_index=at, item=item)
        output.append(item)
    done = response_object(rid, req, model, created, output=output, c=c)
    yield event("response.incomplete" if done["status"] == "incomplete" else "response.completed", response=done)
