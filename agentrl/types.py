"""Typed boundary objects of the data flow: messages, tool calls, spans, token sequences,
trajectories, and the error a user's configuration raises.

Conventions (see docs/design.md, "Conventions"):
- ``loss_mask[t] == 1`` means "the policy generated token t; train on it".
- ``spans`` label every token exactly once with a kind in ``SPAN_KINDS``.
- ``logprobs[t]`` is the sampler's log-prob of token t (0.0 where the mask is 0).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

SpanKind = Literal["prompt", "model", "tool", "template", "summary"]
# "summary": a context-compaction summary the policy sampled but is not trained on
# (rollout.compaction=frozen_summary, docs/compaction.md): mask 0 like every non-model kind
SPAN_KINDS: tuple[str, ...] = ("prompt", "model", "tool", "template", "summary")

FinishReason = Literal["stop", "length", "max_turns", "error"]
FINISH_REASONS: tuple[str, ...] = ("stop", "length", "max_turns", "error")
# The group ids of held-out evaluation attempts: eval/<task id> (written by the run, read by the viewer).
EVAL_GROUP_PREFIX = "eval/"


class ConfigError(ValueError):
    """A configuration a user wrote that cannot be used as is (raised by every layer that
    reads a setting: the run config, the model loaders, the parallel plan)."""


class InfraError(RuntimeError):
    """Not the model's fault: raise it from a tool, a checker or an agent when the
    infrastructure failed (a sandbox that could not start or died outside the model's code, a
    search backend that is down, a lost connection). The attempt is then retried with a new
    seed stream and, if it keeps failing, left out of its group's baseline and the loss
    instead of being scored 0 (docs/design.md, "Failures"). ``cause`` is a short slug that the
    metrics count (``infra/cause/<cause>``).

    >>> e = InfraError("the search index is unreadable", cause="index_unreadable")
    >>> e.cause, str(e)
    ('index_unreadable', 'the search index is unreadable')
    """

    def __init__(self, message: str, *, cause: str = "infra", retryable: bool = True) -> None:
        super().__init__(message)
        self.cause = _slug(cause)
        # True: calling again is the same call (a stateless tool), so the ToolBox retries the
        # call in place; False: state was lost (a stateful worker died), only the attempt can rerun
        self.retryable = retryable


def _slug(text: str) -> str:
    """A metric-name-safe cause: lower case letters, digits and underscores."""
    out = "".join(c if c.isalnum() else "_" for c in str(text).strip().lower()).strip("_")
    return out[:48] or "infra"


# An attempt's outcome: it ran ("ok"), the model failed ("policy": scored, as any attempt),
# or the infrastructure failed ("infra": retried, then excluded from baseline and loss).
OUTCOMES: tuple[str, ...] = ("ok", "policy", "infra")


@dataclass
class ToolCall:
    """A call the model asked for, parsed from its text."""

    name: str
    arguments: dict[str, Any]  # JSON object decoded from the model's text
    id: str | None = None  # call id, when the template uses one

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI / transformers chat-message shape used by chat templates."""
        out: dict[str, Any] = {
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        if self.id is not None:
            out["id"] = self.id
        return out


@dataclass
class Message:
    """One chat message. ``role`` is system | user | assistant | tool."""

    role: str
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)  # assistant only
    tool_call_id: str | None = None  # tool only: the call it answers
    name: str | None = None  # tool only: the tool's name

    def to_chat(self) -> dict[str, Any]:
        """Dict form that jinja chat templates (and transformers) expect."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out

    @staticmethod
    def from_chat(d: dict[str, Any]) -> "Message":
        calls = []
        for c in d.get("tool_calls") or []:
            fn = c.get("function", c)
            args = fn.get("arguments", {})
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    args = {"_raw": args}
            calls.append(ToolCall(name=fn["name"], arguments=args, id=c.get("id")))
        return Message(
            role=d["role"],
            content=d.get("content") or "",
            tool_calls=calls,
            tool_call_id=d.get("tool_call_id"),
            name=d.get("name"),
        )


@dataclass
class Failure:
    """An infrastructure failure of one try of an attempt (see :class:`InfraError`).

    ``source`` says where: ``tool:<name>`` (the tool raised InfraError), ``agent`` (an
    OpenAI-API agent's harness or its connection), ``checker`` (the environment's ``score``
    raised); the fault-injection harness (``rollout.fault_rate``) fails them with cause
    ``injected``."""

    source: str
    cause: str  # a short slug: InfraError.cause, or the exception's class name
    message: str  # the error text, cut to 500 characters

    @staticmethod
    def of(source: str, exc: BaseException) -> "Failure":
        cause = exc.cause if isinstance(exc, InfraError) else _slug(type(exc).__name__)
        text = f"{type(exc).__name__}: {exc}" if not isinstance(exc, InfraError) else str(exc)
        return Failure(source=source, cause=cause, message=text[:500])


@dataclass
class ToolCallRecord:
    """What happened when a tool call ran inside a rollout."""

    name: str
    arguments: dict[str, Any]
    result: str  # the observation the model saw (after capping)
    error: str | None  # short error kind/message when the call failed, else None
    latency_s: float
    turn: int  # index of the model turn that issued the call (0-based)
    retried: list[Failure] = field(default_factory=list)  # infrastructure failures of this call retried in place


@dataclass
class Span:
    """Tokens ``[start, end)`` of a trajectory, all of one kind."""

    start: int
    end: int
    kind: str  # one of SPAN_KINDS


@dataclass
class TokenSequence:
    """One attempt's token ids as they grow, with per-token mask and log-probs; spans merge
    adjacent same-kind appends.

    Every append names the kind of the tokens; the mask and spans follow from the kind, so
    they cannot disagree: ``model`` tokens get mask 1 and their sampler log-probs, every
    other kind gets mask 0 and log-prob 0.0.
    """

    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.token_ids)

    def append(self, ids: list[int], kind: str, logprobs: list[float] | None = None) -> None:
        if kind not in SPAN_KINDS:
            raise ValueError(f"unknown span kind {kind!r}; expected one of {SPAN_KINDS}")
        if not ids:
            return
        if kind == "model":
            if logprobs is None or len(logprobs) != len(ids):
                raise ValueError("model tokens need one sampler log-prob each")
            self.loss_mask.extend([1] * len(ids))
            self.logprobs.extend(float(x) for x in logprobs)
        else:
            self.loss_mask.extend([0] * len(ids))
            self.logprobs.extend([0.0] * len(ids))
        start = len(self.token_ids)
        self.token_ids.extend(ids)
        if self.spans and self.spans[-1].kind == kind:
            self.spans[-1].end = len(self.token_ids)
        else:
            self.spans.append(Span(start=start, end=len(self.token_ids), kind=kind))


@dataclass
class Task:
    """One prompt of an environment. ``answer`` is hidden from the model."""

    id: str
    prompt: str  # the user message
    answer: str  # gold answer the checker compares against
    family: str = "default"  # task family, for per-family metrics
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class Verdict:
    """What the checker said of one attempt (``run.evaluate.score_all``). Every segment of a
    split attempt carries its attempt's verdict. An OpenAI-API agent that raised or timed out
    gets ``Verdict(0.0)`` from its runner instead (``AgentSegment.error`` says why)."""

    reward: float
    info: dict[str, Any] = field(default_factory=dict)  # the checker's explanation (Score.info); JSON "score"


@dataclass
class TrainerMarks:
    """What the trainer added to a sampled trajectory; all unset until it runs."""

    advantage: float | None = None  # the attempt's group advantage (algo.update.compute_advantages)
    filtered: bool = False  # an objective filter kept it out of the loss (run.trainer)
    staleness: int | None = None  # policy versions between its sampler and the update (run.producer, async runs)
    old_logprobs: list[float] | None = None  # π_old per token, len(token_ids), 0.0 where mask 0 (algo.update)


@dataclass
class AgentSegment:
    """Where a trajectory sits in an attempt of an agent written against the OpenAI API
    (``serve.capture``, ``rollout.agent_runner``); ``None`` on the built-in runner's."""

    index: int  # 0-based position of this segment among the attempt's segments
    segments: int  # trajectories the attempt became (1 + history rewrites that sampled again)
    splits: int = 0  # times the agent rewrote its history in this attempt
    error: str | None = None  # the agent raised or timed out: its error text (its verdict is then 0)


@dataclass
class CompactionSegment:
    """Where a trajectory sits in a compacted attempt of the built-in runner
    (``rollout.compaction``, ``agentrl.rollout.compaction``; docs/compaction.md); ``None`` when
    compaction is off. The segments of an attempt share its group id and sample index: they
    get one verdict and one advantage and count once in their group, as a split agent's do."""

    index: int  # 0-based position of this segment among the attempt's segments
    segments: int  # trajectories the attempt became (1 + compactions)
    mode: str  # rollout.compaction: truncate | summarize | frozen_summary
    error: str | None = None  # why compaction could not go on (the attempt then ended "length"); None if it could


@dataclass
class Trajectory:
    """One attempt: the full token sequence with mask, sampler log-probs and spans.

    Its own fields are what the sampler produced. Three typed records hold the rest: what
    the checker said (``verdict``), what the trainer added (``trained``), and, for agents
    written against the OpenAI API, which segment of the attempt this is (``agent``).
    ``metadata`` is the caller's free-form dict: agentrl writes none of its keys.

    Shapes: ``token_ids``, ``loss_mask``, ``logprobs`` (and ``trained.old_logprobs`` when
    set) all have length ``len(token_ids)``; ``spans`` tile ``[0, len(token_ids))``.
    """

    token_ids: list[int]
    prompt_len: int
    loss_mask: list[int]
    logprobs: list[float]
    spans: list[Span]
    messages: list[Message]
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    group_id: str = ""
    sample_index: int = 0
    finish_reason: str = "stop"
    policy_version: int = 0
    task_id: str = ""  # the Task it attempts
    family: str = ""  # the task's family (per-family accuracy)
    turns: int = 0  # model turns sampled
    void_turns: int = 0  # turns with neither a tool call nor an answer (SimpleTIR's filter)
    verdict: Verdict | None = None  # None until scored
    trained: TrainerMarks = field(default_factory=TrainerMarks)
    agent: AgentSegment | None = None
    compaction: CompactionSegment | None = None  # a compacted attempt's segment (rollout.compaction)
    # an infrastructure failure that stood after the retries: no reward, no advantage, not in
    # its group's statistics nor the loss (docs/design.md, "Failures"); None when it ran
    failure: Failure | None = None
    retried: list[Failure] = field(default_factory=list)  # earlier tries of this attempt that failed
    metadata: dict[str, Any] = field(default_factory=dict)  # the caller's own: agentrl writes none of its keys

    # Read-only shortcuts to the values the loss is built from; writers set the records.
    @property
    def reward(self) -> float | None:
        return None if self.verdict is None else self.verdict.reward

    @property
    def advantage(self) -> float | None:
        return self.trained.advantage

    @property
    def old_logprobs(self) -> list[float] | None:
        return self.trained.old_logprobs

    @property
    def outcome(self) -> str:
        """``infra`` (an infrastructure failure stood), ``policy`` (the model's own failure:
        out of tokens or turns, a template error, a failed tool call, an agent that raised)
        or ``ok``; see :data:`OUTCOMES`."""
        if self.failure is not None:
            return "infra"
        if (self.finish_reason != "stop" or any(c.error for c in self.tool_calls)
                or (self.agent is not None and self.agent.error is not None)):
            return "policy"
        return "ok"

    @property
    def num_model_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def response_len(self) -> int:
        return len(self.token_ids) - self.prompt_len

    def to_json(self) -> str:
        """One JSONL line. The keys are flat as in earlier files (``reward``, ``score`` from the
        verdict; ``advantage``, ``filtered``, ``staleness``, ``old_logprobs`` from the trainer's
        marks); ``agent`` (the AgentSegment's fields) and ``old_logprobs`` only when set."""
        # built by hand: dataclasses.asdict deep-copies every token list (~9x slower)
        v, marks = self.verdict, self.trained
        d: dict[str, Any] = {f: getattr(self, f) for f in _TOKEN_FIELDS}
        d.update(reward=self.reward, advantage=marks.advantage)
        d.update({f: getattr(self, f) for f in _SAMPLER_SCALARS})
        d.update(score={} if v is None else v.info, filtered=marks.filtered, staleness=marks.staleness,
                 metadata=self.metadata)
        d["spans"] = [{"start": s.start, "end": s.end, "kind": s.kind} for s in self.spans]
        d["messages"] = [m.to_chat() for m in self.messages]
        d["tool_calls"] = [_call_json(c) for c in self.tool_calls]
        if marks.old_logprobs is not None:
            d["old_logprobs"] = marks.old_logprobs
        if self.agent is not None:
            d["agent"] = asdict(self.agent)
        if self.compaction is not None:
            d["compaction"] = asdict(self.compaction)
        if self.failure is not None:
            d["failure"] = asdict(self.failure)
        if self.retried:
            d["retried"] = [asdict(f) for f in self.retried]
        return json.dumps(d, ensure_ascii=False)

    @staticmethod
    def from_json(line: str | dict[str, Any]) -> "Trajectory":
        """One JSONL line (or its decoded dict). Older files keep some fields under ``metadata``
        (the bookkeeping before it was typed; ``segment``/``segments``/``splits``/``agent_error``
        before ``agent``): they are read from there into the typed fields."""
        d = json.loads(line) if isinstance(line, str) else dict(line)
        meta = dict(d.get("metadata") or {})
        legacy = {k: meta.pop(k) for k in _TYPED_BOOKKEEPING if k in meta and k not in d}
        d = {**legacy, **d}
        agent = d.get("agent")
        if agent is None and "agent" not in d and ("splits" in meta or "segments" in meta):
            agent = {"index": meta.pop("segment", 0), "segments": meta.pop("segments", 1),
                     "splits": meta.pop("splits", 0), "error": meta.pop("agent_error", None)}
        old = d.get("old_logprobs")
        comp = d.get("compaction")
        return Trajectory(
            token_ids=[int(x) for x in d["token_ids"]],
            prompt_len=int(d["prompt_len"]),
            loss_mask=[int(x) for x in d["loss_mask"]],
            logprobs=[float(x) for x in d["logprobs"]],
            spans=[Span(int(s["start"]), int(s["end"]), str(s["kind"])) for s in d["spans"]],
            messages=[Message.from_chat(m) for m in d["messages"]],
            tool_calls=[ToolCallRecord(**{**c, "retried": [Failure(**f) for f in c.get("retried") or []]})
                        for c in d.get("tool_calls", [])],
            group_id=str(d.get("group_id", "")),
            sample_index=int(d.get("sample_index", 0)),
            finish_reason=str(d.get("finish_reason", "stop")),
            policy_version=int(d.get("policy_version", 0)),
            task_id=str(d.get("task_id", "")),
            family=str(d.get("family", "")),
            turns=int(d.get("turns", 0)),
            void_turns=int(d.get("void_turns", 0)),
            verdict=None if d.get("reward") is None else Verdict(float(d["reward"]), dict(d.get("score") or {})),
            trained=TrainerMarks(
                advantage=None if d.get("advantage") is None else float(d["advantage"]),
                filtered=bool(d.get("filtered", False)),
                staleness=None if d.get("staleness") is None else int(d["staleness"]),
                old_logprobs=None if old is None else [float(x) for x in old]),
            agent=None if agent is None else AgentSegment(
                index=int(agent["index"]), segments=int(agent["segments"]), splits=int(agent.get("splits", 0)),
                error=None if agent.get("error") is None else str(agent["error"])),
            compaction=None if comp is None else CompactionSegment(
                index=int(comp["index"]), segments=int(comp["segments"]), mode=str(comp["mode"]),
                error=None if comp.get("error") is None else str(comp["error"])),
            failure=None if d.get("failure") is None else Failure(**d["failure"]),
            retried=[Failure(**f) for f in d.get("retried") or []],
            metadata=meta,
        )

    def check(self) -> None:
        """Raise ValueError if the trajectory breaks an invariant of docs/design.md (conventions 2 and 3)."""
        n = len(self.token_ids)
        if not (len(self.loss_mask) == len(self.logprobs) == n):
            raise ValueError(
                f"length mismatch: token_ids={n} loss_mask={len(self.loss_mask)} "
                f"logprobs={len(self.logprobs)}"
            )
        if self.old_logprobs is not None and len(self.old_logprobs) != n:
            raise ValueError("old_logprobs length differs from token_ids")
        pos = 0
        for s in self.spans:
            if s.start != pos or s.end <= s.start or s.kind not in SPAN_KINDS:
                raise ValueError(f"spans do not tile the sequence at {s}")
            want = 1 if s.kind == "model" else 0
            if any(m != want for m in self.loss_mask[s.start : s.end]):
                raise ValueError(f"loss_mask disagrees with span {s}")
            pos = s.end
        if pos != n:
            raise ValueError(f"spans end at {pos}, sequence has {n} tokens")
        if any(lp != 0.0 for lp, m in zip(self.logprobs, self.loss_mask) if m == 0):
            raise ValueError("logprobs must be 0.0 where loss_mask is 0")
        if self.spans and self.spans[0].kind != "prompt":
            raise ValueError("a trajectory starts with a prompt span")
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"unknown finish_reason {self.finish_reason!r}")


# Bookkeeping that older files kept under ``metadata`` (read from there by from_json).
_TYPED_BOOKKEEPING = ("task_id", "family", "turns", "void_turns", "score", "filtered", "staleness")
# The sampler's fields, in the order to_json writes them (around reward/advantage, score...).
_TOKEN_FIELDS = ("token_ids", "prompt_len", "loss_mask", "logprobs")
_SAMPLER_SCALARS = ("group_id", "sample_index", "finish_reason", "policy_version", "task_id", "family", "turns",
                    "void_turns")
# The keys every line to_json writes carries ("old_logprobs", "agent", "compaction", "failure", "retried"
# only when set).
JSONL_KEYS: tuple[str, ...] = (*_TOKEN_FIELDS, "spans", "messages", "tool_calls", "reward", "advantage",
                               *_SAMPLER_SCALARS, "score", "filtered", "staleness", "metadata")


def _call_json(c: ToolCallRecord) -> dict[str, Any]:
    d = asdict(c)
    if not c.retried:  # written only when set: the lines of runs without failures are unchanged
        del d["retried"]
    return d


def write_jsonl(path: str, trajectories: list[Trajectory], append: bool = False) -> None:
    """Write trajectories one per line; each line is flushed whole."""
    with open(path, "a" if append else "w", encoding="utf-8") as f:
        for t in trajectories:
            f.write(t.to_json() + "\n")
        f.flush()


def read_jsonl(path: str) -> list[Trajectory]:
    """Read every complete line of a trajectory JSONL file."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                out.append(Trajectory.from_json(line))
    return out
