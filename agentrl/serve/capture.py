"""Token capture of one attempt's chat requests: merged into one trajectory while each request
extends the last, split into several where the agent rewrote its history.

A request *extends* the attempt's current segment when its messages start with exactly the
segment's messages (the earlier requests' conversation and every assistant turn the endpoint
returned, as returned: content and tool calls with their ids) and it offers the same tools.
Then the sampled ids stay as they were and only the template/tool delta after them is
tokenized (``ChatTemplate.continuation``, mask 0). Otherwise (the agent dropped, edited or
summarised messages, or changed its tools) a new segment starts from the rendered prompt.
Each segment becomes one trajectory; all of an attempt's segments carry its reward.

Requests of one attempt may be in flight together (an agent that fans out: ``asyncio.gather``
of several completions, parallel sub-agents). Each independent history is its own segment: a
request is matched against every segment that has no request in flight (a busy one cannot
be extended: its next turn is not sampled yet), and a later request that extends one of them
merges back into it, token-in-token-out within each. A new segment counts as a *split* only
when it starts while none of the attempt's requests is in flight (the agent rewrote its
history); one started beside an in-flight request is a concurrent history. Trajectories come
out in the order of each segment's last sampled turn, so the last one holds the attempt's
last reply (the one the checker reads).

A request whose messages differ from the segment's may still extend its *tokens*: agents that
re-send the model's turn as text (smolagents appends ``Calling tools: [...]`` to it and sends
the results as user ``Observation:`` messages) render a conversation that starts with exactly
the text the model was given and sampled. Then the segment goes on too: the rendering's text
after the segment's (the agent's additions, template text, the new messages) is appended
(mask 0), the sampled ids stay, and the engine is given those ids, so what it conditions on is
what is recorded. New user and system messages are ``prompt`` spans, tool results ``tool``
spans, the rest ``template``.

>>> from agentrl.chat import ChatTemplate
>>> from agentrl.models.tiny import ensure_tiny_model
>>> from transformers import AutoTokenizer
>>> chat = ChatTemplate(AutoTokenizer.from_pretrained(ensure_tiny_model()))
>>> cap = AttemptCapture(chat, max_total_tokens=512)
>>> turn = cap.begin([Message("user", "2+2?")], None)
>>> turn.seg.seq.spans[0].kind, len(cap.segments), turn.seg.busy
('prompt', 1, True)
>>> cap.release(turn)  # not recorded (the request failed): the attempt is as it was
>>> len(cap.segments)
0
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from agentrl.chat import ChatTemplate, TemplateError, encode_literal
from agentrl.chat.template import _PLACEHOLDER, _PLACEHOLDER_RE, split_rendered
from agentrl.engines.base import Generation
from agentrl.types import TokenSequence
from agentrl.types import AgentSegment, Message, ToolCall, ToolCallRecord, Trajectory


@dataclass
class Segment:
    """A contiguous stretch of an attempt: one growing token sequence."""

    seq: TokenSequence
    messages: list[Message]  # the conversation rendered into ``seq`` (ends with a returned assistant turn)
    tools: list[dict] | None
    sampled_end: str | None = None  # the turn-closing marker the last sampled turn ended with
    finish_reason: str = "stop"  # of its last generation
    turns: int = 0  # generations sampled into it
    busy: bool = False  # a request of it is in flight (it cannot be extended until that turn is recorded)
    last_turn: int = 0  # when its last turn was recorded (the capture's count of recorded turns)


@dataclass
class Turn:
    """One request's hold on the segment it extends or starts (``AttemptCapture.begin``), with
    what undoes it when the request fails before its turn is recorded."""

    seg: Segment
    new: bool  # it started the segment
    split: bool  # that start counted as a split
    undo: tuple[int, list, list[Message], str | None]  # (length, spans, messages, sampled_end) before
    recorded: bool = False


def same_call(a: ToolCall, b: ToolCall) -> bool:
    return a.name == b.name and a.arguments == b.arguments and (a.id or None) == (b.id or None)


def same_message(a: Message, b: Message) -> bool:
    """Equal as the agent sees them (content, calls and their ids, the tool message's call id)."""
    return (a.role == b.role and (a.content or "") == (b.content or "") and a.tool_call_id == b.tool_call_id
            and len(a.tool_calls) == len(b.tool_calls) and all(map(same_call, a.tool_calls, b.tool_calls)))


@dataclass
class AttemptCapture:
    """Every segment of one attempt (see the module docstring). Not thread-safe: the service
    calls it from its event loop only; requests interleave only while they await the engine."""

    chat: ChatTemplate
    max_total_tokens: int
    segments: list[Segment] = field(default_factory=list)
    sampled_tokens: int = 0  # over all segments (the attempt's token budget counts these)
    splits: int = 0  # new segments started while none of the attempt's requests was in flight
    recorded: int = 0  # turns recorded, all segments together

    @staticmethod
    def extends(seg: Segment, messages: list[Message], tools: list[dict] | None) -> bool:
        """The request's messages start with exactly ``seg``'s, and add some, with the same tools."""
        if seg.busy or tools != seg.tools:
            return False
        n = len(seg.messages)
        return len(messages) > n and all(map(same_message, seg.messages, messages[:n]))

    def begin(self, messages: list[Message], tools: list[dict] | None) -> Turn:
        """Take this request's segment: the idle one its messages extend (the longest such
        history), else the idle one whose text its rendering extends, else a new one. Its ids
        to generate from are ``turn.seg.seq.token_ids``; ``record`` or ``release`` ends it."""
        idle = [s for s in self.segments if not s.busy]
        fits = [s for s in idle if self.extends(s, messages, tools)]
        seg = max(reversed(fits), key=lambda s: len(s.messages)) if fits else None
        delta = None
        if seg is None:
            found = [(len(s.seq), s, d) for s in reversed(idle) if (d := self.text_extension(s, messages, tools))]
            if found:
                _, seg, delta = max(found, key=lambda f: f[0])
        if seg is None:
            split = bool(self.segments) and not any(s.busy for s in self.segments)
            seq = TokenSequence()
            seq.append(self.chat.encode_prompt(messages, tools), "prompt")
            seg = Segment(seq, list(messages), tools)
            self.segments.append(seg)
            self.splits += split
            turn = Turn(seg, True, split, (0, [], [], None))
        else:
            turn = Turn(seg, False, False, (len(seg.seq), [replace(x) for x in seg.seq.spans], list(seg.messages),
                                            seg.sampled_end))
            if delta is None:
                new = messages[len(seg.messages):]
                pieces = self.chat.continuation(seg.messages, new, tools, seg.sampled_end)
                for piece, kind in zip(pieces, content_kinds(pieces, [m.role for m in new if m.content])):
                    seg.seq.append(piece.token_ids, kind)
                seg.messages.extend(new)
            else:
                for ids, kind in delta:
                    seg.seq.append(ids, kind)
                seg.messages = list(messages)
        seg.busy = True
        return turn

    def release(self, turn: Turn) -> None:
        """End the request's hold on its segment; one that failed before its turn was recorded
        leaves the attempt as it was (a segment it started is dropped, one it extended cut back)."""
        seg = turn.seg
        seg.busy = False
        if turn.recorded:
            return
        if turn.new:
            del self.segments[next(i for i, s in enumerate(self.segments) if s is seg)]  # by identity
            self.splits -= turn.split
            return
        n, spans, messages, end = turn.undo
        seq = seg.seq
        del seq.token_ids[n:], seq.loss_mask[n:], seq.logprobs[n:]
        seq.spans[:], seg.messages, seg.sampled_end = spans, messages, end

    def text_extension(self, seg: Segment, messages: list[Message],
                       tools: list[dict] | None) -> list[tuple[list[int], str]] | None:
        """The (ids, span kind) pieces that extend ``seg`` to this request's rendering, when
        that rendering starts with the segment's text (the module docstring); None when it
        does not (or the same tools are not offered, or the segment is busy)."""
        if seg.busy or not seg.turns or tools != seg.tools:
            return None
        have = self.chat.tokenizer.decode(seg.seq.token_ids, skip_special_tokens=False)
        try:
            full = self.chat.render(messages, tools, add_generation_prompt=True)
            if len(full) <= len(have) or not full.startswith(have):
                return None
            literal = [i for i, m in enumerate(messages) if m.role in ("system", "user", "tool") and m.content]
            marked = self.chat.render([Message(m.role, _PLACEHOLDER.format(i), m.tool_calls, m.tool_call_id, m.name)
                                       if i in literal else m for i, m in enumerate(messages)], tools,
                                      add_generation_prompt=True)
        except TemplateError:
            return None
        pieces = split_rendered(full, marked, [m.content for m in messages])
        if pieces is None:  # the contents cannot be told from the template's text: start anew
            return None
        order = iter(int(m.group(1)) for m in _PLACEHOLDER_RE.finditer(marked))
        out: list[tuple[list[int], str]] = []
        pos = 0
        for text, is_content in pieces:
            role = messages[next(order)].role if is_content else None
            start, pos = pos, pos + len(text)
            if pos <= len(have):
                continue
            part = text[max(0, len(have) - start):]
            if is_content:
                ids, kind = encode_literal(self.chat.tokenizer, part), "tool" if role == "tool" else "prompt"
            else:
                ids, kind = self.chat.encode_template(part), "template"
            if ids:
                out.append((ids, kind))
        return out or None

    def force(self, turn: Turn, ids: list[int]) -> list[int]:
        """Append ids the endpoint writes into the turn before sampling (a forced call's
        opening): not sampled, so mask 0, a ``template`` span. Returns the ids to generate from."""
        turn.seg.seq.append(ids, "template")
        return turn.seg.seq.token_ids

    def room(self, turn: Turn) -> int:
        """Tokens the request's segment may still grow by."""
        return self.max_total_tokens - len(turn.seg.seq)

    def record(self, turn: Turn, gen: Generation, message: Message) -> None:
        """Append a sampled turn and the assistant message handed back for it."""
        seg = turn.seg
        seg.seq.append(gen.token_ids, "model", gen.logprobs)
        seg.messages.append(message)
        stopped_on_token = bool(gen.token_ids) and gen.token_ids[-1] in self.chat.stop_token_ids
        seg.sampled_end = self.chat.turn_closers.get(gen.token_ids[-1]) if stopped_on_token else None
        seg.finish_reason = "length" if gen.finish_reason == "length" else "stop"
        seg.turns += 1
        self.sampled_tokens += len(gen.token_ids)
        self.recorded += 1
        seg.last_turn, turn.recorded = self.recorded, True

    def trajectories(self, *, group_id: str, sample_index: int, task_id: str, family: str,
                     policy_version: int) -> list[Trajectory]:
        """One trajectory per segment that sampled anything, in the order of their last turns
        (the last holds the attempt's last reply); ``agent`` says which."""
        done = sorted((s for s in self.segments if s.turns), key=lambda s: s.last_turn)
        out, n = [], len(done)
        for k, seg in enumerate(done):
            out.append(Trajectory(tool_calls=tool_records(seg.messages),
                token_ids=seg.seq.token_ids, prompt_len=seg.seq.spans[0].end, loss_mask=seg.seq.loss_mask,
                logprobs=seg.seq.logprobs, spans=seg.seq.spans, messages=list(seg.messages),
                group_id=group_id, sample_index=sample_index, finish_reason=seg.finish_reason,
                policy_version=policy_version, task_id=task_id, family=family, turns=seg.turns,
                agent=AgentSegment(index=k, segments=n, splits=self.splits)))
        return out


def content_kinds(pieces, roles: list[str]) -> list[str]:
    """The span kind of each piece of ``ChatTemplate.continuation``, which writes every new
    message's content as a "tool" piece: a tool result stays ``tool``, a user or system
    message (the agent's own words, an ``Observation:`` it sends as the user) is ``prompt``.
    ``roles``: of the new messages that have content, in order.

    >>> from agentrl.chat import Segment
    >>> content_kinds([Segment([1], "template"), Segment([2], "tool"), Segment([3], "template"),
    ...                Segment([4], "tool")], ["tool", "user"])
    ['template', 'tool', 'template', 'prompt']
    """
    n = sum(p.kind == "tool" for p in pieces)
    if n == len(roles):  # one piece per content, in order
        it = iter(roles)
        return ["prompt" if p.kind == "tool" and next(it) != "tool" else p.kind for p in pieces]
    whole = "tool" if all(r == "tool" for r in roles) else "prompt"  # contents the template ran together
    return [whole if p.kind == "tool" else p.kind for p in pieces]


def tool_records(messages: list[Message]) -> list[ToolCallRecord]:
    """The agent ran its tools itself: what the conversation shows of each call (its result is
    the tool message answering its id; latency unknown, 0)."""
    results = {m.tool_call_id: m.content for m in messages if m.role == "tool" and m.tool_call_id}
    out, turn = [], -1
    for m in messages:
        if m.role != "assistant":
            continue
        turn += 1
        for c in m.tool_calls:
            got = results.get(c.id)
            out.append(ToolCallRecord(name=c.name, arguments=c.arguments, result=got if got is not None else "",
                                      error=None if got is not None else "no result in the conversation",
                                      latency_s=0.0, turn=turn))
    return out
