"""What the model sees from a tool: the result as text, capped to a token budget.

Tool output is untrusted and can be huge (a ``print`` in a loop, a scraped page). The cap keeps
the head and the tail, where the useful parts usually are (the command echo and the final
error or answer), and says how much was cut in between.

Example::

    from agentrl.toolbox.output import cap_tokens

    text, cut = cap_tokens("x" * 10_000, tokenizer=None, max_tokens=100)   # 4 chars per token
    assert cut and len(text) <= 400 and "characters cut" in text
"""

from __future__ import annotations

import json
import math
from typing import Any, Protocol

# Without a tokenizer the budget is counted in characters, at this many per token.
CHARS_PER_TOKEN = 4
# Upper bound on characters per token used to pre-cut huge text before tokenizing it: tokenizing
# 1 MB takes seconds, and a long run without whitespace is quadratic in some BPE pre-tokenizers.
# A piece of this many characters per kept token holds at least that many tokens for ordinary
# text; with longer tokens the result just keeps fewer tokens than allowed.
_PRECUT_CHARS_PER_TOKEN = 16
_REPLACEMENT = "\ufffd"


class TextTokenizer(Protocol):
    """The two methods of a Hugging Face tokenizer the cap needs."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


def to_text(value: Any) -> str:
    """A tool's return value as the text the model reads: str as is, dict/list as JSON,
    bytes decoded as UTF-8 (invalid bytes replaced), anything else through ``str``.

    >>> to_text({"a": [1, 2]}), to_text(3.5), to_text(b"ok")
    ('{"a": [1, 2]}', '3.5', 'ok')
    """
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, default=str)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    return str(value)


def cut_note(count: int, unit: str, estimated: bool = False) -> str:
    """The marker put where text was removed, e.g. ``"\\n...[1234 tokens cut]...\\n"``."""
    return f"\n...[{'~' if estimated else ''}{count} {unit} cut]...\n"


def cap_tokens(text: str, tokenizer: TextTokenizer | None, max_tokens: int) -> tuple[str, bool]:
    """Cap ``text`` to about ``max_tokens`` tokens, keeping head and tail; returns (text, was_cut).

    With ``n`` tokens and a note of ``k`` tokens, the kept head is ``ceil((max_tokens - k) / 2)``
    tokens and the tail ``floor((max_tokens - k) / 2)``, so the whole result re-encodes to about
    ``max_tokens`` (a token or two more where the pieces re-merge at the seams). Pieces are
    decoded with the tokenizer; a multi-byte character split at a seam is dropped rather than
    left as U+FFFD. Text longer than 16 characters per allowed token is pre-cut by characters
    first, so a 1 MB result costs a few milliseconds; the count in the note is then an estimate
    (marked ``~``) from the token density of the kept pieces. ``tokenizer=None`` counts
    4 characters per token and reports characters cut.

    >>> cap_tokens("short", None, 10)
    ('short', False)
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    if tokenizer is None:
        return _cap_chars(text, max_tokens * CHARS_PER_TOKEN)
    window = max_tokens * _PRECUT_CHARS_PER_TOKEN
    if len(text) <= 2 * window:
        ids = _encode(tokenizer, text)
        if len(ids) <= max_tokens:
            return text, False
        head_ids = tail_ids = ids
        total, estimated = len(ids), False
    else:
        head_ids = _encode(tokenizer, text[:window])
        tail_ids = _encode(tokenizer, text[-window:])
        sampled = len(head_ids) + len(tail_ids)
        middle = math.ceil((len(text) - 2 * window) * sampled / (2 * window))
        total, estimated = sampled + middle, True
    # The note's own length depends on the count; one refinement pass settles it.
    keep = max_tokens
    for _ in range(2):
        note = cut_note(total - keep, "tokens", estimated=estimated)
        keep = max(0, max_tokens - len(_encode(tokenizer, note)))
    n_head = (keep + 1) // 2
    n_tail = keep - n_head
    head = _decode_clean(tokenizer, head_ids[:n_head], trim_end=True)
    tail = _decode_clean(tokenizer, tail_ids[len(tail_ids) - n_tail :] if n_tail else [], trim_end=False)
    note = cut_note(total - keep, "tokens", estimated=estimated)
    return head + note + tail, True


def _cap_chars(text: str, max_chars: int) -> tuple[str, bool]:
    if len(text) <= max_chars:
        return text, False
    keep = max_chars
    for _ in range(2):
        note = cut_note(len(text) - keep, "characters")
        keep = max(0, max_chars - len(note))
    n_head = (keep + 1) // 2
    n_tail = keep - n_head
    note = cut_note(len(text) - keep, "characters")
    return text[:n_head] + note + (text[len(text) - n_tail :] if n_tail else ""), True


def _encode(tokenizer: TextTokenizer, text: str) -> list[int]:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return list(getattr(ids, "ids", ids))  # a raw `tokenizers.Tokenizer` returns an Encoding


def _decode_clean(tokenizer: TextTokenizer, ids: list[int], trim_end: bool) -> str:
    """Decode, dropping up to 3 seam tokens that only hold part of a multi-byte character."""
    for _ in range(4):
        text = tokenizer.decode(ids)
        broken = text.endswith(_REPLACEMENT) if trim_end else text.startswith(_REPLACEMENT)
        if not broken or not ids:
            return text
        ids = ids[:-1] if trim_end else ids[1:]
    return tokenizer.decode(ids)
