"""Structured output: Chat Completions' ``response_format`` and the Responses API's
``text.format`` read into a :class:`~agentrl.engines.grammar.Grammar` that the engine decodes
under (constrained decoding; what the recorded log-probs are is in ``agentrl.engines.grammar``
and docs/openai_agents.md, "Structured output").

``{"type": "text"}`` is no constraint; ``json_object`` is any JSON object; ``json_schema``
(with ``strict`` true or false: the output matches the schema either way) is JSON matching its
``schema``. A schema the grammar library cannot compile is refused with a 400 naming the
field, before anything is sampled.

>>> read_response_format({"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer"}}}).kind
'json_schema'
>>> read_response_format({"type": "text"}) is None
True
"""

from __future__ import annotations

import re
from typing import Any

from agentrl.engines.grammar import Grammar, GrammarError, check_grammar
from agentrl.serve.protocol import RequestError

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_SCHEMA_KEYS = {"name", "description", "schema", "strict"}


def _grammar(kind: Any, spec: dict[str, Any], param: str) -> Grammar | None:
    """``spec``: the json_schema object (Chat: ``response_format.json_schema``; Responses: the
    format itself, less its ``type``)."""
    if kind == "text":
        return None
    if kind == "json_object":
        grammar = Grammar.json_object()
    elif kind == "json_schema":
        unknown = set(spec) - _SCHEMA_KEYS
        if unknown:
            raise RequestError(f"{param}: unknown json_schema keys {sorted(unknown)} (only "
                               f"{', '.join(sorted(_SCHEMA_KEYS))}): refused rather than ignored", param)
        if not isinstance(spec.get("name"), str) or not _NAME.fullmatch(spec["name"]):
            raise RequestError(f"{param}: json_schema needs a name of 1 to 64 letters, digits, '_' or '-'", param)
        schema = spec.get("schema")
        if not isinstance(schema, dict):
            raise RequestError(f"{param}: json_schema needs a schema (a JSON Schema object) to constrain the "
                               f"output to", param)
        if spec.get("strict") not in (None, True, False):
            raise RequestError(f"{param}: strict must be true or false", param)
        grammar = Grammar.json_schema(schema)
    else:
        raise RequestError(f"{param}: type={kind!r} is not one of 'text', 'json_object', 'json_schema'", param)
    try:
        check_grammar(grammar)
    except GrammarError as e:
        raise RequestError(f"{param}: {e}. Fix: simplify the schema (docs/openai_agents.md, 'Structured "
                           f"output', lists what is supported)", param) from None
    except ImportError as e:
        raise RequestError(f"{param}={kind!r} needs constrained decoding: {e}", param) from None
    return grammar


def read_response_format(raw: Any) -> Grammar | None:
    """Chat Completions' ``response_format`` (None or ``{"type": "text"}``: no constraint)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise RequestError("response_format must be an object with a type", "response_format")
    extra = set(raw) - {"type", "json_schema"}
    if extra:
        raise RequestError(f"response_format: unknown keys {sorted(extra)}", "response_format")
    spec = raw.get("json_schema")
    if raw.get("type") == "json_schema" and not isinstance(spec, dict):
        raise RequestError("response_format: type 'json_schema' needs a json_schema object "
                           "({'name': ..., 'schema': {...}, 'strict': true})", "response_format")
    if raw.get("type") != "json_schema" and spec is not None:
        raise RequestError("response_format: json_schema goes with type 'json_schema'", "response_format")
    return _grammar(raw.get("type"), spec or {}, "response_format")


def read_text_format(raw: Any) -> Grammar | None:
    """The Responses API's ``text.format`` (None or ``{"type": "text"}``: no constraint)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise RequestError("text.format must be an object with a type", "text.format")
    kind = raw.get("type")
    spec = {k: v for k, v in raw.items() if k != "type"}
    if kind != "json_schema" and spec:
        raise RequestError(f"text.format: type {kind!r} takes no other keys (got {sorted(spec)})", "text.format")
    return _grammar(kind, spec, "text.format")


def check_servable(grammar: Grammar | None, param: str, engine, tools: list | None, tool_choice: str) -> None:
    """Refuse a structured-output request this engine or this request cannot honour: an
    engine without constrained decoding (``capabilities.constrained``), or tools the turn may
    call (a turn constrained to the JSON cannot write a call)."""
    if grammar is None:
        return
    if not engine.capabilities.constrained:
        raise RequestError(f"{param} {grammar.kind} needs constrained decoding, which the {type(engine).__name__} "
                           f"engine does not have (capabilities.constrained is False). Fix: serve with "
                           f"model.engine=hf, or leave {param} out and parse the text", param)
    if tools and tool_choice != "none":
        raise RequestError(f"{param} {grammar.kind} with tools the model may call is not supported: the whole "
                           f"turn is constrained to the JSON, so it could not write a call. Fix: send "
                           f"tool_choice='none' (or no tools) on the request that must answer in JSON", param)
