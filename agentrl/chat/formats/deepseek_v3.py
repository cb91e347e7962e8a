"""DeepSeek-V3 / R1 calls::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
    ```json
    {...}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

DeepSeek-V3.1 drops the ``function`` type and the code fence
(``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>``); both are read.
"""

from __future__ import annotations

import json
import re

from agentrl.chat.formats.base import ParsedTurn, ToolCallFormat, ToolSchemas, json_arguments
from agentrl.types import ToolCall

_BEGIN, _SEP, _END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
_CALLS_RE = re.compile(r"<｜tool▁calls▁begin｜>.*?(?:<｜tool▁calls▁end｜>|\Z)", re.DOTALL)
_CALL_RE = re.compile(re.escape(_BEGIN) + r"(.*?)(?:" + re.escape(_END) + r"|\Z)", re.DOTALL)
_FENCE_RE = re.compile(r"\A\s*```(?:json)?\s*\n(.*?)\n?```\s*\Z", re.DOTALL)


def parse_deepseek_v3(text: str, tools: ToolSchemas = None) -> ParsedTurn:
    """DeepSeek ``<｜tool▁call▁begin｜>`` blocks inside ``<｜tool▁calls▁begin｜>``.

    >>> t = '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\\n```json\\n{"x": 1}\\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
    >>> parse_deepseek_v3(t).tool_calls
    [ToolCall(name='f', arguments={'x': 1}, id=None)]
    """
    calls: list[ToolCall] = []
    errors: list[str] = []
    n = 0
    for block in _CALLS_RE.findall(text):
        for m in _CALL_RE.finditer(block):
            n += 1
            where = f"tool call {n}"
            head, sep, rest = m.group(1).partition(_SEP)
            if not sep:
                errors.append(f"{where}: missing <｜tool▁sep｜>")
                continue
            if head.strip() == "function":  # V3: type, separator, then NAME on its own line
                name, _, body = rest.partition("\n")
            else:  # V3.1: NAME, separator, then the JSON
                name, body = head, rest
            fence = _FENCE_RE.match(body)
            body = fence.group(1) if fence else body
            try:
                args = json.loads(body) if body.strip() else {}
            except json.JSONDecodeError as e:
                errors.append(f"{where}: invalid JSON ({e.msg} at char {e.pos})")
                continue
            checked = json_arguments(args, where, errors)
            if checked is not None and name.strip():
                calls.append(ToolCall(name.strip(), checked))
            elif checked is not None:
                errors.append(f"{where}: missing the function name")
    return ParsedTurn(_CALLS_RE.sub("", text).strip(), calls, errors)


FORMAT = ToolCallFormat(
    name="deepseek_v3", parse=parse_deepseek_v3, families="DeepSeek-V3, DeepSeek-R1, DeepSeek-V3.1",
    description="<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME ```json {...}```<｜tool▁call▁end｜>",
    call_openings=(
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n',
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{name}<｜tool▁sep｜>',
    ))
