"""Stream trajectories from JSONL files, one line at a time, reporting bad lines.

A viewer exists to look at broken data, so reading never stops at the first problem:
a malformed line, a truncated last line (a run killed mid-write) or a missing field is
reported as ``file:line: what`` and reading goes on. A trajectory that breaks an
invariant of docs/design.md (e.g. a mask off by one) is still yielded, with a warning, so
the user can see the bug.

Example::

    import tempfile, os
    from agentrl.types import Span, Trajectory
    t = Trajectory(token_ids=[1, 2], prompt_len=1, loss_mask=[0, 1], logprobs=[0.0, -0.5],
                   spans=[Span(0, 1, "prompt"), Span(1, 2, "model")], messages=[])
    path = os.path.join(tempfile.mkdtemp(), "r.jsonl")
    with open(path, "w") as f:
        f.write(t.to_json() + "\\n" + '{"token_ids": [1')   # second line truncated
    items = list(iter_file(RolloutFile(Path(path), None)))
    assert isinstance(items[0], Record) and items[0].line == 1
    assert isinstance(items[1], Problem) and "truncated" in items[1].what
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.inspect.sources import RolloutFile
from agentrl.types import JSONL_KEYS, Span, Trajectory

# Fields every line written by Trajectory.to_json carries (old_logprobs and agent are optional).
EXPECTED_FIELDS: tuple[str, ...] = JSONL_KEYS


@dataclass(frozen=True)
class Problem:
    """Something wrong at ``path:line``. ``skipped`` is True when the line is not shown."""

    path: Path
    line: int
    what: str
    skipped: bool

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


@dataclass
class Record:
    """A trajectory and where it came from."""

    trajectory: Trajectory
    path: Path
    line: int
    step: int | None
    evaluation: bool = False  # a held-out evaluation attempt (eval_step_*.jsonl): never trained

    @property
    def step_label(self) -> str:
        """``step 5``, ``eval @ step 5`` (evaluation), or "" when the step is unknown."""
        if self.step is None:
            return "eval" if self.evaluation else ""
        return f"eval @ step {self.step}" if self.evaluation else f"step {self.step}"

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def _derived_spans(mask: list[int], prompt_len: int) -> list[Span]:
    """Spans rebuilt from the mask when a line has none: mask runs -> model / unknown."""
    spans: list[Span] = []
    for i, m in enumerate(mask):
        kind = "prompt" if i < prompt_len else ("model" if m else "unknown")
        if spans and spans[-1].kind == kind:
            spans[-1].end = i + 1
        else:
            spans.append(Span(i, i + 1, kind))
    return spans


def parse_trajectory(d: dict[str, Any]) -> tuple[Trajectory, list[str]]:
    """Build a Trajectory from a decoded line, filling missing fields; returns (traj, notes).

    Raises KeyError/TypeError/ValueError when the line cannot be shown at all.
    """
    if "token_ids" not in d:
        raise KeyError("token_ids")
    notes: list[str] = []
    missing = [k for k in EXPECTED_FIELDS if k not in d]
    if missing:
        notes.append("missing field" + ("s " if len(missing) > 1 else " ") + ", ".join(missing))
    n = len(d["token_ids"])
    raw_spans = d.get("spans")
    filled = {"loss_mask": [0] * n, "logprobs": [0.0] * n, "prompt_len": 0, "messages": [], **d}
    if raw_spans is None:
        filled["spans"] = [vars(s) for s in _derived_spans([int(x) for x in filled["loss_mask"]],
                                                           int(filled["prompt_len"]))]
    t = Trajectory.from_json(filled)
    if raw_spans is None:
        return t, notes  # derived spans use kind "unknown": check() would only repeat "missing spans"
    try:
        t.check()
    except ValueError as e:
        notes.append(f"invariant broken: {e}")
    return t, notes


def iter_file(f: RolloutFile) -> Iterator[Record | Problem]:
    """Yield a Record per readable line and a Problem per bad one, in file order."""
    with open(f.path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                d = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                if not raw.endswith(b"\n"):
                    what = "truncated last line (no newline at end: the writer was likely killed mid-write)"
                else:
                    what = f"malformed JSON ({e.msg if isinstance(e, json.JSONDecodeError) else e})"
                yield Problem(f.path, lineno, what, skipped=True)
                continue
            if not isinstance(d, dict):
                yield Problem(f.path, lineno, f"expected a JSON object, got {type(d).__name__}", skipped=True)
                continue
            try:
                t, notes = parse_trajectory(d)
            except KeyError as e:
                yield Problem(f.path, lineno, f"missing field {e.args[0]} (line skipped)", skipped=True)
                continue
            except (TypeError, ValueError, AttributeError) as e:
                yield Problem(f.path, lineno, f"bad field value: {e} (line skipped)", skipped=True)
                continue
            for note in notes:
                yield Problem(f.path, lineno, note, skipped=False)
            yield Record(t, f.path, lineno, f.step)
