"""JSON Lines files: the data files a user writes (problems, corpora), read with errors that
name the file and line, so the fix is obvious; and a run's ``metrics.jsonl``, read line by
line by the trainer (on resume) and the viewer alike (:func:`scan_metrics`). Trajectory
files: ``agentrl.types.read_jsonl``.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "d.jsonl"
    >>> _ = p.write_text('{"a": 1}\\n\\n{"a": 2}\\n')
    >>> [(r.line, r.value) for r in read_objects(p)]
    [(1, {'a': 1}), (3, {'a': 2})]
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator


@dataclass(frozen=True)
class JsonObject:
    """One object of a data file and where it stands (for error messages)."""

    path: Path
    line: int  # 1-based; 0 for the items of a JSON list file
    value: dict[str, Any]

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def read_objects(path: str | Path, *, allow_json_list: bool = False) -> list[JsonObject]:
    """Every JSON object of a ``.jsonl`` (or ``.jsonl.gz``) file, blank lines skipped. With
    ``allow_json_list``, a file holding one JSON list of objects is read too."""
    path = Path(path)
    text = gzip.open(path, "rt", encoding="utf-8").read() if path.suffix == ".gz" else path.read_text(encoding="utf-8")
    if allow_json_list and text.lstrip().startswith("["):
        rows = json.loads(text)
        if not all(isinstance(r, dict) for r in rows):
            raise ValueError(f"{path}: a JSON list must hold objects, one per record")
        return [JsonObject(path, 0, r) for r in rows]
    out = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not valid JSON ({e.msg}); expected one JSON object per line") from None
        if not isinstance(value, dict):
            raise ValueError(f"{path}:{n}: expected a JSON object per line, got {type(value).__name__}")
        out.append(JsonObject(path, n, value))
    return out


@dataclass
class MetricLine:
    """One line of a metrics file: its decoded row, or why it could not be read."""

    lineno: int
    row: dict | None  # {"step": s, ...}; None when unreadable
    problem: str | None = None  # e.g. "truncated last line" (a kill mid-write)


def scan_metrics(path: Path) -> Iterator[MetricLine]:
    """Every non-empty line of a metrics file, in order: the one reader of metrics.jsonl."""
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
                int(row["step"])
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as e:
                what = "truncated last line" if not raw.endswith(b"\n") else f"unreadable metrics line ({e})"
                yield MetricLine(lineno, None, what)
                continue
            yield MetricLine(lineno, row)
