"""The OpenAI Chat Completions wire format: a request body checked into a typed request, and
the response and error bodies.

Streaming (``stream=true``) sends the content as it is sampled (``streaming.py``). Only what a token-exact trainer can honour is accepted; everything else is refused with an
OpenAI-style 400 that names the parameter (``{"error": {"message", "type", "param", "code"}}``),
never ignored silently.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentrl.types import Message, ToolCall

if TYPE_CHECKING:
    from agentrl.engines.grammar import Grammar

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
    tool_choice: str  # "auto", "none", "required" (a call is forced) or "function" (a call of tool_name is forced)
    temperature: float | None  # None: the attempt's default (the run's rollout.temperature)
    top_p: float | None
    max_tokens: int | None  # None: as many as the attempt's budget allows
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    logprobs: bool = False
    stream: bool = False  # answer as server-sent events, live (streaming.py), then [DONE]
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage
    tool_name: str | None = None  # the function a named tool_choice forces
    grammar: Grammar | None = None  # response_format / text.format: constrained decoding (structured.py)
    grammar_param: str = "response_format"  # the field it came from, named by refusals


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


# Every Chat Completions request field, by what the endpoint does with it (docs/openai_agents.md
# has the table; tests/test_openai_fields.py walks it). READ: parse_request reads it (some
# values of some of them are refused below); IGNORED: accepted and without effect, since it
# changes nothing that is sampled; REFUSED: a 400 whatever its value, with the reason. A field
# in none of them is refused too: nothing is ignored silently.
READ = ("messages", "model", "tools", "tool_choice", "temperature", "top_p", "max_tokens", "max_completion_tokens",
        "stop", "seed", "n", "logprobs", "top_logprobs", "stream", "stream_options", "frequency_penalty",
        "presence_penalty", "logit_bias", "response_format", "parallel_tool_calls", "modalities")
IGNORED = {
    "metadata": "stored-completion tags: nothing is stored", "store": "nothing is stored",
    "user": "an end-user id", "safety_identifier": "an end-user id", "service_tier": "a processing tier",
    "prompt_cache_key": "prompt caching", "prompt_cache_options": "prompt caching",
    "prompt_cache_retention": "prompt caching",
    "prediction": "a latency hint: the completion is the one sampled without it",
}
_DISTRIBUTION = ("it changes the distribution tokens are sampled from, so the log-probs recorded for training would "
                 "not be those of the policy being trained")
REFUSED = {
    "audio": "the endpoint writes text only", "functions": "deprecated: send tools",
    "function_call": "deprecated: send tool_choice",
    "reasoning_effort": "the chat template is rendered as in training, without a reasoning setting",
    "verbosity": "the chat template is rendered as in training, without a verbosity setting",
    "web_search_options": "there is no web search", "moderation": "no moderation runs here",
}


def refuse_unread(body: dict, read, ignored, refused: dict[str, str], api: str) -> None:
    """A 400 for the first field of ``body`` that is neither read nor ignored: the reason
    ``refused`` gives, or that ``api`` has no such parameter here (nothing is silently dropped)."""
    for name, value in body.items():
        if value is None or name in read or name in ignored:
            continue
        if name in refused:
            raise RequestError(f"{name} is not supported: {refused[name]}", name)
        raise RequestError(f"{name} is not a {api} parameter this endpoint honours; it is refused "
                           f"rather than ignored (docs/openai_agents.md lists every field)", name)


def _refuse_fields(body: dict) -> None:
    """Refuse the fields (and the values of read fields) the endpoint cannot honour exactly."""
    refuse_unread(body, READ, IGNORED, REFUSED, "Chat Completions")
    for name in ("frequency_penalty", "presence_penalty"):
        v = body.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise RequestError(f"{name} must be a number, got {type(v).__name__}", name)
        if v:
            raise RequestError(f"{name}={v} is not supported (only 0): {_DISTRIBUTION}", name)
    bias = body.get("logit_bias")
    if bias is not None and not isinstance(bias, dict):
        raise RequestError("logit_bias must be an object", "logit_bias")
    if bias:
        raise RequestError(f"logit_bias is not supported (only {{}}): {_DISTRIBUTION}", "logit_bias")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and parallel is not True:
        raise RequestError(f"parallel_tool_calls={json.dumps(parallel)} is not supported (only true): the model may "
                           f"write several calls in one turn, and dropping some would hand back a turn that is not "
                           f"the one sampled and trained on", "parallel_tool_calls")
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise RequestError(f"modalities={modalities!r} is not supported (only ['text'])", "modalities")


def parse_tool_choice(raw: Any, tools: list[dict[str, Any]] | None) -> tuple[str, str | None]:
    """("auto" | "none" | "required" | "function", the named function or None). A forced call
    (required, or a named function) needs tools, and a named one must be among them.

    >>> parse_tool_choice({"type": "function", "function": {"name": "f"}}, [{"function": {"name": "f"}}])
    ('function', 'f')
    """
    if raw is None or raw in ("auto", "none"):
        return raw or "auto", None
    names = [t["function"]["name"] for t in tools or []]
    if raw == "required":
        if not names:
            raise RequestError("tool_choice='required' needs tools: no function was offered", "tool_choice")
        return "required", None
    fn = raw.get("function") if isinstance(raw, dict) and raw.get("type") == "function" else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise RequestError(f"tool_choice={raw!r} is not one of 'auto', 'none', 'required' or "
                           f"{{'type': 'function', 'function': {{'name': ...}}}}", "tool_choice")
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", fn["name"]):
        raise RequestError(f"tool_choice names {fn['name']!r}: a function name is 1 to 64 letters, digits, "
                           f"'_', '.' or '-'", "tool_choice")
    if fn["name"] not in names:
        raise RequestError(f"tool_choice names the function {fn['name']!r}, which is not among the tools offered "
                           f"({', '.join(names) or 'none'})", "tool_choice")
    return "function", fn["name"]


def parse_request(body: Any, *, max_tokens_limit: int) -> ChatRequest:
    """Check a decoded JSON body; raises RequestError naming the first problem."""
    from agentrl.serve.structured import read_response_format  # it reads RequestError from here

    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    _refuse_fields(body)
    grammar = read_response_format(body.get("response_format"))
    stream = body.get("stream")
    stream = False if stream is None else stream
    if not isinstance(stream, bool):
        raise RequestError("stream must be true or false", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise RequestError("stream_options must be an object", "stream_options")
    n = body.get("n")
    if n is not None and (n != 1 or isinstance(n, bool)):
        raise RequestError(f"n={n!r}: only n=1 is supported (send one request per sample)", "n")
    if body.get("top_logprobs"):
        raise RequestError("top_logprobs is not supported: logprobs=true gives each sampled token's log-prob",
                           "top_logprobs")
    tools = parse_tools(body.get("tools"))
    choice, tool_name = parse_tool_choice(body.get("tool_choice"), tools)
    limit_name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    limit = body.get(limit_name)
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise RequestError(f"{limit_name}={limit!r} must be a positive integer", limit_name)
        if limit > max_tokens_limit:
            raise RequestError(f"{limit_name}={limit} is over this endpoint's context of {max_tokens_limit} tokens",
                               limit_name)
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else (stop or [])
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise RequestError("stop must be a non-empty string or a list of at most 4 of them", "stop")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise RequestError("seed must be an integer", "seed")
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise RequestError("logprobs must be true or false", "logprobs")
    model = body.get("model") or ""
    if not isinstance(model, str):
        raise RequestError("model must be a string", "model")
    return ChatRequest(
        model=model, messages=parse_messages(body.get("messages")), tools=tools,
        tool_choice=choice, tool_name=tool_name, temperature=_number(body, "temperature", None, 0.0, 2.0),
        top_p=_number(body, "top_p", None, 0.0, 1.0, lo_open=True), max_tokens=limit, stop=list(stop),
        seed=seed, logprobs=bool(logprobs), stream=stream,
        include_usage=bool(options.get("include_usage", False)), grammar=grammar)


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


def chunk_head(model: str) -> dict[str, Any]:
    """The fields every ``chat.completion.chunk`` of one streamed completion shares."""
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": model}


def chunk(head: dict[str, Any], delta: dict[str, Any], finish: str | None = None, logprobs=None) -> dict[str, Any]:
    return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}]}


def completion_tail(c: Completion, head: dict[str, Any], rest: str, want_logprobs: bool,
                    include_usage: bool) -> list[dict[str, Any]]:
    """The chunks that end a streamed completion, in the order OpenAI sends them: the content
    not sent yet (``rest``; with the per-token log-probs when asked for), the tool calls (each
    whole, with its index), the finish reason with the sampled ``token_ids``, and the usage
    when asked for."""
    out = []
    if rest or (want_logprobs and c.token_ids):
        out.append(chunk(head, {"content": rest}, logprobs=_logprobs_body(c) if want_logprobs else None))
    if c.message.tool_calls:
        out.append(chunk(head, {"tool_calls": [
            {"index": i, "id": call.id, "type": "function",
             "function": {"name": call.name, "arguments": json.dumps(call.arguments)}}
            for i, call in enumerate(c.message.tool_calls)]}))
    end = chunk(head, {}, c.finish_reason)
    end["choices"][0]["token_ids"] = c.token_ids
    out.append(end)
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
