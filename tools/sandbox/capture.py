"""Bounded capture of a process's output while it runs: the first and last bytes are kept.

Untrusted code can print gigabytes, binary, or invalid UTF-8. The parent reads the pipe as
the output arrives (so the child never blocks on a full pipe), keeps ``head`` bytes from the
start and ``tail`` bytes from the end, counts the rest, and turns it into clean text at the end.

Example::

    from agentrl.tools.sandbox.capture import OutputCapture
    cap = OutputCapture(max_chars=10)
    cap.feed(b"0123456789" * 3)
    assert cap.text() == "01234\\n...[20 bytes cut]...\\n56789" and cap.total == 30
"""

from __future__ import annotations

from agentrl.toolbox.output import cut_note

# C0 controls (but tab, newline, carriage return) and DEL become U+FFFD: a NUL or an escape
# sequence in a tool observation only confuses tokenizers and terminal viewers.
_CONTROL = {c: "\ufffd" for c in [*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F]}


class OutputCapture:
    """Keeps ``max_chars // 2`` leading and ``max_chars - max_chars // 2`` trailing bytes."""

    def __init__(self, max_chars: int) -> None:
        self.head_limit = max_chars // 2
        self.tail_limit = max_chars - self.head_limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data[-self.tail_limit :] if self.tail_limit else b""
            if len(self.tail) > self.tail_limit:
                del self.tail[: len(self.tail) - self.tail_limit]

    @property
    def cut(self) -> int:
        """Bytes dropped between head and tail."""
        return self.total - len(self.head) - len(self.tail)

    def raw(self) -> bytes:
        """Head and tail bytes, without a note (for exact searches such as the checker's token)."""
        return bytes(self.head + self.tail)

    def text(self) -> str:
        """Head and tail decoded as UTF-8 (invalid bytes replaced), with a note where bytes were cut."""
        head = clean(bytes(self.head))
        if not self.cut:
            return head + clean(bytes(self.tail))
        return head + cut_note(self.cut, "bytes") + clean(bytes(self.tail))  # the note every capped output uses


def clean(data: bytes) -> str:
    """Decode untrusted bytes for a model to read.

    >>> clean(b"ok\\x00\\xff")
    'ok\\ufffd\\ufffd'
    """
    return data.decode("utf-8", errors="replace").translate(_CONTROL)
