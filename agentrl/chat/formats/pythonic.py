"""LFM2 (and Llama-4-style) pythonic calls: ``<|tool_call_start|>[f(a='x', n={"k": 1})]<|tool_call_end|>``.

Arguments are Python literals: quoted strings with backslash escapes, numbers, and JSON for
lists and dicts (so ``true``/``false``/``null`` appear next to Python's ``True``/``None``).
"""

from __future__ import annotations

import ast
import re
from typing import Any

from agentrl.chat.formats.base import ParsedTurn, ToolCallFormat, ToolSchemas
from agentrl.types import ToolCall

_BLOCK_RE = re.compile(r"<\|tool_call_start\|>(.*?)<\|tool_call_end\|>|<\|tool_call_start\|>(.*)\Z", re.DOTALL)
_NAMES = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}


def _literal(node: ast.expr) -> Any:
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if isinstance(node, ast.Dict):
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values) if k is not None}
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        return -node.operand.value
    if isinstance(node, ast.Constant):
        return node.value
    raise ValueError(f"not a literal: {ast.unparse(node)[:40]}")


_NEXT_RE = re.compile(r"\s*(?:,\s*[A-Za-z_]\w*\s*=|\)\s*(?:,\s*[A-Za-z_][\w.]*\(|\]\s*\Z))")
_CALL_HEAD_RE = re.compile(r"\s*([A-Za-z_][\w.]*)\(")
_KEY_RE = re.compile(r"\s*([A-Za-z_]\w*)\s*=\s*")


def _unescaped_calls(body: str) -> list[tuple[str, dict[str, Any]]]:
    """Calls whose string arguments sit between single quotes *unescaped* (LFM2.5's template
    writes ``"'" + value + "'"``): a string ends at the quote after which the next argument,
    the next call or the end of the list follows. Raises ValueError when that does not parse."""
    if not body.startswith("["):
        raise ValueError("expected a [...] list of calls")
    calls, i = [], 1
    while True:
        head = _CALL_HEAD_RE.match(body, i)
        if head is None:
            raise ValueError(f"expected NAME( at char {i}")
        name, args, i = head.group(1), {}, head.end()
        while not body.startswith(")", i):
            key = _KEY_RE.match(body, i)
            if key is None:
                raise ValueError(f"expected key= at char {i}")
            i = key.end()
            if body.startswith("'", i):
                end = next((m.start() for m in re.finditer("'", body[i + 1:]) if _NEXT_RE.match(body, i + 2 + m.start())), None)
                if end is None:
                    raise ValueError(f"unterminated string at char {i}")
                args[key.group(1)], i = body[i + 1:i + 1 + end], i + 2 + end
            else:
                depth, j = 0, i
                while j < len(body) and not (depth == 0 and body[j] in ",)"):
                    depth += body[j] in "[{(" and 1 or (-1 if body[j] in "]})" else 0)
                    j += 1
                args[key.group(1)], i = _literal(ast.parse(body[i:j].strip(), mode="eval").body), j
            i += len(re.match(r"\s*,?\s*", body[i:]).group(0))
        calls.append((name, args))
        rest = re.match(r"\)\s*(,|\])\s*", body[i:])
        if rest is None:
            raise ValueError(f"expected ) at char {i}")
        i += rest.end()
        if rest.group(1) == "]":
            if body[i:].strip():
                raise ValueError("text after the call list")
            return calls


def parse_pythonic(text: str, tools: ToolSchemas = None) -> ParsedTurn:
    """``[NAME(key=value, ...), ...]`` lists between ``<|tool_call_start|>`` and ``<|tool_call_end|>``.

    >>> parse_pythonic("<|tool_call_start|>[f(q='it\\\\'s', n=[1, true])]<|tool_call_end|>").tool_calls
    [ToolCall(name='f', arguments={'q': "it's", 'n': [1, True]}, id=None)]
    """
    calls: list[ToolCall] = []
    errors: list[str] = []
    for n, m in enumerate(_BLOCK_RE.finditer(text), start=1):
        body = (m.group(1) if m.group(1) is not None else m.group(2)).strip()
        where = f"tool call block {n}"
        try:
            tree = ast.parse(body, mode="eval").body
        except SyntaxError as e:
            try:  # a template that does not escape quotes inside strings (LFM2.5)
                calls += [ToolCall(name, args) for name, args in _unescaped_calls(body)]
            except (ValueError, SyntaxError):
                errors.append(f"{where}: not a Python call list ({e.msg})")
            continue
        for k, call in enumerate(tree.elts if isinstance(tree, ast.List) else [tree], start=1):
            if not isinstance(call, ast.Call) or call.args or not isinstance(call.func, (ast.Name, ast.Attribute)):
                errors.append(f"{where}, call {k}: expected NAME(key=value, ...)")
                continue
            try:
                args = {kw.arg: _literal(kw.value) for kw in call.keywords if kw.arg is not None}
            except ValueError as e:
                errors.append(f"{where}, call {k}: {e}")
                continue
            calls.append(ToolCall(ast.unparse(call.func), args))
    return ParsedTurn(_BLOCK_RE.sub("", text).strip(), calls, errors)


FORMAT = ToolCallFormat(
    name="pythonic", parse=parse_pythonic, families="LFM2, LFM2.5",
    description="<|tool_call_start|>[NAME(key='text', n=1)]<|tool_call_end|>",
    call_openings=('<|tool_call_start|>[{name}(',))
