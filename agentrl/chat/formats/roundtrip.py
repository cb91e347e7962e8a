"""Round trips: render known calls through a template, parse them back with a format.

A format is only trusted for a template when every case here comes back identical: one
call, two parallel calls, nested JSON arguments, unicode, and quotes with escapes.

>>> from jinja2 import Template
>>> tmpl = Template("{% for m in messages %}{{ m.content }}{% for c in m.tool_calls or [] %}"
...                 "<tool_call>{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}"
...                 "</tool_call>{% endfor %}<|im_end|>{% endfor %}")
>>> [r.passed for r in round_trip_all(lambda m, t, g: tmpl.render(messages=m, tools=t), "hermes")]
[True, True, True, True, True]
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrl.chat.formats import FORMATS, FormatDetectionError, Renderer, reads_back, render_assistant
from agentrl.types import ToolCall

ROUND_TRIP_TOOLS = [
    {"type": "function", "function": {
        "name": "calculator", "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"}, "filters": {"type": "object"}, "limit": {"type": "integer"},
            "exact": {"type": "boolean"}}, "required": ["query"]}}},
]
ROUND_TRIP_CASES: dict[str, list[ToolCall]] = {
    "one call": [ToolCall("calculator", {"expression": "17 * 23"}, id="call00001")],
    "two parallel calls": [ToolCall("calculator", {"expression": "391 + 1"}, id="call00002"),
                           ToolCall("search", {"query": "capital of France"}, id="call00003")],
    "nested JSON arguments": [ToolCall("search", {
        "query": "papers", "limit": 5, "exact": True,
        "filters": {"sites": ["arxiv.org", "acm.org"], "recent": False, "score": 0.5, "after": None, "n": {"k": [1, 2]}}},
        id="call00004")],
    "unicode": [ToolCall("search", {"query": "café naïve 中文 Ελληνικά 👩‍👩‍👧 🚀"}, id="call00005")],
    "quotes and escapes": [ToolCall("search", {"query": 'He said "hi", it\'s {a: [b]} \\ back\\slash\nline 2\ttab'},
                                    id="call00006")],
}


@dataclass
class RoundTrip:
    """One case of ``round_trip_all``."""

    case: str
    rendered: bool  # False: the template refused to render these calls (detail says why)
    passed: bool  # the format parsed exactly these calls back from the rendering
    detail: str  # the render error, or the rendered text when the calls did not come back


def round_trip(render: Renderer, format_name: str, case: str) -> RoundTrip:
    """Render the calls of ``ROUND_TRIP_CASES[case]`` in an assistant turn, parse them back."""
    calls = ROUND_TRIP_CASES[case]
    try:
        probe = render_assistant(render, calls, ROUND_TRIP_TOOLS)
    except FormatDetectionError as e:
        return RoundTrip(case, False, False, str(e))
    if reads_back(FORMATS[format_name], probe.text, calls, ROUND_TRIP_TOOLS):
        return RoundTrip(case, True, True, "")
    for k in range(1, len(calls)):  # gpt-oss renders tool_calls[0] only: a template choice, not a parse error
        if reads_back(FORMATS[format_name], probe.text, calls[:k], ROUND_TRIP_TOOLS):
            return RoundTrip(case, False, False, f"the template renders only the first {k} of {len(calls)} calls")
    return RoundTrip(case, True, False, probe.text)


def round_trip_all(render: Renderer, format_name: str) -> list[RoundTrip]:
    """Every case of ``ROUND_TRIP_CASES``, in order."""
    return [round_trip(render, format_name, case) for case in ROUND_TRIP_CASES]
