"""What the model is told about a tool: JSON schema from a Python signature and docstring,
and short messages when the model's arguments do not fit that schema.

Type hints map to JSON schema as follows (``X`` any supported hint)::

    int -> {"type": "integer"}        float -> {"type": "number"}
    str -> {"type": "string"}         bool  -> {"type": "boolean"}
    list[X] -> {"type": "array", "items": X}      list -> {"type": "array"}
    dict[str, X] -> {"type": "object", "additionalProperties": X}   dict -> {"type": "object"}
    Literal["a", "b"] -> {"type": "string", "enum": ["a", "b"]}
    X | None, Optional[X] -> X with "null" added to its type (anyOf when X has no single type)
    Any -> {}           Annotated[X, "text"] -> X, "text" is the description if the docstring has none

A parameter's description is its docstring entry (``Args:`` section, or ``:param x:``), else the
text of an ``Annotated`` hint. :class:`FunctionSchema` also lists the docstring's mistakes, which
``@tool`` reports at decoration (see :mod:`agentrl.toolbox.tool`): ``unknown_args`` (entries
that name no parameter) and ``undocumented`` (parameters without a description).

A parameter with a default is not required; a JSON-simple default (None, bool, number, str) is
copied into the schema as ``"default"``. The parameters object has ``additionalProperties: false``
so an argument the function does not take is reported instead of crashing the call.

Argument leniency (one documented rule): an integer-valued float such as ``3.0`` is accepted for
an ``int`` parameter and converted to ``3`` before the call (JSON does not distinguish them and
models write both). Everything else is strict: ``"3"`` is not an integer, ``true`` is not a number.

Example::

    from agentrl.toolbox.schema import function_schema

    def add(a: int, b: int = 2) -> int:
        '''Add two integers.

        Args:
            a: first term
            b: second term
        '''
        return a + b

    fs = function_schema(add, skip=set())
    assert fs.description == "Add two integers."
    assert fs.parameters["properties"]["b"] == {"type": "integer", "description": "second term", "default": 2}
    assert fs.parameters["required"] == ["a"]
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Union

from jsonschema import Draft202012Validator, ValidationError

_PRIMITIVES: dict[object, str] = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}
_SIMPLE_DEFAULT = (type(None), bool, int, float, str)
_SECTION = re.compile(
    r"^(Args|Arguments|Parameters|Params|Keyword Args|Returns?|Yields?|Raises|Examples?|Notes?|"
    r"Attributes|See Also|Todo|Warnings?)\s*:\s*$",
    re.IGNORECASE,
)
_ARG_SECTIONS = {"args", "arguments", "parameters", "params", "keyword args"}
_ARG_LINE = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SPHINX_PARAM = re.compile(r"^:param\s+(?:[\w\[\], |.]+\s+)?(\w+)\s*:\s*(.*)$")


@dataclass
class FunctionSchema:
    """Description and parameters schema derived from one function, and what its docstring
    got wrong."""

    description: str
    parameters: dict[str, Any]
    unknown_args: list[str] = field(default_factory=list)  # docstring entries naming no parameter
    undocumented: list[str] = field(default_factory=list)  # schema parameters with no description


@dataclass
class Docstring:
    """The parts of a docstring a tool schema uses."""

    description: str
    args: dict[str, str]


def parse_docstring(doc: str | None) -> Docstring:
    """Split a Google-style docstring (Sphinx ``:param x:`` lines also work) into the
    description (text before the first section) and per-argument descriptions.

    >>> d = parse_docstring("Add.\\n\\nArgs:\\n    a (int): first\\n        term\\n    b: second\\n")
    >>> (d.description, d.args)
    ('Add.', {'a': 'first term', 'b': 'second'})
    """
    lines = inspect.cleandoc(doc or "").splitlines()
    description: list[str] = []
    args: dict[str, str] = {}
    section: str | None = None
    base_indent: int | None = None
    current: str | None = None
    for line in lines:
        stripped = line.strip()
        header = _SECTION.match(stripped) if line[:1] not in (" ", "\t") else None
        if header:
            section, base_indent, current = header.group(1).lower(), None, None
            continue
        sphinx = _SPHINX_PARAM.match(stripped)
        if sphinx:
            section, current = "sphinx", sphinx.group(1)
            args[current] = sphinx.group(2).strip()
            continue
        if stripped.startswith(":") and section in (None, "sphinx"):
            section, current = "sphinx", None  # :returns:, :raises: ... end the previous :param:
            continue
        if section is None:
            description.append(line)
            continue
        if not stripped or section not in _ARG_SECTIONS | {"sphinx"}:
            continue
        indent = len(line) - len(line.lstrip())
        if section in _ARG_SECTIONS and base_indent is None:
            base_indent = indent
        match = _ARG_LINE.match(stripped)
        if section in _ARG_SECTIONS and indent == base_indent and match:
            current = match.group(1)
            args[current] = match.group(2).strip()
        elif current is not None:
            # A more indented line continues the previous argument's description.
            args[current] = f"{args[current]} {stripped}".strip()
    return Docstring(description="\n".join(description).strip(), args=args)


def type_schema(hint: Any) -> dict[str, Any]:
    """JSON schema of one type hint (see the module docstring for the mapping).

    >>> type_schema(list[int])
    {'type': 'array', 'items': {'type': 'integer'}}
    >>> type_schema(int | None)
    {'type': ['integer', 'null']}
    """
    if hint is Any or hint is inspect.Parameter.empty:
        return {}
    if hint in _PRIMITIVES:
        return {"type": _PRIMITIVES[hint]}
    if hint in (list, tuple, set, frozenset):
        return {"type": "array"}
    if hint is dict:
        return {"type": "object"}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        return type_schema(args[0])
    if origin is Literal:
        return _literal_schema(list(args))
    if origin is Union or (hasattr(types, "UnionType") and origin is types.UnionType):
        return _union_schema(args)
    if origin in (list, set, frozenset) or origin in _abc_sequences():
        return {"type": "array", "items": type_schema(args[0])} if args else {"type": "array"}
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": type_schema(args[0])}
        items = [type_schema(a) for a in args]
        return {"type": "array", "prefixItems": items, "minItems": len(items), "maxItems": len(items)}
    if origin is dict or origin in _abc_mappings():
        out: dict[str, Any] = {"type": "object"}
        if len(args) == 2 and args[1] is not Any:
            out["additionalProperties"] = type_schema(args[1])
        return out
    raise TypeError(
        f"cannot describe type {hint!r} in JSON schema; use int, float, str, bool, list[...], dict[str, ...], "
        "Literal[...], X | None or Any"
    )


def _abc_sequences() -> tuple[object, ...]:
    import collections.abc as abc

    return (abc.Sequence, abc.MutableSequence, abc.Iterable, abc.Collection)


def _abc_mappings() -> tuple[object, ...]:
    import collections.abc as abc

    return (abc.Mapping, abc.MutableMapping)


def _literal_schema(values: list[Any]) -> dict[str, Any]:
    for v in values:
        if type(v) not in _PRIMITIVES:
            raise TypeError(f"Literal values must be str, int, float, bool or None, got {v!r}")
    kinds: list[str] = []
    for v in values:
        if _PRIMITIVES[type(v)] not in kinds:
            kinds.append(_PRIMITIVES[type(v)])
    return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": values}


def _union_schema(args: tuple[Any, ...]) -> dict[str, Any]:
    nullable = type(None) in args
    members = [type_schema(a) for a in args if a is not type(None)]
    if len(members) == 1:
        out = dict(members[0])
        if nullable and isinstance(out.get("type"), (str, list)):
            kinds = [out["type"]] if isinstance(out["type"], str) else list(out["type"])
            out["type"] = kinds + ["null"]
            if "enum" in out:
                out["enum"] = list(out["enum"]) + [None]
            return out
        return {"anyOf": [out, {"type": "null"}]} if nullable else out
    if all(set(m) == {"type"} and isinstance(m["type"], str) for m in members):
        kinds = list(dict.fromkeys(m["type"] for m in members))
        return {"type": kinds + (["null"] if nullable else [])}
    return {"anyOf": members + ([{"type": "null"}] if nullable else [])}


def function_schema(fn: Callable[..., Any], skip: set[str]) -> FunctionSchema:
    """Description and ``{"type": "object", ...}`` parameters of ``fn``; parameters named in
    ``skip`` (injected ones such as a ToolContext) are left out."""
    name = getattr(fn, "__name__", repr(fn))
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:  # NameError for an annotation that only exists under TYPE_CHECKING
        raise TypeError(f"cannot resolve the type hints of tool {name!r}: {exc}; import the annotated types at module level") from exc
    doc = parse_docstring(inspect.getdoc(fn))
    properties: dict[str, Any] = {}
    required: list[str] = []
    for pname, param in inspect.signature(fn).parameters.items():
        if pname in skip:
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {name!r}: *args/**kwargs cannot be described to a model; name each parameter")
        if param.kind is param.POSITIONAL_ONLY:
            raise TypeError(f"tool {name!r}: positional-only parameter {pname!r}; tools are called with keywords")
        if pname not in hints:
            raise TypeError(f"tool {name!r}: parameter {pname!r} has no type hint; annotate it (e.g. `{pname}: str`)")
        try:
            prop = type_schema(hints[pname])
        except TypeError as exc:
            raise TypeError(f"tool {name!r}, parameter {pname!r}: {exc}") from exc
        description = doc.args.get(pname) or _annotated_text(hints[pname])
        if description:
            prop["description"] = description
        if param.default is param.empty:
            required.append(pname)
        elif isinstance(param.default, _SIMPLE_DEFAULT):
            prop["default"] = param.default
        properties[pname] = prop
    parameters = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    names = inspect.signature(fn).parameters  # an injected (skipped) parameter may be documented too
    return FunctionSchema(description=doc.description, parameters=parameters,
                          unknown_args=[a for a in doc.args if a not in names],
                          undocumented=[p for p, prop in properties.items() if "description" not in prop])


def _annotated_text(hint: Any) -> str | None:
    if typing.get_origin(hint) is typing.Annotated:
        return next((m for m in typing.get_args(hint)[1:] if isinstance(m, str)), None)
    return None


def coerce_integers(value: Any, schema: dict[str, Any]) -> Any:
    """Turn integer-valued floats into ints where ``schema`` expects an integer (the one leniency).

    >>> coerce_integers({"n": 3.0, "xs": [1.0, 2.5]}, {"type": "object", "properties":
    ...     {"n": {"type": "integer"}, "xs": {"type": "array", "items": {"type": "number"}}}})
    {'n': 3, 'xs': [1.0, 2.5]}
    """
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else (kinds or [])
    if isinstance(value, float) and value.is_integer() and "integer" in kinds and "number" not in kinds:
        return int(value)
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        return {k: coerce_integers(v, props.get(k, extra if isinstance(extra, dict) else {})) for k, v in value.items()}
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [coerce_integers(v, schema["items"]) for v in value]
    return value


def argument_errors(validator: Draft202012Validator, arguments: dict[str, Any]) -> list[str]:
    """Short, model-readable problems with ``arguments`` (empty when they are valid)."""
    out: list[str] = []
    # Missing arguments first, unexpected ones last: the order a model fixes them in.
    rank = {"required": 0, "additionalProperties": 2}
    errors = sorted(validator.iter_errors(arguments), key=lambda e: (rank.get(str(e.validator), 1), list(map(str, e.absolute_path))))
    for err in errors:
        out.extend(_describe(err))
    return list(dict.fromkeys(out))


# Exact Python types each JSON type accepts in the quick check; anything else (3.0 for an integer,
# a subclass) is left to the full validator, never accepted here.
_QUICK_TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "null": (type(None),)}
_ANNOTATIONS = {"description", "title", "default", "examples"}


def quick_check(parameters: dict[str, Any]) -> Callable[[dict[str, Any]], bool] | None:
    """A predicate true only for arguments certainly valid against ``parameters``, for flat schemas
    (named arguments of primitive types); None for others. The full validator costs ~15 us a
    call, and several times that with the caches cold after a tool ran (issue 16). False means
    "not certain": the full validator decides and writes the messages.

    >>> ok = quick_check({"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"],
    ...                   "additionalProperties": False})
    >>> ok({"q": "x"}), ok({"q": 3}), ok({}), ok({"q": "x", "k": 1})
    (True, False, False, False)
    """
    if parameters.get("type") != "object" or set(parameters) - _ANNOTATIONS - {"type", "properties", "required",
                                                                                "additionalProperties"}:
        return None
    extra_ok = parameters.get("additionalProperties", True)
    if extra_ok is not True and extra_ok is not False:
        return None
    kinds: dict[str, tuple[type, ...] | None] = {}  # None: any value
    for name, prop in parameters.get("properties", {}).items():
        if not isinstance(prop, dict) or set(prop) - _ANNOTATIONS - {"type"}:
            return None
        declared = prop.get("type")
        declared = [declared] if isinstance(declared, str) else declared
        if declared is not None and not (isinstance(declared, list) and all(d in _QUICK_TYPES for d in declared)):
            return None
        kinds[name] = None if declared is None else tuple(t for d in declared for t in _QUICK_TYPES[d])
    required = list(parameters.get("required", []))

    def accept(arguments: dict[str, Any]) -> bool:
        for key, value in arguments.items():
            if key not in kinds:
                if extra_ok:
                    continue
                return False
            allowed = kinds[key]
            if allowed is not None and type(value) not in allowed:
                return False
        return all(r in arguments for r in required)

    return accept


def _describe(err: ValidationError) -> list[str]:
    where = _path(err)
    inside = f" in '{where}'" if where else ""
    if err.validator == "required":
        props = err.schema.get("properties", {})
        present = err.instance if isinstance(err.instance, dict) else {}
        return [
            f"missing required argument '{k}' ({describe_type(props.get(k, {}))}){inside}"
            for k in err.validator_value
            if k not in present
        ]
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        known = set(err.schema.get("properties", {}))
        return [f"unexpected argument '{k}'{inside}" for k in err.instance if k not in known]
    label = f"argument '{where}'" if where else "arguments"
    if err.validator == "type":
        return [f"{label} must be {describe_type(err.schema)}, got {_json_kind(err.instance)} {_short(err.instance)}"]
    if err.validator == "enum":
        choices = ", ".join(json.dumps(v) for v in err.validator_value)
        return [f"{label} must be one of {choices}, got {_short(err.instance)}"]
    return [f"{label}: {_cut(err.message, 200)}"]


def _path(err: ValidationError) -> str:
    out = ""
    for part in err.absolute_path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def describe_type(schema: dict[str, Any]) -> str:
    """Human-readable type of a schema: ``integer``, ``array of string``, ``one of "a", "b"``."""
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(v) for v in schema["enum"])
    if "anyOf" in schema:
        return " or ".join(describe_type(s) for s in schema["anyOf"])
    kinds = schema.get("type")
    if kinds is None:
        return "any value"
    text = " or ".join(kinds) if isinstance(kinds, list) else kinds
    if isinstance(schema.get("items"), dict) and schema["items"]:
        text += f" of {describe_type(schema['items'])}"
    return text


def signature_hint(name: str, parameters: dict[str, Any]) -> str:
    """``add(a: integer, b: integer = 2)``: the call shape, for error messages."""
    required = set(parameters.get("required", []))
    parts = []
    for pname, prop in parameters.get("properties", {}).items():
        part = f"{pname}: {describe_type(prop)}"
        if pname not in required:
            part += f" = {json.dumps(prop['default'])}" if "default" in prop else " (optional)"
        parts.append(part)
    return f"{name}({', '.join(parts)})"


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _short(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return _cut(text, 60)


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."
