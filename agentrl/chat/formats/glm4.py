"""GLM-4.5 / GLM-4-MoE calls: ``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>``.

Strings are written bare and everything else as JSON (types come from the tool schema when
given); after a call turn the model writes ``<|observation|>`` and waits for the results.
"""

from __future__ import annotations

import re

from agentrl.chat.formats.base import ParsedTurn, ToolCallFormat, ToolSchemas, parameter_schemas, typed_value
from agentrl.types import ToolCall

_BLOCK_RE = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)\Z", re.DOTALL)
_PAIR_RE = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def parse_glm4(text: str, tools: ToolSchemas = None) -> ParsedTurn:
    """Calls in GLM-4's ``<arg_key>``/``<arg_value>`` syntax.

    >>> parse_glm4('<tool_call>f\\n<arg_key>n</arg_key>\\n<arg_value>[1, 2]</arg_value>\\n</tool_call>').tool_calls
    [ToolCall(name='f', arguments={'n': [1, 2]}, id=None)]
    """
    calls: list[ToolCall] = []
    errors: list[str] = []
    for n, m in enumerate(_BLOCK_RE.finditer(text), start=1):
        body = m.group(1) if m.group(1) is not None else m.group(2)
        where = f"tool call {n}" + ("" if m.group(1) is not None else " (unclosed <tool_call>)")
        first = body.find("<arg_key>")
        name = (body if first < 0 else body[:first]).strip()
        if not name or "\n" in name or "<" in name or "{" in name:
            errors.append(f"{where}: expected the function name right after <tool_call>")
            continue
        rest = "" if first < 0 else body[first:]
        if _PAIR_RE.sub("", rest).strip():
            errors.append(f"{where}: text outside <arg_key>...</arg_key><arg_value>...</arg_value> pairs")
            continue
        schemas = parameter_schemas(tools, name)
        args = {k.strip(): typed_value(v, schemas.get(k.strip())) for k, v in _PAIR_RE.findall(rest)}
        calls.append(ToolCall(name, args))
    return ParsedTurn(_BLOCK_RE.sub("", text).replace("<|observation|>", "").strip(), calls, errors)


FORMAT = ToolCallFormat(
    name="glm4", parse=parse_glm4, stop_tokens=("<|observation|>",), families="GLM-4.5, GLM-4-MoE",
    description="<tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value></tool_call>",
    call_openings=('<tool_call>{name}\n', '<tool_call>{name}'))
