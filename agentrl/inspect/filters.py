"""Which trajectories ``inspect`` shows: step, group, reward, finish reason, tool error, index.

Training or evaluation: a run directory holds both (``step_*.jsonl`` and
``eval_step_*.jsonl``); a selection reads one kind, training unless asked for evaluation
(``--eval``) or the PATH holds evaluation rollouts only. ``--index N`` is the N-th
(0-based) trajectory among those that pass the other filters, in file order.

``pick`` says which of the matches to keep when more match than ``limit``: ``first``
(file order: whole groups, for the HTML group view) or ``spread`` (highest, median and
lowest reward, from distinct groups: the terminal's default, so three attempts shown
are three different ones).

Example::

    from agentrl.types import Trajectory, Verdict
    cond = RewardCondition.parse(">=0.5")
    assert cond.holds(1.0) and not cond.holds(0.0) and not cond.holds(None)
    sel = Selection(reward=RewardCondition.parse("==1"), finish_reason="stop")
    t = Trajectory([1], 1, [0], [0.0], [], [], verdict=Verdict(1.0))
    assert sel.matches(t, step=None)
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass

from agentrl.inspect.sources import InspectError
from agentrl.types import Trajectory

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
    "=": operator.eq,
}
_COND_RE = re.compile(r"^\s*(>=|<=|==|!=|>|<|=)?\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$")


@dataclass(frozen=True)
class RewardCondition:
    """A comparison such as ``>0``, ``==1``, ``<0.5`` (a bare number means ``==``)."""

    op: str
    value: float

    @staticmethod
    def parse(text: str) -> "RewardCondition":
        m = _COND_RE.match(text)
        if not m:
            raise InspectError(
                f"--reward {text!r}: expected an operator and a number, e.g. '>0', '==1', '<0.5'"
            )
        return RewardCondition(m.group(1) or "==", float(m.group(2)))

    def holds(self, reward: float | None) -> bool:
        if reward is None or math.isnan(reward):
            return False
        if self.op in ("==", "="):
            return math.isclose(reward, self.value, abs_tol=1e-9)
        if self.op == "!=":
            return not math.isclose(reward, self.value, abs_tol=1e-9)
        return _OPS[self.op](reward, self.value)


def has_tool_error(t: Trajectory) -> bool:
    return any(c.error for c in t.tool_calls)


@dataclass(frozen=True)
class Selection:
    """Filters; a field left as None does not filter. ``limit`` caps how many are kept."""

    step: int | None = None
    last_step: bool = False  # --step last: resolved against the file list
    group: str | None = None
    reward: RewardCondition | None = None
    finish_reason: str | None = None
    tool_error: bool | None = None
    index: int | None = None
    limit: int = 3
    evaluation: bool | None = None  # True: eval rollouts; False: training; None: training if any, else eval
    read_all: bool = False  # read every file (the summary of the whole run) while selecting from some
    pick: str = "first"  # "first" or "spread" (see the module doc)

    def wants_step(self, step: int | None) -> bool:
        return self.step is None or step == self.step

    def matches(self, t: Trajectory, step: int | None) -> bool:
        """Every filter except ``index`` and ``limit`` (those count matches)."""
        if not self.wants_step(step):
            return False
        if self.group is not None and t.group_id != self.group:
            return False
        if self.reward is not None and not self.reward.holds(t.reward):
            return False
        if self.finish_reason is not None and t.finish_reason != self.finish_reason:
            return False
        if self.tool_error is not None and has_tool_error(t) != self.tool_error:
            return False
        return True
