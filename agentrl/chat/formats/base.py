"""What every tool-call format shares: the parse result, the format record, argument helpers.

A format turns the text a model sampled into tool calls. Parsing never raises: a call the
model wrote badly comes back as an error string, which the rollout shows the model as an
``Error: ...`` observation (docs/design.md convention 4).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from agentrl.types import ToolCall

ToolSchemas = list[dict[str, Any]] | None  # OpenAI tool schemas, as passed to chat templates


@dataclass
class ParsedTurn:
    """An assistant turn split into text and tool calls."""

    content: str  # the text with the tool-call blocks removed (stripped)
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # one message per malformed call block


@dataclass(frozen=True)
class MidTurn:
    """A format whose calls run inside the assistant turn (tool-integrated reasoning): the
    rollout pauses generation on ``stop_strings``, asks ``at_stop(turn_text)`` what the turn
    so far calls for (an object with ``call``, ``fabricated``, ``written``), runs ``call`` in
    the tool named ``tool``, appends ``observation(stop, output)`` as tool tokens and lets the
    same turn continue. See :mod:`agentrl.chat.formats.code_block`."""

    tool: str
    stop_strings: tuple[str, ...]
    at_stop: Callable[[str], Any]
    observation: Callable[[Any, str], str]


@dataclass(frozen=True)
class ToolCallFormat:
    """One tool-call syntax: its parser and the stop tokens that end a call turn.

    ``stop_tokens`` are the tokens, besides the template's end-of-turn token and the
    tokenizer's eos, after which a model that wrote calls stops to wait for their results
    (gpt-oss ``<|call|>``, GLM ``<|observation|>``); the chat template adds those the
    tokenizer has to its stop ids.
    """

    name: str
    description: str  # the syntax, as one line of the docs table
    parse: Callable[[str, ToolSchemas], ParsedTurn]
    stop_tokens: tuple[str, ...] = ()
    families: str = ""  # model families known to use it
    mid_turn: MidTurn | None = None  # set when calls run inside the turn instead of ending it


def add_json_call(obj: Any, where: str, calls: list[ToolCall], errors: list[str]) -> None:
    """Append the call ``obj`` (``{"name": ..., "arguments"|"parameters": {...}}``) or an error."""
    if not isinstance(obj, dict):
        errors.append(f"{where}: expected a JSON object, got {type(obj).__name__}")
        return
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        errors.append(f'{where}: missing "name"')
        return
    args = obj.get("arguments", obj.get("parameters", {}))
    checked = json_arguments(args, where, errors)
    if checked is not None:
        calls.append(ToolCall(name=name, arguments=checked, id=obj.get("id") if isinstance(obj.get("id"), str) else None))


def json_arguments(args: Any, where: str, errors: list[str]) -> dict[str, Any] | None:
    """``args`` as an argument object, or None after recording why it is not one."""
    if isinstance(args, str):  # some models JSON-encode the arguments a second time
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            errors.append(f'{where}: "arguments" is a string that is not JSON')
            return None
    if not isinstance(args, dict):
        errors.append(f'{where}: "arguments" must be a JSON object, got {type(args).__name__}')
        return None
    return args


def parameter_schemas(tools: ToolSchemas, name: str) -> dict[str, Any]:
    """The JSON-schema ``properties`` of tool ``name`` ({} when unknown)."""
    for tool in tools or []:
        fn = tool.get("function", tool)
        if fn.get("name") == name:
            return dict((fn.get("parameters") or {}).get("properties") or {})
    return {}


def typed_value(raw: str, schema: dict[str, Any] | None) -> Any:
    """A parameter value written as bare text (XML-style formats write strings unquoted and
    everything else as JSON). The tool's schema decides when it says "string"; without one,
    text that parses as JSON is taken as JSON, so a string such as "391" comes back as 391."""
    kind = (schema or {}).get("type")
    if kind == "string" or (isinstance(kind, list) and kind == ["string"]):
        return raw
    if kind == "boolean" and raw in ("True", "False"):  # Qwen3.5 writes Python's str(bool)
        return raw == "True"
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, ValueError):
        return raw
