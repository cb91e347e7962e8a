"""Mistral calls: ``[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}]`` (v3 to v7
tokenizers), or ``[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...}`` per call (v11 and later)."""

from __future__ import annotations

import json
import re

from agentrl.chat.formats.base import ParsedTurn, ToolCallFormat, ToolSchemas, add_json_call, json_arguments
from agentrl.types import ToolCall

_TAG = "[TOOL_CALLS]"
_NAMED_RE = re.compile(r"\A([^\s\[\]{]+)(?:\[CALL_ID\]([^\[]*))?\[ARGS\]", re.DOTALL)


def parse_mistral(text: str, tools: ToolSchemas = None) -> ParsedTurn:
    """Everything after the first ``[TOOL_CALLS]`` is calls; the text before it is the content.

    >>> parse_mistral('[TOOL_CALLS][{"name": "f", "arguments": {"x": 1}, "id": "abcdefghi"}]').tool_calls
    [ToolCall(name='f', arguments={'x': 1}, id='abcdefghi')]
    >>> parse_mistral('[TOOL_CALLS]f[ARGS]{"x": 1}').tool_calls
    [ToolCall(name='f', arguments={'x': 1}, id=None)]
    """
    if _TAG not in text:
        return ParsedTurn(text.strip())
    content, _, body = text.partition(_TAG)
    calls: list[ToolCall] = []
    errors: list[str] = []
    decoder = json.JSONDecoder()
    for n, chunk in enumerate(body.split(_TAG), start=1):
        where = f"tool call block {n}"
        chunk = chunk.strip()
        named = _NAMED_RE.match(chunk)
        try:
            if named:
                args, end = decoder.raw_decode(chunk, named.end())
                checked = json_arguments(args, where, errors)
                if checked is not None:
                    calls.append(ToolCall(named.group(1), checked, id=named.group(2) or None))
            else:
                obj, end = decoder.raw_decode(chunk)
                for k, item in enumerate(obj if isinstance(obj, list) else [obj], start=1):
                    add_json_call(item, f"{where}, call {k}", calls, errors)
        except json.JSONDecodeError as e:
            errors.append(f"{where}: invalid JSON ({e.msg} at char {e.pos})")
            continue
        if chunk[end:].strip():
            errors.append(f"{where}: text after the calls: {chunk[end:end + 30]!r}")
    return ParsedTurn(content.strip(), calls, errors)


FORMAT = ToolCallFormat(
    name="mistral", parse=parse_mistral, families="Mistral, Mistral-Nemo, Ministral",
    description='[TOOL_CALLS][{"name": NAME, "arguments": {...}, "id": ID}] or [TOOL_CALLS]NAME[ARGS]{...}',
    call_openings=(
        '[TOOL_CALLS][{"name": "{name}", "arguments": ',
        '[TOOL_CALLS] [{"name": "{name}", "arguments": ',
        '[TOOL_CALLS]{name}[ARGS]',
    ))
