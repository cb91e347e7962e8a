"""Chat completions and responses served from a rollout engine, each request attributed to an
attempt whose tokens are captured exactly (see ``capture.py``). A Responses request
(``responses.py``) becomes the same messages and tools as a Chat Completions one and goes
through the same ``_complete``: one capture, one merge/split rule, one budget.

Requests run concurrently, those of one attempt too (an agent that fans out: several
completions at once, parallel sub-agents), and are continuously batched by the engine
(``engine.agenerate``). Within an attempt the capture keeps each independent history its own
segment (``capture.py``); the attempt's sampled-token budget is reserved per request in
flight, so requests together never sample past it; and a request that gives no seed samples
from a stream keyed by its exact prompt ids (and how many earlier requests of the attempt
had the same ones), so what it samples does not depend on the order concurrent requests
arrive in.
"""

from __future__ import annotations

import asyncio
import hashlib
import html
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field, replace

from agentrl.chat import ChatTemplate, TemplateError
from agentrl.chat.formats import PROBE_CALL, PROBE_TOOLS
from agentrl.engines.base import Engine, SamplingParams
from agentrl.engines.base import attempt_seed
from agentrl.serve.capture import AttemptCapture, Turn
from agentrl.serve.protocol import ChatRequest, Completion, RequestError
from agentrl.serve.responses import ResponsesRequest
from agentrl.serve.structured import check_servable
from agentrl.serve.streaming import LiveTokens
from agentrl.types import Message


@dataclass
class AttemptBudget:
    """Limits of one attempt, and the seed its requests sample with when they carry none."""

    max_total_tokens: int  # per segment, prompt included
    max_sampled_tokens: int  # over the whole attempt
    max_new_tokens: int  # per request, unless the request asks for fewer
    temperature: float  # for requests that give none
    top_p: float
    seed: int | None = None  # None: the engine's own stream
    seed_key: tuple[str, int] = ("", 0)  # (group id, sample index) in attempt_seed


@dataclass
class _Attempt:
    capture: AttemptCapture
    budget: AttemptBudget
    reserved: int = 0  # sampled tokens its requests in flight may still take (their max_new_tokens)
    prompts: dict[bytes, int] = field(default_factory=dict)  # prompt digest -> requests sampled from it
    # Its stored responses (``previous_response_id``): id -> the conversation through that
    # response's output, without its instructions (OpenAI does not carry those over).
    responses: dict[str, list[Message]] = field(default_factory=dict)


PLAIN_RESPONSES_KEPT = 1024  # stored responses of the plain endpoint (agentrl serve), oldest out first


@dataclass(frozen=True)
class ForcedCall:
    """What a forced call (``tool_choice`` "required" or a named function) writes into the turn
    before the model samples: the chat template's own rendering of a call turn, from the end of
    its generation prompt through the format's opening of the call (``ToolCallFormat.call_openings``),
    the function's name in it when one is named, up to the arguments. "required" stops before
    the first name: the model samples which function. Those tokens are not sampled: mask 0,
    ``template`` spans, as the template's own text."""

    parts: tuple[str, ...]  # that rendering, split where it writes the function's name

    def text(self, name: str | None) -> str:
        return self.parts[0] if name is None else name.join(self.parts)


def forced_call(chat: ChatTemplate) -> ForcedCall | str:
    """The template's :class:`ForcedCall`, found by rendering a known call, or why there is none."""
    fmt = chat.format
    if not fmt.call_openings:
        return f"its tool-call format {fmt.name} runs calls inside the turn, so there is no call opening to force"
    user = Message("user", "AgentrlProbeUser")
    try:
        prompt = chat.render([user], PROBE_TOOLS, add_generation_prompt=True)
        full = chat.render([user, Message("assistant", "", [PROBE_CALL])], PROBE_TOOLS)
    except Exception as e:  # jinja errors, the template's raise_exception()
        return f"its chat template cannot render a call ({type(e).__name__}: {e})"
    if not full.startswith(prompt):
        return ("its chat template renders a call turn that does not continue the generation prompt (a reasoning "
                f"block the prompt opens is written otherwise): {full[len(prompt) - 20:len(prompt) + 40]!r}")
    after = full[len(prompt):]
    for text in (after, html.unescape(after)):
        for form in fmt.call_openings:
            opening = fmt.opening(form, PROBE_CALL.name)
            at = text.find(opening)
            if at >= 0:
                return ForcedCall(tuple(text[:at + len(opening)].split(PROBE_CALL.name)))
    return (f"its chat template writes a call as {after[:100]!r}, which opens with none of the {fmt.name} "
            f"format's forms {fmt.call_openings}")


@dataclass
class ServiceStats:
    requests: int = 0
    refused: int = 0  # answered with an error body
    sampled_tokens: int = 0
    engine_s: float = 0.0  # summed over requests: time awaiting the engine


@dataclass
class ChatService:
    """The endpoint's logic, independent of HTTP (``server.py`` exposes it).

    ``engine`` needs ``agenerate`` (``capabilities.per_request_async``).
    """

    engine: Engine
    chat: ChatTemplate
    default_budget: AttemptBudget
    model_name: str = "agentrl"
    stats: ServiceStats = field(default_factory=ServiceStats)

    def __post_init__(self) -> None:
        if not self.engine.capabilities.per_request_async:
            raise ValueError(f"the OpenAI endpoint needs an engine that serves requests one by one "
                             f"(per_request_async); {type(self.engine).__name__} does not: use model.engine=hf")
        self._attempts: dict[str, _Attempt] = {}
        self._lock = threading.Lock()
        self._forced: ForcedCall | str | None = None  # forced_call(chat), found on first use
        self._plain_responses: OrderedDict[str, list[Message]] = OrderedDict()

    def forced_call(self) -> ForcedCall | str:
        if self._forced is None:
            self._forced = forced_call(self.chat)
        return self._forced

    # -- attempts (called by the runner, from any thread) ----------------------------------

    def open_attempt(self, budget: AttemptBudget) -> str:
        """Register an attempt; returns its key (the path component of its base URL)."""
        key = uuid.uuid4().hex
        with self._lock:
            self._attempts[key] = _Attempt(AttemptCapture(self.chat, budget.max_total_tokens), budget)
        return key

    def close_attempt(self, key: str) -> AttemptCapture:
        """Stop accepting the attempt's requests; returns what it captured."""
        with self._lock:
            return self._attempts.pop(key).capture

    # -- requests (on the server's event loop) ------------------------------------------------

    def _state(self, key: str | None) -> _Attempt:
        if key is None:
            state = _Attempt(AttemptCapture(self.chat, self.default_budget.max_total_tokens), self.default_budget,
                             responses=self._plain_responses)
        else:
            with self._lock:
                state = self._attempts.get(key)
            if state is None:
                raise RequestError(f"unknown or finished attempt {key!r}: its requests are no longer accepted",
                                   status=404, code="unknown_attempt")
        return state

    async def complete(self, key: str | None, req: ChatRequest, live: LiveTokens | None = None) -> Completion:
        """Serve one request; ``key`` None is the plain endpoint (nothing kept). ``live``: the
        request is streamed, its ids pushed there as they are sampled (``streaming.py``)."""
        state = self._state(key)
        self.stats.requests += 1
        try:
            return await self._complete(state, req, live)
        finally:
            if live is not None:
                live.close()

    async def respond(self, key: str | None, req: ResponsesRequest, live: LiveTokens | None = None,
                      response_id: str | None = None) -> tuple[str, Completion]:
        """Serve one Responses request: its conversation is its instructions, the stored
        conversation of ``previous_response_id`` (this attempt's), then its input. Returns the
        response's id (``response_id``, or a new one) and the completion; the response is kept
        when ``req.store``."""
        state = self._state(key)
        self.stats.requests += 1
        try:
            history: list[Message] = []
            if req.previous_response_id is not None:
                prior = state.responses.get(req.previous_response_id)
                if prior is None:
                    raise RequestError(
                        f"previous_response_id={req.previous_response_id!r} is not a stored response of this "
                        f"attempt (responses are kept per attempt, and only with store=true)",
                        "previous_response_id", code="previous_response_not_found")
                history = prior
            conversation = name_tool_results(history + req.input)
            system = [Message("system", req.instructions)] if req.instructions else []
            if not conversation or conversation[-1].role == "assistant":
                raise RequestError("the conversation (previous response and input) must end with a user message "
                                   "or a function_call_output: continuing the assistant's turn is not supported",
                                   "input")
            done = await self._complete(state, replace(req.chat, messages=system + conversation), live)
            rid = response_id or f"resp_{uuid.uuid4().hex}"
            if req.store:
                state.responses[rid] = conversation + [done.message]
                if state.responses is self._plain_responses and len(state.responses) > PLAIN_RESPONSES_KEPT:
                    self._plain_responses.popitem(last=False)
            return rid, done
        finally:
            if live is not None:
                live.close()

    async def _complete(self, state: _Attempt, req: ChatRequest, live: LiveTokens | None) -> Completion:
        cap, budget = state.capture, state.budget
        # Tokens its requests in flight may still sample are theirs: together they stay in budget.
        left = budget.max_sampled_tokens - cap.sampled_tokens - state.reserved
        if left <= 0:
            held = f" ({state.reserved} held by its requests in flight)" if state.reserved else ""
            raise RequestError(f"this attempt has sampled its budget of {budget.max_sampled_tokens} tokens{held}",
                               code="attempt_budget_exceeded")
        check_servable(req.grammar, req.grammar_param, self.engine, req.tools, req.tool_choice)
        forced = ""
        if req.tool_choice in ("required", "function"):
            how = self.forced_call()
            if isinstance(how, str):
                raise RequestError(f"tool_choice={req.tool_name or req.tool_choice!r} (a forced call) is not "
                                   f"available for this model: {how}", "tool_choice")
            forced = how.text(req.tool_name)
        try:
            turn = cap.begin(req.messages, req.tools)
        except TemplateError as e:
            raise RequestError(f"the chat template cannot render these messages: {e}", "messages") from None
        try:
            return await self._sample(state, turn, req, live, forced, left)
        finally:
            cap.release(turn)  # a request that failed leaves its segment as it was

    async def _sample(self, state: _Attempt, turn: Turn, req: ChatRequest, live: LiveTokens | None, forced: str,
                      left: int) -> Completion:
        cap, budget = state.capture, state.budget
        ids = turn.seg.seq.token_ids
        if forced:
            ids = cap.force(turn, self.chat.encode_template(forced))
        room = min(cap.room(turn), left)
        if room <= 0:
            raise RequestError(f"the conversation has {len(ids)} tokens, the endpoint's context is "
                               f"{budget.max_total_tokens}", "messages", code="context_length_exceeded")
        seed = req.seed
        if seed is None and budget.seed is not None:
            seed = attempt_seed(budget.seed, budget.seed_key[0], budget.seed_key[1], _prompt_key(state, ids))
        params = SamplingParams(
            max_new_tokens=min(req.max_tokens or budget.max_new_tokens, room),
            temperature=req.temperature if req.temperature is not None else budget.temperature,
            top_p=req.top_p if req.top_p is not None else budget.top_p,
            stop_token_ids=list(self.chat.stop_token_ids), stop_strings=list(req.stop), seed=seed,
            grammar=req.grammar)
        loop = asyncio.get_running_loop()
        start = loop.time()
        state.reserved += params.max_new_tokens
        try:
            if live is None:
                gen = await self.engine.agenerate(ids, params)
            else:  # streamed: live as sampled where the engine can, else in one piece once generated
                live.forced = forced
                live.started.set()
                if self.engine.capabilities.streams:
                    gen = await self.engine.agenerate_stream(ids, params, live.push)
                else:
                    gen = await self.engine.agenerate(ids, params)
                    live.push(gen.token_ids)
        finally:
            state.reserved -= params.max_new_tokens
        self.stats.engine_s += loop.time() - start
        self.stats.sampled_tokens += len(gen.token_ids)
        message = self._message(gen.token_ids, gen.finish_reason, req, forced)
        cap.record(turn, gen, message)
        finish = "length" if gen.finish_reason == "length" else ("tool_calls" if message.tool_calls else "stop")
        texts = [self.chat.tokenizer.decode([t], skip_special_tokens=False) for t in gen.token_ids] \
            if req.logprobs else []
        return Completion(message, finish, len(ids), list(gen.token_ids), list(gen.logprobs), texts)

    def _message(self, token_ids: list[int], finish_reason: str, req: ChatRequest, forced: str = "") -> Message:
        """The assistant message handed back: parsed tool calls get fresh ids. ``forced``: the
        text written into the turn before the sampled ids (a forced call's opening)."""
        stopped = bool(token_ids) and token_ids[-1] in self.chat.stop_token_ids
        text = forced + self.chat.tokenizer.decode(token_ids[:-1] if stopped else token_ids, skip_special_tokens=False)
        if finish_reason == "stop" and not stopped and req.stop:
            # A stop string ended the turn inside its last token: OpenAI leaves the string (and
            # what that token wrote after it) out of the content; the sampled ids stay whole.
            cut = max(text.rfind(s, len(forced)) for s in req.stop)  # in the sampled text
            if cut >= 0:
                text = text[:cut]
        if not req.tools or req.tool_choice == "none":
            return Message("assistant", text.strip())
        parsed = self.chat.parse_assistant(text, req.tools)
        if parsed.errors:  # a malformed call: the agent gets the text as it was written
            return Message("assistant", text.strip())
        calls = [type(c)(c.name, c.arguments, f"call_{uuid.uuid4().hex[:16]}") for c in parsed.tool_calls]
        return Message("assistant", parsed.content, calls)


def _prompt_key(state: _Attempt, ids: list[int]) -> int:
    """The seed stream of a request that gives no seed: its exact prompt ids and how many of
    the attempt's earlier requests had the same ones (a retry samples anew), whatever order
    concurrent requests arrive in."""
    digest = hashlib.blake2b(b"".join(i.to_bytes(4, "little") for i in ids), digest_size=8).digest()
    k = state.prompts.get(digest, 0)
    state.prompts[digest] = k + 1
    return int.from_bytes(digest, "little") ^ k


def name_tool_results(messages: list[Message]) -> list[Message]:
    """Tool results that carry no function name get the name of the call they answer (a
    ``function_call_output`` item has only its ``call_id``; some templates render the name)."""
    names = {c.id: c.name for m in messages for c in m.tool_calls if c.id}
    return [replace(m, name=names.get(m.tool_call_id)) if m.role == "tool" and m.name is None
            and m.tool_call_id in names else m for m in messages]
