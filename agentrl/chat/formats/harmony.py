"""gpt-oss Harmony calls: ``to=functions.NAME<|channel|>commentary json<|message|>{...}<|call|>``.

The recipient (``to=functions.NAME``) may stand before or after the ``<|channel|>`` header;
the body is the JSON argument object, ended by ``<|call|>`` (the stop token of a call turn).
"""

from __future__ import annotations

import json
import re

from agentrl.chat.formats.base import ParsedTurn, ToolCallFormat, ToolSchemas, json_arguments
from agentrl.types import ToolCall

# One message: optional <|start|>assistant, a header without <|message|>, then the body.
_CALL_RE = re.compile(
    r"(?:<\|start\|>assistant)?(?P<head>(?:(?!<\|message\|>|<\|start\|>).)*?to=functions\.(?P<name>[^\s<]+)"
    r"(?:(?!<\|message\|>|<\|start\|>).)*)<\|message\|>(?P<body>.*?)(?:<\|call\|>|<\|end\|>|\Z)", re.DOTALL)


def parse_harmony(text: str, tools: ToolSchemas = None) -> ParsedTurn:
    """Harmony ``to=functions.NAME`` messages, any number per turn.

    >>> parse_harmony('<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"x": 1}<|call|>').tool_calls
    [ToolCall(name='f', arguments={'x': 1}, id=None)]
    >>> parse_harmony('<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>5').content
    '5'
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
    return ParsedTurn(_content(_CALL_RE.sub("", text)), calls, errors)


# A message that is not a call: ``<|channel|>final<|message|>text``, ``analysis`` likewise.
_MESSAGE_RE = re.compile(r"(?:<\|start\|>assistant)?<\|channel\|>(?P<channel>\w+)[^<]*<\|message\|>(?P<body>.*?)"
                         r"(?:<\|end\|>|<\|return\|>|(?=<\|start\|>)|\Z)", re.DOTALL)


def _content(text: str) -> str:
    """The turn's visible content: the ``final`` channel's text (the template renders it back
    under that header, and refuses channel tags in content); the ``analysis`` channel is
    reasoning, kept in the sampled tokens but not in the message."""
    messages = [(m.group("channel"), m.group("body")) for m in _MESSAGE_RE.finditer(text)]
    if not messages:
        return text.strip()
    final = [body for channel, body in messages if channel == "final"]
    if final:
        return final[-1].strip()
    return "".join(body for channel, body in messages if channel != "analysis").strip()


FORMAT = ToolCallFormat(
    name="harmony", parse=parse_harmony, stop_tokens=("<|call|>",), families="gpt-oss",
    description="<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{...}<|call|>",
    call_openings=(
        ' to=functions.{name}<|channel|>commentary json<|message|>',
        '<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>',
    ))
