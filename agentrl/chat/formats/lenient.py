"""Lenient reading of JSON tool calls: the calls small models write instead of their template's syntax.

A 135M-1.5B instruct model asked to call a tool often writes the right JSON without the
format's wrapper: a bare ``{"name": "multiply", "arguments": {"a": 6, "b": 7}}`` line with no
``<tool_call>`` tags, or the same object in a fenced ``json`` code block. Read strictly, such a
turn holds no call and the attempt ends without the tool. ``lenient(fmt)`` wraps a JSON format
(:data:`LENIENT_FORMATS`) so that, when the strict parser finds neither a call nor a malformed
one, these two shapes are read as calls too:

- a *bare call*: a JSON object (or a list of them) that starts a line and ends it;
- a *fenced call*: a fenced code block, labelled ``json`` or not labelled, whose whole body is
  such an object or list.

Each object must be call-shaped and name a tool the turn was offered: a ``"name"`` that is one
of the tool schemas' names, an ``"arguments"`` (or ``"parameters"``) member, and no key other
than ``name``, ``arguments``, ``parameters``, ``id`` and ``type``. Anything else stays text:
JSON that names no offered tool, an answer object (``{"answer": 42}``, ``{"name": "multiply",
"result": 42}``), JSON inside a sentence, a list holding one object that is not a call. A turn
with no tool schemas has no lenient calls. Parsing only reads: the sampled ids are kept as
sampled and trained on as they are (docs/design.md convention 1); the call's text leaves the
turn's content, as a strict format's call blocks do.

>>> from agentrl.chat.formats import get_format
>>> tools = [{"type": "function", "function": {"name": "multiply", "parameters": {}}}]
>>> fmt = lenient(get_format("hermes"))
>>> turn = fmt.parse('I will multiply.\\n{"name": "multiply", "arguments": {"a": 6, "b": 7}}', tools)
>>> turn.content, turn.tool_calls
('I will multiply.', [ToolCall(name='multiply', arguments={'a': 6, 'b': 7}, id=None)])
>>> fmt.parse('{"name": "divide", "arguments": {"a": 6}}', tools).tool_calls  # not an offered tool
[]
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from agentrl.chat.formats.base import ParsedTurn, ToolCallFormat, ToolSchemas, add_json_call

# The registered formats whose calls are JSON objects naming the function: a model of these
# families that drops the wrapper still writes {"name": ..., "arguments": ...}. (deepseek_v3 and
# harmony name the function in special tokens and write only the arguments as JSON; the XML and
# pythonic formats write no JSON.)
LENIENT_FORMATS = ("hermes", "llama3_json", "mistral")
CALL_KEYS = frozenset({"name", "arguments", "parameters", "id", "type"})

# every fenced block (any label): its lines are never bare calls; only json or unlabelled ones are read
_FENCE_RE = re.compile(r"^[ \t]*```[ \t]*([\w+.-]*)[ \t]*\n(.*?)\n[ \t]*```[ \t]*$", re.DOTALL | re.MULTILINE)
_LINE_START_RE = re.compile(r"^[ \t]*(?=[{\[])", re.MULTILINE)


def offered_names(tools: ToolSchemas) -> set[str]:
    """The function names of OpenAI tool schemas (bare function schemas work too)."""
    return {fn.get("name") for t in tools or [] if isinstance(fn := t.get("function", t), dict)} - {None}


def call_shaped(obj: Any, names: set[str]) -> bool:
    """Whether ``obj`` is a call of an offered tool: an object with a ``name`` in ``names``, an
    ``arguments`` or ``parameters`` member, and no other keys than :data:`CALL_KEYS`.

    >>> call_shaped({"name": "f", "arguments": {}}, {"f"}), call_shaped({"name": "f", "result": 1}, {"f"})
    (True, False)
    """
    return (isinstance(obj, dict) and obj.get("name") in names and ("arguments" in obj or "parameters" in obj)
            and set(obj) <= CALL_KEYS)


def _calls_of(value: Any, names: set[str]) -> list[dict[str, Any]] | None:
    """The call objects of one JSON value: an object, or a non-empty list of them; None if any is not a call."""
    items = value if isinstance(value, list) else [value]
    return items if items and all(call_shaped(v, names) for v in items) else None


def lenient_calls(text: str, tools: ToolSchemas) -> ParsedTurn | None:
    """The bare and fenced calls of ``text`` naming a tool of ``tools`` (None when there are none),
    in the order written, with the rest of the text as the content.

    >>> tools = [{"type": "function", "function": {"name": "add"}}]
    >>> lenient_calls('```json\\n{"name": "add", "arguments": {"a": 1}}\\n```', tools).tool_calls[0].arguments
    {'a': 1}
    >>> lenient_calls('The call is {"name": "add", "arguments": {}} as shown.', tools) is None  # inside a sentence
    True
    """
    names = offered_names(tools)
    if not names:
        return None
    found: list[tuple[int, int, list[dict[str, Any]]]] = []  # (start, end, call objects)
    fenced: list[tuple[int, int]] = []
    for m in _FENCE_RE.finditer(text):
        fenced.append((m.start(), m.end()))
        if m.group(1).lower() not in ("", "json"):
            continue
        try:
            calls = _calls_of(json.loads(m.group(2)), names)
        except json.JSONDecodeError:
            continue
        if calls is not None:
            found.append((m.start(), m.end(), calls))
    decoder = json.JSONDecoder()
    covered = 0  # the end of the last JSON value read: lines inside it (a list's items) are its own
    for m in _LINE_START_RE.finditer(text):
        start = m.end()
        if start < covered or any(a <= start < b for a, b in fenced):
            continue
        try:
            value, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            continue
        covered = end
        line_end = text.find("\n", end)
        line_end = len(text) if line_end < 0 else line_end
        if text[end:line_end].strip():  # text after the object on its line: prose, not a call
            continue
        calls = _calls_of(value, names)
        if calls is not None:
            found.append((m.start(), end, calls))
    if not found:
        return None
    found.sort(key=lambda f: f[0])
    calls, errors, content, at = [], [], [], 0
    for n, (start, end, objs) in enumerate(found, start=1):
        for k, obj in enumerate(objs, start=1):
            add_json_call(obj, f"tool call {n}" + (f", item {k}" if len(objs) > 1 else ""), calls, errors)
        content.append(text[at:start])
        at = end
    content.append(text[at:])
    return ParsedTurn("".join(content).strip(), calls, errors)


def lenient(fmt: ToolCallFormat) -> ToolCallFormat:
    """``fmt`` reading bare and fenced JSON calls too, when its own parser finds no call and no
    malformed one (a turn in the format's syntax is read as strictly as before). Raises
    ValueError for a format not in :data:`LENIENT_FORMATS`."""
    if fmt.name not in LENIENT_FORMATS:
        raise ValueError(f"lenient tool-call reading applies to the JSON formats {LENIENT_FORMATS}; "
                         f"{fmt.name!r} does not write its calls as JSON objects")
    strict_parse = fmt.parse

    def parse(text: str, tools: ToolSchemas = None) -> ParsedTurn:
        strict = strict_parse(text, tools)
        if strict.tool_calls or strict.errors:
            return strict
        return lenient_calls(text, tools) or strict

    return dataclasses.replace(fmt, parse=parse)
