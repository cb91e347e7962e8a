"""One streaming pass over the rollout files: summary rows, the selected trajectories, problems.

Memory is O(shown trajectories + groups per file): every line is parsed, counted in the
summary, tested against the filters, and dropped unless it is among the first ``limit``
matches.

Example::

    import tempfile, pathlib
    from agentrl.types import Span, Trajectory, Verdict
    d = pathlib.Path(tempfile.mkdtemp())
    t = Trajectory([1, 2], 1, [0, 1], [0.0, -0.2], [Span(0, 1, "prompt"), Span(1, 2, "model")], [],
                   verdict=Verdict(1.0), group_id="g")
    (d / "step_000001.jsonl").write_text((t.to_json() + "\\n") * 5)
    res = scan(find_sources(str(d)), Selection(limit=2))
    assert res.matched == 5 and len(res.selected) == 2 and res.rows[0].attempts == 5
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agentrl.inspect.filters import Selection
from agentrl.inspect.loader import Problem, Record, iter_file
from agentrl.inspect.sources import RolloutFile, Sources, find_sources  # noqa: F401 (doc example)
from agentrl.inspect.summary import SummaryAccumulator, SummaryRow

MAX_KEPT_PROBLEMS = 200
_HINT_GROUPS = 5


@dataclass
class ScanResult:
    """What one pass found. ``problems`` keeps the first MAX_KEPT_PROBLEMS of ``problem_count``."""

    rows: list[SummaryRow]
    selected: list[Record]
    matched: int  # trajectories that passed the filters (before index/limit)
    problems: list[Problem] = field(default_factory=list)
    problem_count: int = 0
    group_hint: list[str] = field(default_factory=list)  # some group ids seen, for "no match" help


def files_for(sources: Sources, selection: Selection) -> list[RolloutFile]:
    """The files a selection needs: all, one step, or the last step (``--step last``)."""
    if selection.last_step:
        stepped = [f for f in sources.files if f.step is not None]
        return stepped[-1:] if stepped else sources.files[-1:]
    # Unnumbered files are read too: their lines may carry metadata["step"].
    return [f for f in sources.files if f.step is None or selection.wants_step(f.step)]


def record_step(f: RolloutFile, metadata: dict) -> int | None:
    """A trajectory's step: from its file name, else from ``metadata["step"]``."""
    if f.step is not None:
        return f.step
    step = metadata.get("step")
    return step if isinstance(step, int) else None


def scan(sources: Sources, selection: Selection) -> ScanResult:
    """Read every selected file line by line; keep only what will be shown."""
    res = ScanResult(rows=[], selected=[], matched=0)
    for f in files_for(sources, selection):
        acc = SummaryAccumulator(f.label)
        for item in iter_file(f):
            if isinstance(item, Problem):
                res.problem_count += 1
                acc.problems += 1
                if len(res.problems) < MAX_KEPT_PROBLEMS:
                    res.problems.append(item)
                continue
            t = item.trajectory
            item.step = record_step(f, t.metadata)
            acc.add(t)
            if len(res.group_hint) < _HINT_GROUPS and t.group_id not in res.group_hint:
                res.group_hint.append(t.group_id)
            if not selection.matches(t, step=item.step):
                continue
            pos = res.matched
            res.matched += 1
            if selection.index is not None and pos != selection.index:
                continue
            if len(res.selected) < selection.limit:
                res.selected.append(item)
        res.rows.append(acc.row())
    return res
