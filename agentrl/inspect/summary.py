"""Per-file summary rows, accumulated one trajectory at a time (no list of trajectories kept).

A group has zero variance when all its rewards are equal (max - min <= 1e-6): its
advantages are all 0, so it gives no learning signal (docs/design.md, "The objective").
Evaluation rows (``eval_step_*.jsonl``) are never trained: the views show no group,
zero-variance or trained-token statistics for them (``SummaryRow.evaluation``).

Example::

    from agentrl.types import Trajectory, Verdict
    acc = SummaryAccumulator("step 1")
    for g, r in [("a", 1.0), ("a", 0.0), ("b", 1.0), ("b", 1.0)]:
        acc.add(Trajectory([1, 2], 1, [0, 1], [0.0, -0.1], [], [], verdict=Verdict(r), group_id=g))
    row = acc.row()
    assert (row.attempts, row.groups, row.zero_variance_groups) == (4, 2, 1)
    assert row.reward_mean == 0.75
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from agentrl.types import Trajectory

ZERO_VARIANCE_TOL = 1e-6


@dataclass(frozen=True)
class SummaryRow:
    """One line of the summary table (a step or a file)."""

    label: str
    attempts: int
    reward_mean: float | None
    groups: int
    zero_variance_groups: int
    finish_reasons: dict[str, int]
    tool_calls: int
    tool_errors: int
    mean_tokens: float
    model_token_frac: float  # share of tokens with loss_mask == 1
    problems: int
    evaluation: bool = False  # held-out evaluation: groups / zero-var / trained do not apply

    @property
    def finish_text(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(self.finish_reasons.items(), key=lambda kv: -kv[1]))


@dataclass
class SummaryAccumulator:
    """Streaming statistics of one file; ``add`` each trajectory, then ``row()``."""

    label: str
    evaluation: bool = False
    attempts: int = 0
    _reward_sum: float = 0.0
    _rewarded: int = 0
    _group_range: dict[str, tuple[float, float]] = field(default_factory=dict)
    _finish: Counter = field(default_factory=Counter)
    _tool_calls: int = 0
    _tool_errors: int = 0
    _tokens: int = 0
    _model_tokens: int = 0
    problems: int = 0

    def add(self, t: Trajectory) -> None:
        self.attempts += 1
        self._finish[t.finish_reason] += 1
        self._tool_calls += len(t.tool_calls)
        self._tool_errors += sum(1 for c in t.tool_calls if c.error)
        self._tokens += len(t.token_ids)
        self._model_tokens += sum(t.loss_mask)
        if t.reward is None:
            return
        self._reward_sum += t.reward
        self._rewarded += 1
        lo, hi = self._group_range.get(t.group_id, (t.reward, t.reward))
        self._group_range[t.group_id] = (min(lo, t.reward), max(hi, t.reward))

    def row(self) -> SummaryRow:
        n = self.attempts
        return SummaryRow(
            label=self.label,
            attempts=n,
            reward_mean=self._reward_sum / self._rewarded if self._rewarded else None,
            groups=len(self._group_range),
            zero_variance_groups=sum(1 for lo, hi in self._group_range.values() if hi - lo <= ZERO_VARIANCE_TOL),
            finish_reasons=dict(self._finish),
            tool_calls=self._tool_calls,
            tool_errors=self._tool_errors,
            mean_tokens=self._tokens / n if n else 0.0,
            model_token_frac=self._model_tokens / self._tokens if self._tokens else 0.0,
            problems=self.problems,
            evaluation=self.evaluation,
        )


def training_cells(r: SummaryRow) -> tuple[str, str, str]:
    """The (groups, zero-var, trained) cells of a row: "—" for evaluation, which never trains."""
    if r.evaluation:
        return ("—", "—", "—")
    return (str(r.groups), f"{r.zero_variance_groups}/{r.groups}", f"{100 * r.model_token_frac:.0f}%")


def failure_lines(t: Trajectory) -> list[str]:
    """What the infrastructure did to this attempt (docs/design.md, "Failures"): a failure that
    stood (excluded from its group and the loss) and the failed tries before this one.

    >>> from agentrl.types import Failure
    >>> t = Trajectory([1], 1, [0], [0.0], [], [], failure=Failure("tool:python", "sandbox_died", "gone"))
    >>> failure_lines(t)
    ['infrastructure failure (tool:python, sandbox_died): gone — excluded: no reward, no advantage, not trained']
    """
    out = []
    if t.failure is not None:
        f = t.failure
        out.append(f"infrastructure failure ({f.source}, {f.cause}): {f.message} — excluded: no reward, "
                   "no advantage, not trained")
    if t.retried:
        tries = ", ".join(f"{f.source} ({f.cause})" for f in t.retried)
        out.append(f"retried {len(t.retried)} time{'s' if len(t.retried) > 1 else ''} after infrastructure "
                   f"failures: {tries}")
    return out


def segment_note(t: Trajectory) -> str:
    """For an attempt that became several segments (an OpenAI-API agent rewrote its history, or
    the rollout compacted its context): which part, and where the compaction points are."""
    c = t.compaction
    if c is not None and (c.segments > 1 or c.error):
        cut = f" · compaction failed: {c.error}" if c.error else ""
        return f"  · segment {c.index + 1} of {c.segments} (context compacted: {c.mode}){cut}"
    if t.agent is None or t.agent.segments < 2:
        return ""
    return f"  · segment {t.agent.index + 1} of {t.agent.segments} (the agent rewrote its history)"
