"""The OpenAI Responses wire format (``POST /v1/responses``): a request body checked into the
same messages and tools a Chat Completions request has, so that it goes through the same
capture (``service.py``); the response bodies and stream events are in ``response_body.py``.

``input`` is a string (one user message) or items: messages (``user``, ``system``,
``developer``, ``assistant`` with text parts), ``function_call`` items (joined to the
assistant message before them, as the turn the endpoint returned) and
``function_call_output`` items (tool messages answering a ``call_id``). ``instructions`` is a
leading system message. As for Chat Completions, only what a token-exact trainer can honour
is accepted; everything else is refused with a 400 naming the field.

>>> req = parse_responses_request({"input": "2+3?", "instructions": "Be brief.", "max_output_tokens": 8},
...                               max_tokens_limit=512)
>>> [(m.role, m.content) for m in req.input], req.instructions, req.chat.max_tokens
([('user', '2+3?')], 'Be brief.', 8)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from agentrl.serve.protocol import ChatRequest, RequestError, _number, parse_tool_choice, refuse_unread
from agentrl.types import Message, ToolCall

# Every Responses request field, by what the endpoint does with it (docs/openai_agents.md,
# "Responses request fields"; tests/test_openai_fields.py walks it), as for Chat Completions.
READ = ("input", "model", "instructions", "tools", "tool_choice", "parallel_tool_calls", "temperature", "top_p",
        "max_output_tokens", "stream", "stream_options", "store", "previous_response_id", "metadata", "include",
        "text", "reasoning", "truncation", "background", "top_logprobs")
IGNORED = {
    "user": "an end-user id", "safety_identifier": "an end-user id", "service_tier": "a processing tier",
    "prompt_cache_key": "prompt caching", "prompt_cache_options": "prompt caching",
    "prompt_cache_retention": "prompt caching",
}
REFUSED = {
    "conversation": "conversations are not stored here: send previous_response_id, or the whole input",
    "prompt": "there are no stored prompt templates here: send instructions and input",
    "context_management": "server-side compaction would rewrite the conversation the model was trained on",
    "max_tool_calls": "there are no built-in tools here (function calls are the agent's to run)",
    "background_options": "background responses are not served", "moderation": "no moderation runs here",
    "image": "the endpoint reads text only", "access_programs": "there are no access programs here",
}
BUILTIN_TOOLS = ("web_search", "web_search_preview", "file_search", "computer_use", "computer_use_preview",
                 "code_interpreter", "image_generation", "mcp", "local_shell", "shell", "apply_patch", "custom")
LOGPROBS_INCLUDE = "message.output_text.logprobs"
TEXT_PARTS = ("input_text", "output_text", "text")


@dataclass
class ResponsesRequest:
    """One checked ``/v1/responses`` request."""

    chat: ChatRequest  # the sampling fields; its messages are the input only (the service prepends the rest)
    input: list[Message]
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    metadata: dict[str, str] = field(default_factory=dict)
    tools: list[dict[str, Any]] = field(default_factory=list)  # as sent (echoed in the response)
    tool_choice: str | dict[str, Any] = "auto"  # as sent
    text_format: dict[str, Any] = field(default_factory=lambda: {"type": "text"})  # text.format as sent (echoed)


def _text(value: Any, where: str) -> str:
    """A message's or an output's content: a string or a list of text parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        out = []
        for j, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") not in TEXT_PARTS or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise RequestError(f"{where}[{j}]: a content part of type {kind!r} is not supported (only text: "
                                   f"{', '.join(TEXT_PARTS)})", f"{where}[{j}]")
            out.append(part["text"])
        return "".join(out)
    raise RequestError(f"{where} must be a string or a list of text parts", where)


def _call(item: dict, where: str) -> ToolCall:
    name, call_id, args = item.get("name"), item.get("call_id"), item.get("arguments", "{}")
    if not isinstance(name, str) or not isinstance(call_id, str):
        raise RequestError(f"{where}: a function_call item needs name and call_id", where)
    try:
        parsed = json.loads(args) if isinstance(args, str) and args.strip() else {}
    except json.JSONDecodeError:
        raise RequestError(f"{where}.arguments is not valid JSON", f"{where}.arguments") from None
    if not isinstance(parsed, dict):
        raise RequestError(f"{where}.arguments must be a JSON object", f"{where}.arguments")
    return ToolCall(name, parsed, call_id)


def parse_input(raw: Any) -> list[Message]:
    """``input`` as messages. A ``function_call`` item joins the assistant message just
    before it (the turn the endpoint returned was that message and its calls), or starts one."""
    if isinstance(raw, str):
        return [Message("user", raw)]
    if not isinstance(raw, list) or not raw:
        raise RequestError("input must be a string or a non-empty list of items", "input")
    out: list[Message] = []
    joinable = False  # the last message is an assistant turn a function_call may join
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise RequestError(f"{where} must be an object", where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise RequestError(f"{where}.role={role!r} is not one of user, system, developer, assistant",
                                   f"{where}.role")
            out.append(Message("system" if role == "developer" else role, _text(item.get("content"), f"{where}.content")))
            joinable = role == "assistant"
        elif kind == "function_call":
            call = _call(item, where)
            if joinable:
                out[-1] = Message("assistant", out[-1].content, [*out[-1].tool_calls, call])
            else:
                out.append(Message("assistant", "", [call]))
            joinable = True
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise RequestError(f"{where}: a function_call_output item needs call_id", f"{where}.call_id")
            out.append(Message("tool", _text(item.get("output"), f"{where}.output"), tool_call_id=item["call_id"]))
            joinable = False
        elif kind == "item_reference":
            raise RequestError(f"{where}: item_reference is not supported: send previous_response_id, or the item "
                               f"itself", f"{where}.type")
        elif kind == "reasoning":
            raise RequestError(f"{where}: reasoning items are not supported: this endpoint returns none, and the "
                               f"chat template renders the model's turns as sampled", f"{where}.type")
        else:
            raise RequestError(f"{where}: items of type {kind!r} are not supported (message, function_call, "
                               f"function_call_output)", f"{where}.type")
    return out


def parse_tools(raw: Any) -> tuple[list[dict[str, Any]] | None, list[dict[str, Any]]]:
    """(the tools as chat templates take them, or None; the tools as sent). Only function
    tools; ``strict`` is accepted and not enforced (only ``text.format`` is decoded under a
    constraint: the arguments are what the model wrote, parsed as for Chat Completions)."""
    if raw is None:
        return None, []
    if not isinstance(raw, list):
        raise RequestError("tools must be a list", "tools")
    out = []
    for i, t in enumerate(raw):
        kind = t.get("type") if isinstance(t, dict) else None
        if kind in BUILTIN_TOOLS or (isinstance(kind, str) and kind.startswith(("web_search", "computer_use"))):
            raise RequestError(f"tools[{i}]: the built-in tool {kind!r} is not available here: only function tools "
                               f"are served (run it in the agent and offer it as a function)", f"tools[{i}]")
        if kind != "function" or not isinstance(t.get("name"), str):
            raise RequestError(f"tools[{i}] must be {{'type': 'function', 'name': ..., 'parameters': {{...}}}}",
                               f"tools[{i}]")
        out.append({"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")
                                                      if t.get(k) is not None}})
    return out or None, list(raw)


def parse_choice(raw: Any, tools: list[dict[str, Any]] | None) -> tuple[str, str | None]:
    """Responses' ``tool_choice`` ("auto", "none", "required", or ``{"type": "function",
    "name": ...}``) as ``protocol.parse_tool_choice`` reads it."""
    if raw is None or isinstance(raw, str):
        if raw not in (None, "auto", "none", "required"):
            raise RequestError(f"tool_choice={raw!r} is not one of 'auto', 'none', 'required' or "
                               f"{{'type': 'function', 'name': ...}}", "tool_choice")
        return parse_tool_choice(raw, tools)
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind == "function" and isinstance(raw.get("name"), str):
        return parse_tool_choice({"type": "function", "function": {"name": raw["name"]}}, tools)
    if kind == "allowed_tools":
        raise RequestError("tool_choice allowed_tools is not supported: offer only the tools the model may call",
                           "tool_choice")
    raise RequestError(f"tool_choice={raw!r} is not one of 'auto', 'none', 'required' or "
                       f"{{'type': 'function', 'name': ...}} (built-in tools are not available here)", "tool_choice")


def _refuse_fields(body: dict) -> None:
    refuse_unread(body, READ, IGNORED, REFUSED, "Responses")
    checks = [
        ("parallel_tool_calls", lambda v: v is True, "only true: the model may write several calls in one turn, and "
         "dropping some would hand back a turn that is not the one sampled and trained on"),
        ("background", lambda v: v is False, "only false: responses are served while the client waits"),
        ("truncation", lambda v: v == "disabled", "only 'disabled': dropping input would change the conversation "
         "the model is trained on; a conversation over the context gets a 400"),
        ("top_logprobs", lambda v: v == 0, f"only 0: include {LOGPROBS_INCLUDE!r} gives each sampled token's "
         f"log-prob"),
        ("reasoning", lambda v: isinstance(v, dict) and v.get("effort") in (None, "none")
         and all(x is None for k, x in v.items() if k != "effort"),
         "only {} or {'effort': 'none'}: the chat template is rendered as in training, without a reasoning setting, and the model's "
         "turns have no reasoning summaries"),
        ("text", lambda v: isinstance(v, dict) and v.get("verbosity") is None and set(v) <= {"format", "verbosity"},
         "only {'format': ...}: a format of type text, json_object or json_schema (structured output); the chat "
         "template has no verbosity setting (the OpenAI Agents SDK asks for verbosity 'low' for its default gpt-5 "
         "models: give the Agent a model name of your own, e.g. model='agentrl')"),
        ("include", lambda v: isinstance(v, list) and set(v) <= {LOGPROBS_INCLUDE},
         f"only {LOGPROBS_INCLUDE!r}: there are no built-in tools, images or reasoning to include"),
        ("metadata", lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
         "an object of strings"),
        ("store", lambda v: isinstance(v, bool), "true or false"),
        ("stream", lambda v: isinstance(v, bool), "true or false"),
        ("stream_options", lambda v: isinstance(v, dict) and set(v) <= {"include_obfuscation"}, "an object with "
         "include_obfuscation (no padding is added either way)"),
        ("instructions", lambda v: isinstance(v, str), "a string"),
        ("previous_response_id", lambda v: isinstance(v, str), "a string"),
        ("model", lambda v: isinstance(v, str), "a string"),
    ]
    for name, ok, need in checks:
        value = body.get(name)
        if value is not None and not ok(value):
            raise RequestError(f"{name}={json.dumps(value)} is not supported ({need})", name)


def parse_responses_request(body: Any, *, max_tokens_limit: int) -> ResponsesRequest:
    """Check a decoded JSON body; raises RequestError naming the first problem."""
    from agentrl.serve.structured import read_text_format  # it reads RequestError from protocol

    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    _refuse_fields(body)
    grammar = read_text_format((body.get("text") or {}).get("format"))
    tools, sent_tools = parse_tools(body.get("tools"))
    choice, tool_name = parse_choice(body.get("tool_choice"), tools)
    limit = body.get("max_output_tokens")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise RequestError(f"max_output_tokens={limit!r} must be a positive integer", "max_output_tokens")
        if limit > max_tokens_limit:
            raise RequestError(f"max_output_tokens={limit} is over this endpoint's context of {max_tokens_limit} "
                               f"tokens", "max_output_tokens")
    messages = parse_input(body.get("input"))
    chat = ChatRequest(
        model=body.get("model") or "", messages=messages, tools=tools, tool_choice=choice, tool_name=tool_name,
        temperature=_number(body, "temperature", None, 0.0, 2.0),
        top_p=_number(body, "top_p", None, 0.0, 1.0, lo_open=True), max_tokens=limit,
        logprobs=LOGPROBS_INCLUDE in (body.get("include") or []), stream=bool(body.get("stream")),
        grammar=grammar, grammar_param="text.format")
    store = body.get("store")
    return ResponsesRequest(chat=chat, input=messages, instructions=body.get("instructions"),
                            previous_response_id=body.get("previous_response_id"),
                            store=True if store is None else store, metadata=dict(body.get("metadata") or {}),
                            tools=sent_tools, tool_choice=body.get("tool_choice") or "auto",
                            text_format=(body.get("text") or {}).get("format") or {"type": "text"})
