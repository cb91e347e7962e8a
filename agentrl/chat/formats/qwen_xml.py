"""Qwen3.5+ / Qwen3-Coder / Nemotron 3 XML calls::

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    </function>
    </tool_call>

Strings are written bare, everything else as JSON, so a value's type comes from the tool's
schema when the caller passes the tools (see ``typed_value``).
"""

from __future__ import annotations

import re

from agentrl.chat.formats.base import ParsedTurn, ToolCallFormat, ToolSchemas, parameter_schemas, typed_value
from agentrl.types import ToolCall

_BLOCK_RE = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)\Z", re.DOTALL)
_FUNCTION_RE = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*\Z", re.DOTALL)
_PARAM_RE = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


def parse_qwen_xml(text: str, tools: ToolSchemas = None) -> ParsedTurn:
    """Calls in the ``<function=NAME><parameter=KEY>`` XML syntax, any number per turn.

    >>> text = '<tool_call>\\n<function=f>\\n<parameter=q>\\nhi there\\n</parameter>\\n</function>\\n</tool_call>'
    >>> parse_qwen_xml(text).tool_calls
    [ToolCall(name='f', arguments={'q': 'hi there'}, id=None)]
    """
    calls: list[ToolCall] = []
    errors: list[str] = []
    for n, m in enumerate(_BLOCK_RE.finditer(text), start=1):
        body = m.group(1) if m.group(1) is not None else m.group(2)
        where = f"tool call {n}" + ("" if m.group(1) is not None else " (unclosed <tool_call>)")
        fn = _FUNCTION_RE.match(body)
        if fn is None:
            errors.append(f"{where}: expected <function=NAME>...</function> inside <tool_call>")
            continue
        name, inner = fn.group(1).strip(), fn.group(2)
        schemas = parameter_schemas(tools, name)
        args = {}
        for p in _PARAM_RE.finditer(inner):
            # the template writes '\n' + value + '\n'; only those two newlines are syntax
            raw = p.group(2).removeprefix("\n").removesuffix("\n")
            args[p.group(1).strip()] = typed_value(raw, schemas.get(p.group(1).strip()))
        if _PARAM_RE.sub("", inner).strip():
            errors.append(f"{where}: text outside <parameter=...>...</parameter> in <function={name}>")
            continue
        calls.append(ToolCall(name, args))
    return ParsedTurn(_BLOCK_RE.sub("", text).strip(), calls, errors)


FORMAT = ToolCallFormat(
    name="qwen_xml", parse=parse_qwen_xml, families="Qwen3.5, Qwen3.6, Qwen3.8, Qwen3-Coder, Nemotron 3",
    description="<tool_call><function=NAME><parameter=KEY>VALUE</parameter></function></tool_call>",
    call_openings=('<tool_call>\n<function={name}>\n', '<tool_call><function={name}>'))
