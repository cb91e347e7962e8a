"""Tool-call formats: the registry, and detection of a chat template's format by rendering.

Each format lives in its own module (``hermes``, ``qwen_xml``, ``harmony``...) and is a
``ToolCallFormat``: a parser from sampled text to calls (malformed calls come back as error
strings) and the stop tokens that end a call turn. ``detect_format`` renders a probe
conversation holding one known call through the template and keeps the formats whose parser
reads that exact call back; it raises unless exactly one does. Nothing looks at the
template's source text: a template that mentions ``<tool_call>`` in its system prompt but
writes calls as XML is read by what it writes.

>>> from agentrl.chat.formats import FORMATS, detect_format
>>> sorted(FORMATS)[:3]
['atem_xml', 'code_block', 'deepseek_v3']
>>> from jinja2 import Template
>>> tmpl = Template("{% for m in messages %}{{ m.content }}{% for c in m.tool_calls or [] %}"
...                 "<tool_call>{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}"
...                 "</tool_call>{% endfor %}<|im_end|>{% endfor %}")
>>> detect_format(lambda messages, tools, gen: tmpl.render(messages=messages, tools=tools))
'hermes'
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from typing import Any, Callable

from agentrl.chat.formats import (atem_xml, code_block, deepseek_v3, gemma4, glm4, harmony, hermes, llama3_json,
                                  mistral, pythonic, qwen_xml)
from agentrl.chat.formats.base import ParsedTurn, ToolCallFormat, ToolSchemas
from agentrl.types import Message, ToolCall

FORMATS: dict[str, ToolCallFormat] = {m.FORMAT.name: m.FORMAT for m in (
    hermes, llama3_json, qwen_xml, glm4, harmony, gemma4, deepseek_v3, mistral, pythonic, atem_xml, code_block)}
# formats a chat template renders (and detection can find); mid-turn ones never pass through it
TEMPLATE_FORMATS = tuple(name for name, fmt in FORMATS.items() if fmt.mid_turn is None)

# (chat messages in the transformers dict form, tools, add_generation_prompt) -> rendered text
Renderer = Callable[[list[dict[str, Any]], ToolSchemas, bool], str]

PROBE_TOOLS = [{"type": "function", "function": {
    "name": "agentrl_probe", "description": "Look up a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}]
PROBE_CALL = ToolCall("agentrl_probe", {"city": "Paris", "days": 3}, id="call00001")  # 9 characters, as Mistral requires
_PROBE_USER, _PROBE_ASSISTANT = "AgentrlProbeUser", "AgentrlProbeAssistant"
FIX = ("set model.tool_call_format=NAME in the run config (or `agentrl train CONFIG model.tool_call_format=NAME`; "
       "ChatTemplate(..., tool_call_format=NAME) in Python), NAME one of " + ", ".join(FORMATS))


class FormatDetectionError(ValueError):
    """The tool-call format cannot be told from the template; ``candidates`` lists what matched."""

    def __init__(self, message: str, candidates: list[str] | None = None):
        super().__init__(message)
        self.candidates = list(candidates or [])


def get_format(name: str) -> ToolCallFormat:
    """The registered format ``name``.

    >>> get_format("harmony").stop_tokens
    ('<|call|>',)
    """
    if name not in FORMATS:
        raise FormatDetectionError(f"unknown tool_call_format {name!r}; use one of {tuple(FORMATS)}")
    return FORMATS[name]


@dataclass
class ProbeRendering:
    """An assistant turn holding known calls, as a template renders it."""

    text: str  # from the end of the generation prompt; the end-of-turn text is cut off
    json_string_arguments: bool  # the template only rendered calls whose arguments were a JSON string


def chat_messages(messages: list[Message], json_string_arguments: bool = False) -> list[dict[str, Any]]:
    """``Message.to_chat`` forms; with ``json_string_arguments`` call arguments are JSON text
    (DeepSeek-V3's original template concatenates them as strings and rejects objects)."""
    out = [m.to_chat() for m in messages]
    if json_string_arguments:
        for m in out:
            for call in m.get("tool_calls", []):
                call["function"]["arguments"] = json.dumps(call["function"]["arguments"], ensure_ascii=False)
    return out


def render_assistant(render: Renderer, calls: list[ToolCall], tools: ToolSchemas = None,
                     content: str = "") -> ProbeRendering:
    """Render ``user, assistant(content, calls)`` and return the assistant part as a model would
    sample it: what follows the generation prompt, minus the template's end-of-turn text.
    Arguments go in as objects, and as JSON strings if the template rejects objects."""
    tools = PROBE_TOOLS if tools is None else tools
    user = Message("user", _PROBE_USER)
    errors = []
    for as_json in (False, True):
        try:
            full = render(chat_messages([user, Message("assistant", content, list(calls))], as_json), tools, False)
            prompt = render(chat_messages([user]), tools, True)
            plain = render(chat_messages([user, Message("assistant", _PROBE_ASSISTANT)]), tools, False)
        except Exception as e:  # jinja errors and the template's own raise_exception()
            errors.append(f"{type(e).__name__}: {e}")
            continue
        # the generation prompt and the rendered turn may differ inside the turn's header
        # (Nemotron writes <think> then <think></think>): cut at their common prefix
        start = next((i for i, (a, b) in enumerate(zip(prompt, full)) if a != b), min(len(prompt), len(full)))
        if full.rfind("<", 0, start) > full.rfind(">", 0, start):  # never cut inside a tag (<｜Assistant｜>)
            start = full.rfind("<", 0, start)
        closing = plain[plain.rfind(_PROBE_ASSISTANT) + len(_PROBE_ASSISTANT):]
        text = full[start:]
        if closing.strip() and text.endswith(closing):
            text = text[:-len(closing)]
        return ProbeRendering(text, as_json)
    raise FormatDetectionError("the template cannot render an assistant turn with a tool call (" + "; ".join(errors)
                               + "); use a tool-capable template, or " + FIX)


def reads_back(fmt: ToolCallFormat, text: str, calls: list[ToolCall], tools: ToolSchemas = None) -> bool:
    """True when ``fmt`` parses ``text`` into exactly ``calls`` (names and arguments), error-free."""
    try:
        turn = fmt.parse(text, PROBE_TOOLS if tools is None else tools)
    except Exception:  # a parser is not meant to raise; if one does, it does not read this text
        return False
    got = [(c.name, c.arguments) for c in turn.tool_calls]
    return not turn.errors and got == [(c.name, c.arguments) for c in calls]


def matching_formats(text: str, calls: list[ToolCall], tools: ToolSchemas = None) -> list[str]:
    """Every registered format that reads ``calls`` back from ``text``."""
    return [name for name in TEMPLATE_FORMATS if reads_back(FORMATS[name], text, calls, tools)]


def detect_format(render: Renderer) -> str:
    """The one registered format that reads back a known call rendered by ``render``; raises
    FormatDetectionError (with the candidates and the fix) when none or several do."""
    probe = render_assistant(render, [PROBE_CALL])
    matches = matching_formats(probe.text, [PROBE_CALL])
    if not matches and html.unescape(probe.text) != probe.text:
        # Mistral's v3 template concatenates strings with `arguments|tojson|safe`, a Markup, so
        # transformers' renderer HTML-escapes the rest (&#34;). The model writes plain quotes.
        matches = matching_formats(html.unescape(probe.text), [PROBE_CALL])
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise FormatDetectionError(f"the template's tool calls ({probe.text.strip()[:120]!r}) are read by several "
                                   f"formats: {matches}; {FIX}", matches)
    if PROBE_CALL.name not in probe.text:
        raise FormatDetectionError(f"the template does not render the assistant's tool calls (an assistant turn "
                                   f"with a call renders as {probe.text.strip()[:120]!r}), so their format cannot be "
                                   f"detected; {FIX}")
    raise FormatDetectionError(f"no registered format reads the template's tool calls "
                               f"({probe.text.strip()[:160]!r}); {FIX}")


__all__ = ["FORMATS", "FormatDetectionError", "ParsedTurn", "ProbeRendering", "TEMPLATE_FORMATS", "ToolCallFormat", "chat_messages",
           "detect_format", "get_format", "matching_formats", "reads_back", "render_assistant"]
