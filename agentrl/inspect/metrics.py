"""Read a run's ``metrics.jsonl`` into per-metric series, streaming and tolerant of bad lines.

Each line is one JSON object with ``step`` and any number of numeric metrics; eval
metrics (``eval/accuracy``) appear only on eval steps. Long runs are thinned to at most
``max_points`` points per series (evenly strided, last point kept) for plotting.

Example::

    import tempfile, pathlib
    p = pathlib.Path(tempfile.mkdtemp()) / "metrics.jsonl"
    p.write_text('{"step": 1, "reward/mean": 0.25}\\n{"step": 2, "reward/mean": 0.5, "eval/accuracy": 0.4}\\n{"st')
    m = read_series(p)
    assert m.series["reward/mean"].values == [0.25, 0.5]
    assert m.series["eval/accuracy"].steps == [2]
    assert len(m.problems) == 1
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from agentrl.inspect.loader import Problem
from agentrl.jsonl import scan_metrics

# The curves the HTML page draws, in order, when present. reward/std draws a band.
PLOTTED = ("reward/mean", "eval/accuracy", "groups/zero_variance_frac", "tools/calls_per_traj",
           "tools/error_rate", "loss", "kl")


@dataclass
class Series:
    """One metric over steps."""

    name: str
    steps: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    def thinned(self, max_points: int) -> "Series":
        n = len(self.steps)
        if n <= max_points:
            return self
        idx = sorted({round(k * (n - 1) / (max_points - 1)) for k in range(max_points)})
        return Series(self.name, [self.steps[i] for i in idx], [self.values[i] for i in idx])


@dataclass
class Metrics:
    series: dict[str, Series]
    problems: list[Problem]

    def band(self, name: str) -> tuple[list[float], list[float]] | None:
        """(lower, upper) = mean ∓ std for ``reward/mean`` when ``reward/std`` is logged at the same steps."""
        if name != "reward/mean" or "reward/std" not in self.series:
            return None
        mean, std = self.series["reward/mean"], self.series["reward/std"]
        if mean.steps != std.steps:
            return None
        return ([m - s for m, s in zip(mean.values, std.values)], [m + s for m, s in zip(mean.values, std.values)])


def read_series(path: Path, max_problems: int = 20) -> Metrics:
    """Series of every numeric metric in the file; bad lines become Problems."""
    out = Metrics(series={}, problems=[])
    for line in scan_metrics(path):
        if line.row is None:
            if len(out.problems) < max_problems:
                out.problems.append(Problem(path, line.lineno, line.problem or "unreadable", skipped=True))
            continue
        step = int(line.row["step"])
        for k, v in line.row.items():
            if k == "step" or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                continue
            s = out.series.setdefault(k, Series(k))
            s.steps.append(step)
            s.values.append(float(v))
    return out
