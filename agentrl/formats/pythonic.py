"""LFM2 (and Llama-4-style) pythonic calls: ``<|tool_call_start|>[f(a='x', n={"k": 1})]<|tool_call_end|>``.

Arguments are Python literals: quoted strings with backslash escapes, numbers, and JSON for
lists and dicts (so ``true``/``false``/``null`` appear next to Python's ``True``/``None``).
"""

from __future__ import annotations

import ast
import re
from typing import Any

from agentrl.formats.base import ParsedTurn, ToolCallFormat, ToolSchemas
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
    description="<|tool_call_start|>[NAME(key='text', n=1)]<|tool_call_end|>")
