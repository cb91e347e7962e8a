"""Gemma 4 calls: ``<|tool_call>call:NAME{key:<|"|>text<|"|>,n:2}<tool_call|>``.

Not JSON: keys are bare, strings are delimited by the ``<|"|>`` token (no escapes inside),
numbers, booleans and nested ``{}``/``[]`` are written as is. After its calls the model
writes ``<|tool_response>`` and waits for the results.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agentrl.chat.formats.base import ParsedTurn, ToolCallFormat, ToolSchemas
from agentrl.types import ToolCall

_QUOTE = '<|"|>'
_BLOCK_RE = re.compile(r"<\|tool_call>(.*?)<tool_call\|>|<\|tool_call>(.*)\Z", re.DOTALL)
_SCALARS = {"true": True, "false": False, "null": None, "None": None}


class _Syntax(ValueError):
    pass


def _value(s: str, i: int) -> tuple[Any, int]:
    if s.startswith(_QUOTE, i):
        end = s.find(_QUOTE, i + len(_QUOTE))
        if end < 0:
            raise _Syntax(f"unterminated {_QUOTE} string at char {i}")
        return s[i + len(_QUOTE):end], end + len(_QUOTE)
    if s.startswith("{", i):
        return _object(s, i)
    if s.startswith("[", i):
        out: list[Any] = []
        i += 1
        while not s.startswith("]", i):
            item, i = _value(s, i)
            out.append(item)
            i = _separator(s, i, "]")
        return out, i + 1
    end = i
    while end < len(s) and s[end] not in ",}]":
        end += 1
    word = s[i:end].strip()
    if not word:
        raise _Syntax(f"missing value at char {i}")
    if word in _SCALARS:
        return _SCALARS[word], end
    try:
        return json.loads(word), end
    except json.JSONDecodeError:
        raise _Syntax(f"bare word {word!r} is not a number, true, false or null (strings need {_QUOTE})") from None


def _object(s: str, i: int) -> tuple[dict[str, Any], int]:
    out: dict[str, Any] = {}
    i += 1  # past '{'
    while not s.startswith("}", i):
        if s.startswith(_QUOTE, i):
            key, i = _value(s, i)
        else:
            colon = s.find(":", i)
            if colon < 0:
                raise _Syntax(f"missing ':' after key at char {i}")
            key, i = s[i:colon].strip(), colon
        if not s.startswith(":", i):
            raise _Syntax(f"expected ':' at char {i}")
        out[key], i = _value(s, i + 1)
        i = _separator(s, i, "}")
    return out, i + 1


def _separator(s: str, i: int, close: str) -> int:
    if s.startswith(",", i):
        return i + 1
    if s.startswith(close, i):
        return i
    raise _Syntax(f"expected ',' or {close!r} at char {i}" if i < len(s) else f"missing {close!r}")


def parse_gemma4(text: str, tools: ToolSchemas = None) -> ParsedTurn:
    """Gemma 4 ``<|tool_call>call:NAME{...}<tool_call|>`` blocks, any number per turn.

    >>> parse_gemma4('<|tool_call>call:f{n:{a:[1,2]},q:<|"|>hi, "you"<|"|>}<tool_call|>').tool_calls
    [ToolCall(name='f', arguments={'n': {'a': [1, 2]}, 'q': 'hi, "you"'}, id=None)]
    """
    calls: list[ToolCall] = []
    errors: list[str] = []
    for n, m in enumerate(_BLOCK_RE.finditer(text), start=1):
        body = (m.group(1) if m.group(1) is not None else m.group(2)).strip()
        where = f"tool call {n}" + ("" if m.group(1) is not None else " (unclosed <|tool_call>)")
        brace = body.find("{")
        if not body.startswith("call:") or brace < 0:
            errors.append(f"{where}: expected call:NAME{{...}}")
            continue
        name = body[len("call:"):brace].strip()
        try:
            args, end = _object(body, brace)
            if body[end:].strip():
                raise _Syntax(f"text after the closing '}}': {body[end:end + 20]!r}")
        except _Syntax as e:
            errors.append(f"{where}: {e}")
            continue
        calls.append(ToolCall(name, args))
    content = _BLOCK_RE.sub("", text).replace("<|tool_response>", "").strip()
    return ParsedTurn(content, calls, errors)


FORMAT = ToolCallFormat(
    name="gemma4", parse=parse_gemma4, stop_tokens=("<|tool_response>",), families="Gemma 4, DiffusionGemma",
    description='<|tool_call>call:NAME{key:<|"|>text<|"|>,n:1}<tool_call|>',
    call_openings=('<|tool_call>call:{name}{',))
