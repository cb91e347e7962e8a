"""Token capture of one attempt's chat requests: merged into one trajectory while each request
extends the last, split into several where the agent rewrote its history.

A request *extends* the attempt's current segment when its messages start with exactly the
segment's messages (the earlier requests' conversation and every assistant turn the endpoint
returned, as returned: content and tool calls with their ids) and it offers the same tools.
Then the sampled ids stay as they were and only the template/tool delta after them is
tokenized (``ChatTemplate.continuation``, mask 0). Otherwise (the agent dropped, edited or
summarised messages, or changed its tools) a new segment starts from the rendered prompt.
Each segment becomes one trajectory; all of an attempt's segments carry its reward.

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
>>> ids = cap.prompt([Message("user", "2+2?")], None)
>>> cap.current.seq.spans[0].kind, len(cap.segments)
('prompt', 1)
"""

from __future__ import annotations

from dataclasses import dataclass, field

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


def same_call(a: ToolCall, b: ToolCall) -> bool:
    return a.name == b.name and a.arguments == b.arguments and (a.id or None) == (b.id or None)


def same_message(a: Message, b: Message) -> bool:
    """Equal as the agent sees them (content, calls and their ids, the tool message's call id)."""
    return (a.role == b.role and (a.content or "") == (b.content or "") and a.tool_call_id == b.tool_call_id
            and len(a.tool_calls) == len(b.tool_calls) and all(map(same_call, a.tool_calls, b.tool_calls)))


@dataclass
class AttemptCapture:
    """Every segment of one attempt (see the module docstring). Not thread-safe: the service
    serializes an attempt's requests."""

    chat: ChatTemplate
    max_total_tokens: int
    segments: list[Segment] = field(default_factory=list)
    sampled_tokens: int = 0  # over all segments (the attempt's token budget counts these)

    @property
    def current(self) -> Segment | None:
        return self.segments[-1] if self.segments else None

    @property
    def splits(self) -> int:
        """How many times the agent's history broke the previous segment."""
        return max(0, len(self.segments) - 1)

    def extends(self, messages: list[Message], tools: list[dict] | None) -> bool:
        seg = self.current
        if seg is None or tools != seg.tools:
            return False
        n = len(seg.messages)
        return len(messages) > n and all(map(same_message, seg.messages, messages[:n]))

    def prompt(self, messages: list[Message], tools: list[dict] | None) -> list[int]:
        """The ids to generate from for this request (appending to, or starting, a segment)."""
        if self.extends(messages, tools):
            seg = self.current
            new = messages[len(seg.messages):]
            pieces = self.chat.continuation(seg.messages, new, tools, seg.sampled_end)
            for piece, kind in zip(pieces, content_kinds(pieces, [m.role for m in new if m.content])):
                seg.seq.append(piece.token_ids, kind)
            seg.messages.extend(new)
        elif (delta := self.text_extension(messages, tools)) is not None:
            seg = self.current
            for ids, kind in delta:
                seg.seq.append(ids, kind)
            seg.messages = list(messages)
        else:
            seq = TokenSequence()
            seq.append(self.chat.encode_prompt(messages, tools), "prompt")
            self.segments.append(Segment(seq, list(messages), tools))
        return self.current.seq.token_ids

    def text_extension(self, messages: list[Message], tools: list[dict] | None) -> list[tuple[list[int], str]] | None:
        """The (ids, span kind) pieces that extend the current segment to this request's
        rendering, when that rendering starts with the segment's text (the module docstring);
        None when it does not (or the same tools are not offered)."""
        seg = self.current
        if seg is None or not seg.turns or tools != seg.tools:
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

    def force(self, ids: list[int]) -> list[int]:
        """Append ids the endpoint writes into the turn before sampling (a forced call's
        opening): not sampled, so mask 0, a ``template`` span. Returns the ids to generate from."""
        self.current.seq.append(ids, "template")
        return self.current.seq.token_ids

    def room(self) -> int:
        """Tokens the current segment may still grow by."""
        return self.max_total_tokens - len(self.current.seq)

    def record(self, gen: Generation, message: Message) -> None:
        """Append a sampled turn and the assistant message handed back for it."""
        seg = self.current
        seg.seq.append(gen.token_ids, "model", gen.logprobs)
        seg.messages.append(message)
        stopped_on_token = bool(gen.token_ids) and gen.token_ids[-1] in self.chat.stop_token_ids
        seg.sampled_end = self.chat.turn_closers.get(gen.token_ids[-1]) if stopped_on_token else None
        seg.finish_reason = "length" if gen.finish_reason == "length" else "stop"
        seg.turns += 1
        self.sampled_tokens += len(gen.token_ids)

    def trajectories(self, *, group_id: str, sample_index: int, task_id: str, family: str,
                     policy_version: int) -> list[Trajectory]:
        """One trajectory per segment that sampled anything, in order; ``agent`` says which."""
        out, n = [], sum(1 for s in self.segments if s.turns)
        for k, seg in enumerate(s for s in self.segments if s.turns):
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
