"""An MCP tool result as the text the model reads.

A ``tools/call`` result is a list of content blocks, optional structured content and an
``isError`` flag. The model reads text only, so every block becomes text, in order, one per
line (docs/mcp.md, "What the model reads"):

- text: as is;
- image / audio: ``[image: image/png, 1234 bytes]`` (the size of the decoded data; the pixels
  are not shown to a text model);
- an embedded resource: its text, or ``[resource: URI, MIME, N bytes]`` for a binary one;
- a resource link: ``[resource link: URI (name)]``;
- structured content: compact JSON (``{"a":1}``, no spaces, unicode as is), after the blocks,
  unless a text block already holds it: the same JSON (servers are asked to send both), or,
  for ``{"result": v}`` (how the SDK wraps a plain return value), ``v`` itself.

The text is then capped by the ToolBox like any tool's output, and tokenized as untrusted text.

    >>> from types import SimpleNamespace as R
    >>> render(R(content=[R(type="text", text="42"), R(type="image", data="aGVsbG8=", mime_type="image/png")],
    ...          structured_content={"value": 42}))
    '42\\n[image: image/png, 5 bytes]\\n{"value":42}'
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any


def compact_json(value: Any) -> str:
    """``{"a":[1,2]}``: the fewest tokens that still parse."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def render(result: Any) -> str:
    """The text of a ``CallToolResult`` (its ``is_error`` is the caller's to act on)."""
    lines = [_block(b) for b in (getattr(result, "content", None) or [])]
    structured = getattr(result, "structured_content", None)
    if structured is not None and not any(_holds(line, structured) for line in lines):
        lines.append(compact_json(structured))
    return "\n".join(lines)


def _block(block: Any) -> str:
    kind = getattr(block, "type", None)
    if kind == "text":
        return str(getattr(block, "text", ""))
    if kind in ("image", "audio"):
        return f"[{kind}: {getattr(block, 'mime_type', None) or 'unknown type'}, {_size(getattr(block, 'data', ''))} bytes]"
    if kind == "resource":
        res = getattr(block, "resource", None)
        text = getattr(res, "text", None)
        if isinstance(text, str):
            return text
        mime = getattr(res, "mime_type", None) or "unknown type"
        return f"[resource: {getattr(res, 'uri', '?')}, {mime}, {_size(getattr(res, 'blob', ''))} bytes]"
    if kind == "resource_link":
        name = getattr(block, "name", None)
        return f"[resource link: {getattr(block, 'uri', '?')}" + (f" ({name})" if name else "") + "]"
    return f"[{kind or 'unknown'} content]"  # a block type from a later protocol revision


def _size(data: Any) -> int:
    """Decoded bytes of base64 ``data`` (its text length when it is not base64)."""
    text = data if isinstance(data, str) else str(data or "")
    try:
        return len(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError):
        return len(text)


def _holds(text: str, structured: Any) -> bool:
    if isinstance(structured, dict) and list(structured) == ["result"]:
        value = structured["result"]
        if text == (value if isinstance(value, str) else compact_json(value)) or _same_json(text, value):
            return True
    return _same_json(text, structured)


def _same_json(text: str, value: Any) -> bool:
    if text.strip()[:1] not in ("{", "["):
        return False
    try:
        return json.loads(text) == value
    except ValueError:
        return False
