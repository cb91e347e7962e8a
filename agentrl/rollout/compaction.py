"""Context compaction of the built-in rollout: an attempt that outgrows its context budget goes
on in a new segment (docs/compaction.md).

``rollout.context_budget`` is the model's window in tokens. When the tool results of a turn
would leave fewer than ``rollout.max_new_tokens`` of it for the next turn, the attempt compacts
(``rollout.compaction``):

- ``summarize``: the results are appended, then a user message asking for a summary (the
  environment's ``compaction_prompt`` or :data:`DEFAULT_COMPACTION_PROMPT`); the policy
  samples the summary as an ordinary assistant turn (mask 1: trained, with the attempt's
  advantage) and the attempt goes on in a new segment rendered once from
  ``[system, user(task + SUMMARY_HEADER + summary)]``, then extended by deltas as usual;
- ``frozen_summary``: the same, but the summary's tokens are kind ``summary`` (mask 0): the
  policy writes it and is not trained on it (the baseline of a fixed summarizer);
- ``truncate``: the new segment is ``[system, task]`` plus the most recent tool turns that fit
  (the turn in progress always kept), re-rendered; nothing is sampled (a baseline).

Every segment is a trajectory with the attempt's group id and sample index, so the checker
scores the attempt once (on its last segment), all its segments get that verdict and one
advantage, and the attempt counts once in its group's mean and std (the rule the OpenAI
endpoint's history splits use: ``agentrl.run.scoring.score_all``,
``agentrl.algo.update.compute_advantages``). ``Trajectory.compaction`` says which segment is
which. A compaction that cannot go on (the summary ran out of tokens, or leaves no room for the
next turn; nothing to drop; ``rollout.max_compactions`` reached) ends the attempt ``length``
with ``CompactionSegment.error`` naming why: a policy failure, not a crash.

Example (the rule that decides when, in tokens)::

    >>> overflows(length=180, appended=40, room=48, budget=256)
    True
    >>> overflows(length=100, appended=40, room=48, budget=256)
    False
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from agentrl.chat import ChatTemplate, Segment, TemplateError
from agentrl.engines.base import Generation
from agentrl.env import DEFAULT_COMPACTION_PROMPT, SUMMARY_HEADER, resume_messages  # noqa: F401  (re-exported)
from agentrl.rollout.base import RolloutConfig
from agentrl.types import (CompactionSegment, ConfigError, Message, TokenSequence, ToolCall, ToolCallRecord,
                           Trajectory)


@dataclass
class ClosedSegment:
    """A finished segment of a compacted attempt: its tokens, transcript and tool calls."""

    seq: TokenSequence
    messages: list[Message]
    records: list[ToolCallRecord]
    turns: int  # model turns sampled in it (its summary turn included)


@dataclass
class CompactionState:
    """One attempt's compaction so far (on the runner's attempt; None when compaction is off)."""

    head: list[Message]  # [system, user(task)]: what every new segment starts from
    mode: str  # rollout.compaction
    closed: list[ClosedSegment] = field(default_factory=list)
    summary_due: bool = False  # the request is appended: the attempt's next generation is the summary
    error: str | None = None  # why compaction could not go on (the attempt ended "length")
    turns_before: int = 0  # the attempt's model turns before the current segment


@dataclass
class SummaryRequest:
    """What a summary mode appends before the summary: the results and the instruction."""

    segments: list[Segment]  # their ids, by span kind
    messages: list[Message]  # the same as messages (the transcript the checker and templates read)

    @property
    def length(self) -> int:
        return sum(len(s.token_ids) for s in self.segments)


class Attempt(Protocol):
    """What compaction reads and writes of the runner's attempt (``rollout.runner._Attempt``)."""

    seq: TokenSequence
    messages: list[Message]
    records: list[ToolCallRecord]
    pending: list[ToolCall | str]
    turns: int
    finish_reason: str | None
    sampled_end: str | None
    compaction: CompactionState | None


def overflows(length: int, appended: int, room: int, budget: int) -> bool:
    """The rule: compact when the sequence, once ``appended`` more tokens are in, would leave
    fewer than ``room`` (``rollout.max_new_tokens``) tokens of the budget for the next turn."""
    return length + appended + room > budget


def tool_rounds(history: list[Message]) -> list[list[Message]]:
    """``history`` (after the head) cut before each assistant message: one model turn with the
    tool results it got.

    >>> [[m.role for m in r] for r in tool_rounds([Message("assistant", ""), Message("tool", "1"),
    ...                                             Message("assistant", ""), Message("tool", "2")])]
    [['assistant', 'tool'], ['assistant', 'tool']]
    """
    rounds: list[list[Message]] = []
    for m in history:
        if m.role == "assistant" or not rounds:
            rounds.append([])
        rounds[-1].append(m)
    return rounds


class Compactor:
    """Compaction for one runner's rollouts (``RolloutRunner`` holds one when it is on)."""

    def __init__(self, chat: ChatTemplate, config: RolloutConfig):
        if chat.format.mid_turn is not None:
            raise ConfigError(f"rollout.compaction={config.compaction} compacts between turns, and "
                              f"tool_call_format={chat.tool_call_format!r} runs its calls inside a turn: use a "
                              "format whose calls end the turn (hermes...) or rollout.compaction=none")
        assert config.context_budget is not None  # RolloutConfig refuses compaction without a budget
        self.chat, self.mode = chat, config.compaction
        self.limit = min(config.max_total_tokens, config.context_budget)  # a segment's length never exceeds it
        self.room = config.max_new_tokens
        self.prompt = config.compaction_prompt or DEFAULT_COMPACTION_PROMPT
        self.max_compactions = config.max_compactions

    def check_prompt(self, task_id: str, prompt_len: int) -> None:
        """A task whose prompt leaves no room for a turn is a configuration error, named with its fix."""
        if prompt_len + self.room > self.limit:
            raise ConfigError(
                f"task {task_id!r}: the prompt has {prompt_len} tokens, and the context budget "
                f"({self.limit} tokens: rollout.context_budget, rollout.max_total_tokens) must hold it plus "
                f"rollout.max_new_tokens={self.room} for a turn: raise rollout.context_budget to at least "
                f"{prompt_len + self.room} or lower rollout.max_new_tokens")

    def handle(self, a: Attempt, new: list[Message], segments: list[Segment], tools: list[dict] | None) -> bool:
        """Decide before the tool results ``new`` (their continuation ``segments``) go in: False
        when they fit (the caller appends them as usual); else compact or end the attempt, and
        True. ``truncate`` compacts when the results would leave fewer than max_new_tokens of
        the budget for the next turn. The summary modes compact one turn ahead, while the
        summary still fits: when, after these results, a next turn (max_new_tokens) and results
        as long as these, the summary request and the summary (max_new_tokens) would not."""
        request: SummaryRequest | None = None
        if self.mode != "truncate":
            try:
                request = self._request(a, new, tools)
            except Exception as e:  # a template that cannot render it: the rollout's template rule
                a.finish_reason, a.pending = "error", []
                a.records[-1].error = a.records[-1].error or f"template: {e}"
                return True
        plain = sum(len(s.token_ids) for s in segments)
        ahead = plain if request is None else plain + self.room + request.length + self.room
        if not overflows(len(a.seq), ahead, 0 if request is not None else self.room, self.limit):
            return False
        self._compact(a, new, request, tools)
        return True

    def _request(self, a: Attempt, new: list[Message], tools: list[dict] | None) -> "SummaryRequest":
        """The results and the summary request as one continuation: a user message after the
        results; for a template that refuses a user turn right after tool results (Mistral's
        strict alternation), the instruction ends the last result instead (then part of its
        ``tool`` span)."""
        ask = [*new, Message("user", self.prompt)]
        try:
            segments = self.chat.continuation(a.messages, ask, tools, a.sampled_end)
        except TemplateError:
            last = new[-1]
            ask = [*new[:-1], Message(last.role, f"{last.content}\n\n{self.prompt}", last.tool_calls,
                                      last.tool_call_id, last.name)]
            return SummaryRequest(self.chat.continuation(a.messages, ask, tools, a.sampled_end), ask)
        # the request's text is the harness's, not a tool's: the last content segment
        last_content = max(i for i, s in enumerate(segments) if s.kind == "tool")
        segments[last_content] = Segment(segments[last_content].token_ids, "template")
        return SummaryRequest(segments, ask)

    # -- the overflow: compact, or end the attempt ---------------------------------------

    def _compact(self, a: Attempt, new: list[Message], request: "SummaryRequest | None",
                 tools: list[dict] | None) -> None:
        """Truncate now, or append the summary request (the next generation is the summary),
        or end the attempt. ``a.pending`` is cleared either way."""
        st = a.compaction
        assert st is not None
        a.pending = []
        if len(st.closed) >= self.max_compactions:
            return self._fail(a, f"max_compactions: the attempt compacted {len(st.closed)} times "
                                 "(rollout.max_compactions)")
        if request is None:
            return self._truncate(a, new, tools)
        if len(a.seq) + request.length + 1 > self.limit:
            return self._fail(a, f"no_room: the tool results and the summary request leave no token of the "
                                 f"{self.limit}-token budget for the summary")
        for s in request.segments:
            a.seq.append(s.token_ids, s.kind)
        a.messages.extend(request.messages)
        st.summary_due = True

    def absorb_summary(self, a: Attempt, g: Generation, budget: int, tools: list[dict] | None) -> None:
        """Append the sampled summary (``model`` or, frozen, ``summary`` tokens), close the
        segment and start the next from [system, task + summary]; or end the attempt when
        the summary did not finish or leaves no room for a turn."""
        st = a.compaction
        assert st is not None and st.summary_due
        st.summary_due = False
        ids, lps, finish = g.token_ids, g.logprobs, g.finish_reason
        if len(ids) > budget:
            ids, lps, finish = ids[:budget], lps[:budget], "length"
        a.turns += 1
        if self.mode == "summarize":  # trained like any turn, with the attempt's advantage
            a.seq.append(ids, "model", lps)
        else:  # frozen: sampled by the policy, not trained (mask 0, log-probs 0.0 by convention 2)
            a.seq.append(ids, "summary")
        stopped = bool(ids) and ids[-1] in self.chat.stop_token_ids
        text = self.chat.tokenizer.decode(ids[:-1] if stopped else ids, skip_special_tokens=False)
        summary = self.chat.parse_assistant(text, tools).content.strip()  # calls in a summary are not run
        a.messages.append(Message("assistant", summary))
        if finish == "length" or not (stopped or finish == "stop"):
            return self._fail(a, f"summary_overflow: the summary did not end within {len(ids)} tokens "
                                 "(rollout.max_new_tokens, the budget left)")
        head = resume_messages(st.head, summary)
        prompt = self.chat.encode_prompt(head, tools)
        if len(prompt) + self.room > self.limit:
            return self._fail(a, f"summary_overflow: the new context would have {len(prompt)} tokens, leaving "
                                 f"fewer than rollout.max_new_tokens={self.room} of the {self.limit}-token budget")
        self._open(a, prompt, head, records=[])

    # -- truncate -------------------------------------------------------------------------

    def _truncate(self, a: Attempt, new: list[Message], tools: list[dict] | None) -> None:
        """Drop the oldest tool turns, keeping the turn in progress, until the rest fits."""
        st = a.compaction
        assert st is not None
        rounds = tool_rounds(a.messages[len(st.head):])
        for k in range(1, len(rounds)):  # k oldest rounds dropped; the last (its results are `new`) kept
            kept = [m for r in rounds[k:] for m in r] + new
            prompt = self.chat.encode_prompt([*st.head, *kept], tools)
            if len(prompt) + self.room <= self.limit:
                recent = a.records[len(a.records) - len(new):]
                a.records = a.records[:len(a.records) - len(new)]
                return self._open(a, prompt, [*st.head, *kept], records=recent)
        self._fail(a, "no_room: even the turn in progress alone does not fit the budget with room for a turn")

    # -- segments -------------------------------------------------------------------------

    def _open(self, a: Attempt, prompt: list[int], messages: list[Message], records: list[ToolCallRecord]) -> None:
        st = a.compaction
        assert st is not None
        st.closed.append(ClosedSegment(a.seq, a.messages, a.records, a.turns - st.turns_before))
        st.turns_before = a.turns
        a.seq = TokenSequence()
        a.seq.append(prompt, "prompt")
        a.messages, a.records, a.sampled_end = messages, records, None

    def _fail(self, a: Attempt, why: str) -> None:
        assert a.compaction is not None
        a.compaction.error, a.finish_reason, a.pending = why, "length", []


def finish_segments(a: Attempt, segment: "SegmentMaker") -> list[Trajectory]:
    """The attempt's trajectories, first segment to last, each marked with where it sits."""
    st = a.compaction
    if st is None:
        return [segment(a.seq, a.messages, a.records, a.turns)]
    parts = [*st.closed, ClosedSegment(a.seq, a.messages, a.records, a.turns - st.turns_before)]
    out = [segment(p.seq, p.messages, p.records, p.turns) for p in parts]
    for i, t in enumerate(out):
        t.compaction = CompactionSegment(index=i, segments=len(out), mode=st.mode, error=st.error)
    return out


class SegmentMaker(Protocol):
    """Builds one trajectory of an attempt from a segment's pieces (the runner's ``_segment``)."""

    def __call__(self, seq: TokenSequence, messages: list[Message], records: list[ToolCallRecord],
                 turns: int) -> Trajectory: ...


def compaction_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """A step's compaction figures, over its attempts ({} when none compacted or could: the
    metrics of runs without compaction are unchanged). ``compaction/segments`` is the mean
    number of segments per attempt, ``compaction/compacted_frac`` the share of attempts that
    compacted at least once, ``compaction/failed_frac`` the share a compaction error ended.

    >>> t = Trajectory([1], 1, [0], [0.0], [], [], compaction=CompactionSegment(0, 2, "summarize"))
    >>> compaction_metrics([t, Trajectory([1], 1, [0], [0.0], [], [], sample_index=1)])
    {'compaction/segments': 1.5, 'compaction/compacted_frac': 0.5, 'compaction/failed_frac': 0.0}
    """
    last: dict[tuple[str, int], Trajectory] = {}
    for t in trajs:
        last[(t.group_id, t.sample_index)] = t
    marks = [t.compaction for t in last.values()]
    if not any(m is not None for m in marks):
        return {}
    n = len(marks)
    return {"compaction/segments": sum(m.segments if m else 1 for m in marks) / n,
            "compaction/compacted_frac": sum(bool(m and m.segments > 1) for m in marks) / n,
            "compaction/failed_frac": sum(bool(m and m.error) for m in marks) / n}
