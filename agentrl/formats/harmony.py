"""gpt-oss Harmony calls: ``to=functions.NAME<|channel|>commentary json<|message|>{...}<|call|>``.

The recipient (``to=functions.NAME``) may stand before or after the ``<|channel|>`` header;
the body is the JSON argument object, ended by ``<|call|>`` (the stop token of a call turn).
"""

from __future__ import annotations

import json
import re

from agentrl.formats.base import ParsedTurn, ToolCallFormat, ToolSchemas, json_arguments
from agentrl.types import ToolCall

# One message: optional <|start|>assistant, a header without <|message|>, then the body.
_CALL_RE = re.compile(
    r"(?:<\|start\|>assistant)?(?P<head>(?:(?!<\|message\|>|<\|start\|>).)*?to=functions\.(?P<name>[^\s<]+)"
    r"(?:(?!<\|message\|>|<\|start\|>).)*)<\|message\|>(?P<body>.*?)(?:<\|call\|>|<\|end\|>|\Z)", re.DOTALL)


def parse_harmony(text: str, tools: ToolSchemas = None) -> ParsedTurn:
    """Harmony ``to=functions.NAME`` messages, any number per turn.

    >>> parse_harmony('<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"x": 1}<|call|>').tool_calls
    [ToolCall(name='f', arguments={'x': 1}, id=None)]
    """
    calls: list[ToolCall] = []
    errors: list[str] = []
    for n, m in enumerate(_CALL_RE.finditer(text), start=1):
        where = f"tool call {n} (to=functions.{m.group('name')})"
        try:
            args = json.loads(m.group("body")) if m.group("body").strip() else {}
        except json.JSONDecodeError as e:
            errors.append(f"{where}: invalid JSON ({e.msg} at char {e.pos})")
            continue
        checked = json_arguments(args, where, errors)
        if checked is not None:
            calls.append(ToolCall(m.group("name"), checked))
    return ParsedTurn(_CALL_RE.sub("", text).strip(), calls, errors)


FORMAT = ToolCallFormat(
    name="harmony", parse=parse_harmony, stop_tokens=("<|call|>",), families="gpt-oss",
    description="<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{...}<|call|>")
