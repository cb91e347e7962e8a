"""A minimal stand-in for ``jsonschema`` (``Draft202012Validator``, ``ValidationError``).

Only installed by ``bootstrap.prepare`` when the real package is missing (the GPU machine's
preinstalled list does not have it, and ``agentrl.toolbox`` imports it at module level). It
covers the keywords that ``agentrl.toolbox.schema`` generates for ``@tool`` functions: ``type``,
``properties``, ``required``, ``additionalProperties``, ``enum``, ``items``, ``anyOf``; any other
keyword is accepted without checking. Errors carry the attributes ``agentrl.toolbox.schema`` reads
(``validator``, ``validator_value``, ``schema``, ``instance``, ``absolute_path``, ``message``).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Iterator

_TYPES = {
    "null": lambda v: v is None,
    "boolean": lambda v: isinstance(v, bool),
    # JSON Schema 2020-12: 3.0 is an integer; booleans are never numbers
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


class SchemaError(Exception):
    """The schema itself is malformed."""


class ValidationError(Exception):
    """One way an instance fails a schema keyword."""

    def __init__(self, message: str, *, validator: str, validator_value: Any, schema: dict, instance: Any,
                 path: tuple = ()):
        super().__init__(message)
        self.message = message
        self.validator = validator
        self.validator_value = validator_value
        self.schema = schema
        self.instance = instance
        self.absolute_path = deque(path)


class Draft202012Validator:
    """``iter_errors(instance)`` yields every :class:`ValidationError` of ``instance``."""

    def __init__(self, schema: dict):
        self.schema = schema

    @classmethod
    def check_schema(cls, schema: Any) -> None:
        """Reject what cannot be a schema (the real validator checks the meta-schema)."""
        if not isinstance(schema, (dict, bool)):
            raise SchemaError(f"{schema!r} is not a schema")
        if isinstance(schema, dict):
            kinds = schema.get("type")
            for k in [kinds] if isinstance(kinds, str) else (kinds or []):
                if k not in _TYPES:
                    raise SchemaError(f"unknown type {k!r}")
            for sub in list((schema.get("properties") or {}).values()) + list(schema.get("anyOf") or []):
                cls.check_schema(sub)

    def is_valid(self, instance: Any) -> bool:
        return next(self.iter_errors(instance), None) is None

    def iter_errors(self, instance: Any) -> Iterator[ValidationError]:
        yield from _errors(self.schema, instance, ())


def _errors(schema: Any, instance: Any, path: tuple) -> Iterator[ValidationError]:
    if schema is True or not isinstance(schema, dict):
        return
    kinds = schema.get("type")
    if kinds is not None:
        names = [kinds] if isinstance(kinds, str) else list(kinds)
        if not any(_TYPES[k](instance) for k in names if k in _TYPES):
            yield ValidationError(f"{instance!r} is not of type {', '.join(map(repr, names))}", validator="type",
                                  validator_value=kinds, schema=schema, instance=instance, path=path)
            return
    if "enum" in schema and instance not in schema["enum"]:
        yield ValidationError(f"{instance!r} is not one of {schema['enum']!r}", validator="enum",
                              validator_value=schema["enum"], schema=schema, instance=instance, path=path)
    if "anyOf" in schema and all(next(_errors(s, instance, path), None) is not None for s in schema["anyOf"]):
        yield ValidationError(f"{instance!r} is not valid under any of the given schemas", validator="anyOf",
                              validator_value=schema["anyOf"], schema=schema, instance=instance, path=path)
    if isinstance(instance, dict):
        props = schema.get("properties") or {}
        missing = [k for k in schema.get("required", []) if k not in instance]
        if missing:
            yield ValidationError(f"{missing[0]!r} is a required property", validator="required",
                                  validator_value=schema["required"], schema=schema, instance=instance, path=path)
        for key, value in instance.items():
            if key in props:
                yield from _errors(props[key], value, path + (key,))
        extra = schema.get("additionalProperties", True)
        unknown = [k for k in instance if k not in props]
        if extra is False and unknown:
            yield ValidationError(f"Additional properties are not allowed ({', '.join(map(repr, unknown))})",
                                  validator="additionalProperties", validator_value=False, schema=schema,
                                  instance=instance, path=path)
        elif isinstance(extra, dict):
            for key in unknown:
                yield from _errors(extra, instance[key], path + (key,))
    if isinstance(instance, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(instance):
            yield from _errors(schema["items"], item, path + (i,))
