"""Namespaced XML invoke calls (Muse Glimmer)::

    <atem:function_calls>
    <atem:invoke name="NAME">
    <atem:parameter name="KEY">VALUE</atem:parameter>
    </atem:invoke>
    </atem:function_calls>

Strings are written bare, everything else as JSON (types come from the tool schema when given).
"""

from __future__ import annotations

import re

from agentrl.chat.formats.base import ParsedTurn, ToolCallFormat, ToolSchemas, parameter_schemas, typed_value
from agentrl.types import ToolCall

_BLOCK_RE = re.compile(r"<atem:function_calls>(.*?)(?:</atem:function_calls>|\Z)", re.DOTALL)
_INVOKE_RE = re.compile(r'<atem:invoke name="([^"]+)">(.*?)</atem:invoke>', re.DOTALL)
_PARAM_RE = re.compile(r'<atem:parameter name="([^"]+)">(.*?)</atem:parameter>', re.DOTALL)


def parse_atem_xml(text: str, tools: ToolSchemas = None) -> ParsedTurn:
    """``<atem:invoke name=...>`` elements inside ``<atem:function_calls>``.

    >>> parse_atem_xml('<atem:function_calls><atem:invoke name="f"><atem:parameter name="q">hi</atem:parameter>'
    ...                '</atem:invoke></atem:function_calls>').tool_calls
    [ToolCall(name='f', arguments={'q': 'hi'}, id=None)]
    """
    calls: list[ToolCall] = []
    errors: list[str] = []
    n = 0
    for block in _BLOCK_RE.findall(text):
        if _INVOKE_RE.sub("", block).strip():
            errors.append(f"tool call block: text outside <atem:invoke> elements: {_INVOKE_RE.sub('', block).strip()[:40]!r}")
        for name, inner in _INVOKE_RE.findall(block):
            n += 1
            if _PARAM_RE.sub("", inner).strip():
                errors.append(f"tool call {n}: text outside <atem:parameter> elements in <atem:invoke name={name!r}>")
                continue
            schemas = parameter_schemas(tools, name)
            calls.append(ToolCall(name, {k: typed_value(v, schemas.get(k)) for k, v in _PARAM_RE.findall(inner)}))
    return ParsedTurn(_BLOCK_RE.sub("", text).strip(), calls, errors)


FORMAT = ToolCallFormat(
    name="atem_xml", parse=parse_atem_xml, families="Muse Glimmer",
    description='<atem:function_calls><atem:invoke name="NAME"><atem:parameter name="KEY">VALUE</atem:parameter>...',
    call_openings=(
        '<atem:function_calls>\n<atem:invoke name="{name}">\n',
        '<atem:function_calls><atem:invoke name="{name}">',
    ))
