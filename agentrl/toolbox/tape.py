"""The tool side of a run's tape: every call a ToolBox ran, recorded, and served back on replay.

A :class:`ToolTape` set on ``ToolBox.tape`` sees every ``execute``. It numbers each call by
its attempt (the context's ``trajectory_id`` and rollout ``seed``: a retried attempt runs
under another seed, so its calls are numbered apart) and, by mode:

- ``record``: runs the call and keeps a :class:`CallRecord` of what came back (content,
  error kind, latency, the infrastructure failure and the in-place retries);
- ``serve``: returns the recorded outcome of the same-numbered call without running the
  tool. A call whose name or arguments differ from the recorded one, or that has no record,
  is a divergence (:class:`CallDivergence`); it is still answered (the recorded outcome, or
  an ``infra`` failure when there is none) so the replay goes on to report every one;
- ``live``: runs the call and compares what came back with the record (``--live-tools``).

Example::

    import asyncio
    from agentrl.toolbox import ToolBox, tool
    from agentrl.toolbox.tape import ToolTape

    @tool
    def add(a: int, b: int) -> int:
        '''Add.

        Args:
            a: x
            b: y
        '''
        return a + b

    box = ToolBox([add])
    box.tape = ToolTape()
    asyncio.run(box.execute("add", {"a": 1, "b": 2}, box.new_context("s1d0/t0/0", 5)))
    calls = box.tape.take(lambda tid: True)
    box.tape = ToolTape("serve", calls)
    r = asyncio.run(box.execute("add", {"a": 1, "b": 2}, box.new_context("s1d0/t0/0", 5)))
    assert r.content == "3" and box.tape.divergences == []
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from agentrl.toolbox.tool import ToolContext, ToolResult
from agentrl.types import Failure

MODES = ("record", "serve", "live")


@dataclass
class CallRecord:
    """One ``ToolBox.execute`` as it came back. ``(trajectory_id, seed, index)`` names it:
    the ``index``-th call of that attempt's context."""

    trajectory_id: str  # "<group_prefix><task id>/<sample index>", e.g. "s3d0/t17/2"
    seed: int | None  # the rollout's seed (the context's); retry rounds differ here
    index: int  # 0-based, in the order the attempt issued its calls
    name: str
    arguments: Any  # as the model wrote them: a dict, or the raw JSON text
    content: str  # the observation (capped)
    error: str | None
    latency_s: float
    truncated: bool = False
    failure: Failure | None = None
    retried: list[Failure] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, int | None, int]:
        return self.trajectory_id, self.seed, self.index

    def result(self) -> ToolResult:
        return ToolResult(content=self.content, error=self.error, latency_s=self.latency_s, truncated=self.truncated,
                          failure=self.failure, retried=list(self.retried))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("failure", "retried", "truncated"):  # written when set: tapes of plain runs stay small
            if not d[k]:
                del d[k]
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "CallRecord":
        return CallRecord(
            trajectory_id=str(d["trajectory_id"]), seed=d.get("seed"), index=int(d["index"]), name=str(d["name"]),
            arguments=d.get("arguments"), content=str(d["content"]), error=d.get("error"),
            latency_s=float(d.get("latency_s", 0.0)), truncated=bool(d.get("truncated", False)),
            failure=None if d.get("failure") is None else Failure(**d["failure"]),
            retried=[Failure(**f) for f in d.get("retried") or []])


@dataclass
class CallDivergence:
    """A replayed call that is not the recorded one, or a live outcome that differs from it."""

    trajectory_id: str
    seed: int | None
    index: int
    what: str  # "call" (name/arguments), "missing" (no record), "content", "error"
    recorded: str
    replayed: str

    def describe(self) -> str:
        return (f"tool call {self.index} of attempt {self.trajectory_id} (seed {self.seed}): {self.what} differs\n"
                f"  recorded: {self.recorded[:300]}\n  replayed: {self.replayed[:300]}")


Run = Callable[[str, Any, ToolContext], Awaitable[ToolResult]]


class ToolTape:
    """Records, serves or checks a ToolBox's calls (module docstring). Thread-safe: the
    asynchronous producer's rollout thread and the trainer's thread may share one."""

    def __init__(self, mode: str = "record", calls: list[CallRecord] | None = None,
                 record_if: Callable[[str], bool] | None = None):
        """``record_if``: in record mode, the attempts (by ``trajectory_id``) whose calls are
        kept; the others' only run (a run's evaluations are not a step's data)."""
        if mode not in MODES:
            raise ValueError(f"ToolTape mode {mode!r}: one of {', '.join(MODES)}")
        self.mode = mode
        self.record_if = record_if
        self._lock = threading.Lock()
        self._next: dict[tuple[str, int | None], int] = {}
        self._calls: dict[tuple[str, int | None, int], CallRecord] = {c.key: c for c in calls or []}
        self.divergences: list[CallDivergence] = []
        self.served = 0

    def _number(self, ctx: ToolContext) -> int:
        with self._lock:
            k = (ctx.trajectory_id, ctx.seed)
            i = self._next.get(k, 0)
            self._next[k] = i + 1
            return i

    async def through(self, run: Run, name: str, arguments: Any, ctx: ToolContext) -> ToolResult:
        """``run(name, arguments, ctx)``, recorded, served from the tape or checked against it."""
        if self.mode == "record" and self.record_if is not None and not self.record_if(ctx.trajectory_id):
            return await run(name, arguments, ctx)
        index = self._number(ctx)  # numbered before any await: the attempt's own call order
        if self.mode == "record":
            res = await run(name, arguments, ctx)
            with self._lock:
                self._calls[(ctx.trajectory_id, ctx.seed, index)] = _record(ctx, index, name, arguments, res)
            return res
        rec = self._calls.get((ctx.trajectory_id, ctx.seed, index))
        if rec is None:
            self._diverge(ctx, index, "missing", "(no recorded call)", _call_text(name, arguments))
        elif (rec.name, rec.arguments) != (name, arguments):
            self._diverge(ctx, index, "call", _call_text(rec.name, rec.arguments), _call_text(name, arguments))
        if self.mode == "serve":
            if rec is None:
                return ToolResult("Error: replay: this call is not on the tape", "infra", 0.0, False,
                                  failure=Failure("replay", "not_on_tape", "the call is not on the tape"))
            self.served += 1
            return rec.result()
        res = await run(name, arguments, ctx)  # live: run it again and compare
        if rec is not None and res.content != rec.content:
            self._diverge(ctx, index, "content", rec.content, res.content)
        elif rec is not None and res.error != rec.error:
            self._diverge(ctx, index, "error", str(rec.error), str(res.error))
        return res

    def _diverge(self, ctx: ToolContext, index: int, what: str, recorded: str, replayed: str) -> None:
        with self._lock:
            self.divergences.append(CallDivergence(ctx.trajectory_id, ctx.seed, index, what, recorded, replayed))

    def take(self, keep: Callable[[str], bool]) -> list[CallRecord]:
        """Remove and return the recorded calls whose ``trajectory_id`` passes ``keep``, in
        (attempt, seed, index) order, and forget those attempts' call numbering (they are over);
        the others stay (a later step's, already in flight)."""
        with self._lock:
            out = sorted((c for c in self._calls.values() if keep(c.trajectory_id)),
                         key=lambda c: (c.trajectory_id, str(c.seed), c.index))
            for c in out:
                del self._calls[c.key]
            for k in [k for k in self._next if keep(k[0])]:
                del self._next[k]
            return out


def _record(ctx: ToolContext, index: int, name: str, arguments: Any, res: ToolResult) -> CallRecord:
    return CallRecord(trajectory_id=ctx.trajectory_id, seed=ctx.seed, index=index, name=name, arguments=arguments,
                      content=res.content, error=res.error, latency_s=res.latency_s, truncated=res.truncated,
                      failure=res.failure, retried=list(res.retried))


def _call_text(name: str, arguments: Any) -> str:
    return f"{name}({arguments!r})"
