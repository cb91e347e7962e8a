"""The fault-injection harness: infrastructure failures at a seeded rate, for measuring what
they do to training (``rollout.fault_rate`` in a run config; docs/design.md, "Failures").

A :class:`FaultPlan` decides, for each tool call (and, in ``AgentRunner``, each attempt of an
OpenAI-API agent), whether the infrastructure "fails" it: the call raises
:class:`agentrl.InfraError` with cause ``injected`` before the tool runs. The decision is a
hash of the plan's seed, the rollout's seed, the trajectory id and the call's index, so it is
the same run to run whatever the order in which concurrent calls execute, and a retried
attempt (a new rollout seed) draws afresh.

    >>> from agentrl.toolbox.tool import ToolContext
    >>> plan = FaultPlan(rate=0.5, seed=0)
    >>> a = [plan.fails(ToolContext("g/0", seed=1), k) for k in range(64)]
    >>> a == [plan.fails(ToolContext("g/0", seed=1), k) for k in range(64)], 16 < sum(a) < 48
    (True, True)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentrl.types import InfraError

if TYPE_CHECKING:
    from agentrl.toolbox.tool import ToolContext

INJECTED_CAUSE = "injected"


@dataclass(frozen=True)
class FaultPlan:
    """Fail a share ``rate`` of tool calls (and agent attempts), decided by seeded hashing."""

    rate: float  # in [0, 1]: the probability that one call fails
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"fault rate {self.rate!r} must be in [0, 1]")

    def draw(self, *key: object) -> bool:
        """True with probability ``rate``, as a pure function of ``key``."""
        if self.rate <= 0.0:
            return False
        h = hashlib.blake2b(repr((self.seed, *key)).encode(), digest_size=8).digest()
        return int.from_bytes(h, "big") / 2.0**64 < self.rate

    def fails(self, context: "ToolContext", index: int) -> bool:
        return self.draw("tool", context.seed, context.trajectory_id, index)

    def maybe_fail(self, tool_name: str, context: "ToolContext") -> None:
        """Count the call; raise InfraError (cause ``injected``) when the plan fails it."""
        index, context.calls = context.calls, context.calls + 1
        if self.fails(context, index):
            raise InfraError(f"injected infrastructure fault (rollout.fault_rate={self.rate:g}) "
                             f"on call {index} to {tool_name!r}", cause=INJECTED_CAUSE)
