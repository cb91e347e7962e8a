"""Hermes / Qwen2.5 / Qwen3 JSON calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``."""

from __future__ import annotations

import json
import re

from agentrl.chat.formats.base import ParsedTurn, ToolCallFormat, ToolSchemas, add_json_call
from agentrl.types import ToolCall

_HERMES_RE = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)\Z", re.DOTALL)


def parse_hermes(text: str, tools: ToolSchemas = None) -> ParsedTurn:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, any number per turn.
    A final unclosed block is accepted when its JSON is complete (as vLLM's hermes parser does).

    >>> parse_hermes('Hi <tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>').tool_calls
    [ToolCall(name='f', arguments={'x': 1}, id=None)]
    """
    calls: list[ToolCall] = []
    errors: list[str] = []
    for n, m in enumerate(_HERMES_RE.finditer(text), start=1):
        body = m.group(1) if m.group(1) is not None else m.group(2)
        where = f"tool call {n}" + ("" if m.group(1) is not None else " (unclosed <tool_call>)")
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as e:
            errors.append(f"{where}: invalid JSON ({e.msg} at char {e.pos})")
            continue
        add_json_call(obj, where, calls, errors)
    return ParsedTurn(_HERMES_RE.sub("", text).strip(), calls, errors)


FORMAT = ToolCallFormat(
    name="hermes", parse=parse_hermes, families="Qwen2.5, Qwen3, Qwen3-2507, Qwen3-VL, Hermes",
    description='<tool_call>{"name": NAME, "arguments": {...}}</tool_call>',
    call_openings=('<tool_call>\n{"name": "{name}", "arguments": ', '<tool_call>{"name": "{name}", "arguments": '))
