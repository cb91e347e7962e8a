"""Live streaming: the sampled ids of one request as they come, and the text that is safe to
send before the turn is over.

The service hands an engine that streams (``capabilities.streams``) a :class:`LiveTokens`'s
``push`` as its token callback; an engine that does not stream gets the whole completion
pushed once it is generated (one chunk, as before). Either way the completion is captured
exactly as without streaming: streaming only changes when the client reads the text.

What is sent as content while the turn is sampled is :meth:`TextStream.push`'s *safe* text,
the longest text sure to begin the final content: it holds back leading and trailing
whitespace (the content is stripped), any text from where a stop string or a tool call may
open (the call opening's first word, e.g. ``<tool_call>``; a partial one at the end too), and
an incomplete UTF-8 character. Tool calls are sent whole once the turn is parsed. The deltas
concatenate to the final content (``finish`` sends the rest).

>>> from agentrl.chat import ChatTemplate
>>> from agentrl.models.tiny import ensure_tiny_model
>>> from transformers import AutoTokenizer
>>> tok = AutoTokenizer.from_pretrained(ensure_tiny_model())
>>> text = TextStream(ChatTemplate(tok), tools=None, stop=["END"])
>>> [text.push(tok.encode(w, add_special_tokens=False)) for w in [" Hi", " there", " E"]]
['Hi', ' there', '']
>>> text.finish("Hi there")
''
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from dataclasses import dataclass, field

from agentrl.chat import ChatTemplate

log = logging.getLogger(__name__)


@dataclass
class LiveTokens:
    """One streamed request's ids as the engine samples them (``push``, on the server's loop),
    read by the response writer; ``None`` on the queue ends it (the completion is recorded or
    failed). ``started`` is set once the request passed every check and generation began, so
    a refused request still gets a plain 4xx error body."""

    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    forced: str = ""  # text the endpoint wrote into the turn before the sampled ids (a forced call)

    def push(self, ids: list[int]) -> None:
        if ids:
            self.queue.put_nowait(list(ids))

    def close(self) -> None:
        self.queue.put_nowait(None)


async def start_live(run, live: LiveTokens) -> asyncio.Task:
    """Start ``run`` (the service's coroutine serving the request into ``live``) and return
    its task once generation began; raises the request's error when it was refused first."""
    task = asyncio.ensure_future(run)
    began = asyncio.ensure_future(live.started.wait())
    await asyncio.wait({task, began}, return_when=asyncio.FIRST_COMPLETED)
    began.cancel()
    if task.done() and not live.started.is_set():
        task.result()  # the RequestError of a refused request
    return task


async def live_ids(live: LiveTokens):
    """The ids pushed into ``live``, until it is closed: each wait's worth at once, so one
    event per decode step while the writer keeps up, fewer and longer ones when it lags
    (every event is a write and a parse of its own on the client)."""
    while True:
        ids = await live.queue.get()
        if ids is None:
            return
        while not live.queue.empty():
            more = live.queue.get_nowait()
            if more is None:
                live.queue.put_nowait(None)  # read at the next wait
                break
            ids += more
        yield ids


def call_markers(chat: ChatTemplate) -> tuple[str, ...]:
    """Where a tool call of the chat template's format may start: the first word of each call
    opening (``<tool_call>``; ``{`` for a bare JSON call), or nothing for a format without
    openings."""
    out = []
    for form in chat.format.call_openings:
        head = form.split("{name}")[0]
        word = re.split(r"[\s{\[(\"]", head, maxsplit=1)[0]
        out.append(word or head[:1])
    return tuple(m for m in dict.fromkeys(out) if m)


def _cut_at(text: str, marks) -> int:
    """Where the first of ``marks`` starts in ``text``, or the start of a tail that begins one."""
    cut = len(text)
    for m in marks:
        at = text.find(m)
        if at >= 0:
            cut = min(cut, at)
        for k in range(min(len(m) - 1, len(text)), 0, -1):
            if text.endswith(m[:k]):
                cut = min(cut, len(text) - k)
                break
    return cut


class TextStream:
    """The content deltas of one streamed turn (see the module docstring). ``tools``: the
    tools a call may be parsed against (None when calls stay text: no tools, or
    ``tool_choice`` none)."""

    def __init__(self, chat: ChatTemplate, tools: list[dict] | None, stop: list[str], forced: str = ""):
        self.chat, self.tools, self.forced = chat, tools, forced
        self.marks = [*stop, *(call_markers(chat) if tools else ())]
        self.ids: list[int] = []
        self.sent = ""

    def text(self) -> str:
        """The turn's text so far (as the service decodes it: forced text, then the sampled ids
        without a closing stop token)."""
        ids = self.ids[:-1] if self.ids and self.ids[-1] in self.chat.stop_token_ids else self.ids
        return self.forced + self.chat.tokenizer.decode(ids, skip_special_tokens=False)

    def push(self, ids: list[int]) -> str:
        """Take newly sampled ids; returns the content that is newly safe to send ('' if none)."""
        self.ids += ids
        full = self.text()
        safe = full.rstrip("\ufffd")  # an incomplete character
        safe = safe[:_cut_at(safe, self.marks)].strip()
        if self.tools and safe:  # the parser's own view of the turn so far must agree
            content = self.chat.parse_assistant(full, self.tools).content
            n = 0
            while n < min(len(safe), len(content)) and safe[n] == content[n]:
                n += 1
            safe = safe[:n].rstrip()
        if len(safe) <= len(self.sent) or not safe.startswith(self.sent):
            return ""
        delta, self.sent = safe[len(self.sent):], safe
        return delta

    def finish(self, content: str) -> str:
        """The rest of the final ``content`` after what was sent."""
        if content.startswith(self.sent):
            return content[len(self.sent):]
        # Not expected (the safe text is a prefix by construction); the final objects (the
        # Responses' completed event, the capture) still hold the right content.
        log.warning("streamed content %r is not a prefix of the final content %r", self.sent, content)
        return ""


def stream_error(e: Exception):
    """The RequestError to send for a failure after a stream began (a bug of ours: server_error)."""
    from agentrl.serve.protocol import RequestError

    if isinstance(e, RequestError):
        return e
    log.error("endpoint error in a stream", exc_info=e)
    return RequestError(f"internal error: {type(e).__name__}: {e}", status=500, kind="server_error")


def sse(event: dict) -> str:
    """One server-sent event of ``event`` as JSON."""
    return f"data: {json.dumps(event)}\n\n"


async def chat_events(chat: ChatTemplate, req, model: str, live: LiveTokens, task: asyncio.Task):
    """The server-sent events of a streamed Chat Completions request (``req``: a ChatRequest
    whose generation ``task`` is under way): the role, a content chunk whenever safe text was
    sampled, then ``completion_tail`` and ``[DONE]``. A failure after the stream began is an
    ``error`` event (the status line was sent already)."""
    from agentrl.serve.protocol import chunk, chunk_head, completion_tail

    head = chunk_head(model)
    yield sse(chunk(head, {"role": "assistant", "content": ""}))
    text = TextStream(chat, req.tools if req.tool_choice != "none" else None, req.stop, live.forced)
    async for ids in live_ids(live):
        if delta := text.push(ids):
            yield sse(chunk(head, {"content": delta}))
    try:
        done = await task
    except Exception as e:  # noqa: BLE001 - the status line was sent: the client reads the error here
        yield sse(stream_error(e).body())
    else:
        for event in completion_tail(done, head, text.finish(done.message.content), req.logprobs,
                                     req.include_usage):
            yield sse(event)
    yield "data: [DONE]\n\n"
