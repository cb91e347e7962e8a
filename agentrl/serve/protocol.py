"""The OpenAI Chat Completions wire format: a request body checked into a typed request, and
the response and error bodies.

Streaming (``stream=true``) answers with the same completion as server-sent events once it is
generated. Only what a token-exact trainer can honour is accepted; everything else is refused with an
OpenAI-style 400 that names the parameter (``{"error": {"message", "type", "param", "code"}}``),
never ignored silently.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from agentrl.types import Message, ToolCall

ROLES = ("system", "developer", "user", "assistant", "tool")


class RequestError(Exception):
    """A request the endpoint refuses: becomes an OpenAI-style error body with ``status``."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 code: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.status, self.code, self.kind = message, param, status, code, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass
class ChatRequest:
    """One checked ``/v1/chat/completions`` request."""

    model: str
    messages: list[Message]
    tools: list[dict[str, Any]] | None  # OpenAI function tools, as chat templates take them
    tool_choice: str  # "auto" or "none"
    temperature: float | None  # None: the attempt's default (the run's rollout.temperature)
    top_p: float | None
    max_tokens: int | None  # None: as many as the attempt's budget allows
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    logprobs: bool = False
    stream: bool = False  # answer as server-sent events (the whole completion, then [DONE])
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage


def _number(body: dict, name: str, default: float | None, lo: float, hi: float, *,
            lo_open: bool = False) -> float | None:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise RequestError(f"{name} must be a number, got {type(v).__name__}", name)
    if v > hi or v < lo or (lo_open and v == lo):
        raise RequestError(f"{name}={v} is out of range: need {lo} {'<' if lo_open else '<='} {name} <= {hi}", name)
    return float(v)


def _content(value: Any, where: str) -> str:
    """A message's content: a string, null, or a list of text parts."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(f"{where}: only text content parts are supported", where)
            texts.append(part["text"])
        return "".join(texts)
    raise RequestError(f"{where} must be a string or a list of text parts", where)


def _tool_calls(value: Any, where: str) -> list[ToolCall]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise RequestError(f"{where} must be a list", where)
    out = []
    for j, c in enumerate(value):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RequestError(f"{where}[{j}] needs function.name", f"{where}[{j}]")
        args = fn.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError:
                raise RequestError(f"{where}[{j}].function.arguments is not valid JSON", f"{where}[{j}]") from None
        if not isinstance(args, dict):
            raise RequestError(f"{where}[{j}].function.arguments must be a JSON object", f"{where}[{j}]")
        out.append(ToolCall(fn["name"], args, c.get("id")))
    return out


def parse_messages(raw: Any) -> list[Message]:
    if not isinstance(raw, list) or not raw:
        raise RequestError("messages must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise RequestError(f"{where} must be an object", where)
        role = m.get("role")
        if role not in ROLES:
            raise RequestError(f"{where}.role={role!r} is not one of {', '.join(ROLES)}", f"{where}.role")
        role = "system" if role == "developer" else role
        content = _content(m.get("content"), f"{where}.content")
        calls = _tool_calls(m.get("tool_calls"), f"{where}.tool_calls") if role == "assistant" else []
        call_id = m.get("tool_call_id")
        if role == "tool" and not isinstance(call_id, str):
            raise RequestError(f"{where}: a tool message needs tool_call_id", f"{where}.tool_call_id")
        name = m.get("name") if isinstance(m.get("name"), str) else None
        out.append(Message(role, content, calls, call_id if role == "tool" else None, name if role == "tool" else None))
    if out[-1].role == "assistant":
        raise RequestError("the last message is the assistant's: continuing an assistant message is not "
                           "supported (end with a user or tool message)", f"messages[{len(out) - 1}]")
    return out


def parse_tools(raw: Any) -> list[dict[str, Any]] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise RequestError("tools must be a list", "tools")
    out = []
    for i, t in enumerate(raw):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str):
            raise RequestError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}", f"tools[{i}]")
        out.append({"type": "function", "function": {k: fn[k] for k in ("name", "description", "parameters")
                                                      if k in fn}})
    return out or None


def parse_request(body: Any, *, max_tokens_limit: int) -> ChatRequest:
    """Check a decoded JSON body; raises RequestError naming the first problem."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError("stream must be true or false", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise RequestError("stream_options must be an object", "stream_options")
    n = body.get("n", 1)
    if n != 1:
        raise RequestError(f"n={n!r}: only n=1 is supported (send one request per sample)", "n")
    if body.get("top_logprobs"):
        raise RequestError("top_logprobs is not supported: logprobs=true gives each sampled token's log-prob",
                           "top_logprobs")
    choice = body.get("tool_choice", "auto")
    if choice is None:
        choice = "auto"
    if choice not in ("auto", "none"):
        raise RequestError(f"tool_choice={choice!r} is not supported: use 'auto' or 'none'", "tool_choice")
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise RequestError(f"max_tokens={limit!r} must be a positive integer", "max_tokens")
        if limit > max_tokens_limit:
            raise RequestError(f"max_tokens={limit} is over this endpoint's context of {max_tokens_limit} tokens",
                               "max_tokens")
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else (stop or [])
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise RequestError("stop must be a non-empty string or a list of at most 4 of them", "stop")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise RequestError("seed must be an integer", "seed")
    model = body.get("model", "")
    if not isinstance(model, str):
        raise RequestError("model must be a string", "model")
    return ChatRequest(
        model=model, messages=parse_messages(body.get("messages")), tools=parse_tools(body.get("tools")),
        tool_choice=choice, temperature=_number(body, "temperature", None, 0.0, 2.0),
        top_p=_number(body, "top_p", None, 0.0, 1.0, lo_open=True), max_tokens=limit, stop=list(stop),
        seed=seed, logprobs=bool(body.get("logprobs", False)), stream=stream,
        include_usage=bool(options.get("include_usage", False)))


@dataclass
class Completion:
    """What the engine produced for one request, ready to be written out."""

    message: Message  # the parsed assistant turn (tool calls carry the ids handed out)
    finish_reason: str  # "stop", "tool_calls" or "length"
    prompt_tokens: int
    token_ids: list[int]
    logprobs: list[float]
    token_texts: list[str] = field(default_factory=list)  # per sampled token, when logprobs were asked for


def _logprobs_body(c: Completion) -> dict[str, Any]:
    return {"content": [{"token": text, "logprob": lp, "bytes": list(text.encode()), "top_logprobs": []}
                        for text, lp in zip(c.token_texts, c.logprobs)]}


def completion_chunks(c: Completion, model: str, want_logprobs: bool, include_usage: bool) -> list[dict[str, Any]]:
    """The completion as ``chat.completion.chunk`` events, in the order OpenAI sends them: the
    role, the content, the tool calls (each whole, with its index), the finish reason, and the
    usage when asked for. Generation is not streamed token by token: the events follow it."""
    head = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": model}

    def chunk(delta: dict[str, Any], finish: str | None = None, logprobs=None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}]}

    out = [chunk({"role": "assistant", "content": ""})]
    if c.message.content:
        out.append(chunk({"content": c.message.content}, logprobs=_logprobs_body(c) if want_logprobs else None))
    if c.message.tool_calls:
        out.append(chunk({"tool_calls": [
            {"index": i, "id": call.id, "type": "function",
             "function": {"name": call.name, "arguments": json.dumps(call.arguments)}}
            for i, call in enumerate(c.message.tool_calls)]}))
    out.append(chunk({}, c.finish_reason))
    if include_usage:
        out.append({**head, "choices": [], "usage": _usage(c)})
    return out


def _usage(c: Completion) -> dict[str, int]:
    return {"prompt_tokens": c.prompt_tokens, "completion_tokens": len(c.token_ids),
            "total_tokens": c.prompt_tokens + len(c.token_ids)}


def completion_body(c: Completion, model: str, want_logprobs: bool) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": c.message.content or None}
    if c.message.tool_calls:
        msg["tool_calls"] = [{"id": call.id, "type": "function",
                              "function": {"name": call.name, "arguments": json.dumps(call.arguments)}}
                             for call in c.message.tool_calls]
    logprobs = _logprobs_body(c) if want_logprobs else None
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": msg, "finish_reason": c.finish_reason, "logprobs": logprobs,
                     "token_ids": c.token_ids}],
        "usage": _usage(c),
    }
