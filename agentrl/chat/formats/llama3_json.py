"""Llama 3.1 / 3.2 JSON calls: the whole turn is ``{"name": ..., "parameters": {...}}``."""

from __future__ import annotations

import json

from agentrl.chat.formats.base import ParsedTurn, ToolCallFormat, ToolSchemas, add_json_call
from agentrl.types import ToolCall


def parse_llama3_json(text: str, tools: ToolSchemas = None) -> ParsedTurn:
    """Llama 3.x JSON calls: ``{"name": ..., "parameters": {...}}`` as the whole turn, optionally
    after ``<|python_tag|>``; several objects may be separated by ``;``.

    >>> parse_llama3_json('{"name": "f", "parameters": {"x": 1}}').tool_calls[0].name
    'f'
    """
    if "<|python_tag|>" in text:
        content, body = text.split("<|python_tag|>", 1)
    elif text.lstrip().startswith("{"):
        content, body = "", text
    else:
        return ParsedTurn(text.strip())
    calls: list[ToolCall] = []
    errors: list[str] = []
    decoder = json.JSONDecoder()
    pos, n = 0, 0
    while True:
        while pos < len(body) and (body[pos].isspace() or body[pos] == ";"):
            pos += 1
        if pos == len(body):
            break
        n += 1
        try:
            obj, pos = decoder.raw_decode(body, pos)
        except json.JSONDecodeError as e:
            errors.append(f"tool call {n}: invalid JSON ({e.msg} at char {e.pos})")
            break
        add_json_call(obj, f"tool call {n}", calls, errors)
    return ParsedTurn(content.strip(), calls, errors)


# Custom (JSON) tool calls end with <|eot_id|>, the turn end; <|eom_id|> follows only the
# built-in tools' <|python_tag|> code calls, which this format does not run.
FORMAT = ToolCallFormat(
    name="llama3_json", parse=parse_llama3_json, families="Llama 3.1, Llama 3.2",
    description='{"name": NAME, "parameters": {...}} as the whole turn (optionally after <|python_tag|>)',
    call_openings=('{"name": "{name}", "parameters": ', '{"name": "{name}", "arguments": '))
