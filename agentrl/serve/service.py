"""Chat completions served from a rollout engine, each request attributed to an attempt whose
tokens are captured exactly (see ``capture.py``).

Requests of one attempt run one at a time (an agent that sends two at once is served in
arrival order); requests of different attempts run concurrently and are continuously batched
by the engine (``engine.agenerate``).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from dataclasses import dataclass, field

from agentrl.chat import ChatTemplate, TemplateError
from agentrl.engines.base import Engine, SamplingParams
from agentrl.engines.base import attempt_seed
from agentrl.serve.capture import AttemptCapture
from agentrl.serve.protocol import ChatRequest, Completion, RequestError
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
    requests: int = 0
    lock: asyncio.Lock | None = None  # created on the server's loop


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

    async def complete(self, key: str | None, req: ChatRequest) -> Completion:
        """Serve one request; ``key`` None is the plain endpoint (nothing kept)."""
        if key is None:
            state = _Attempt(AttemptCapture(self.chat, self.default_budget.max_total_tokens), self.default_budget)
        else:
            with self._lock:
                state = self._attempts.get(key)
            if state is None:
                raise RequestError(f"unknown or finished attempt {key!r}: its requests are no longer accepted",
                                   status=404, code="unknown_attempt")
        if state.lock is None:
            state.lock = asyncio.Lock()
        async with state.lock:
            self.stats.requests += 1
            return await self._complete(state, req)

    async def _complete(self, state: _Attempt, req: ChatRequest) -> Completion:
        cap, budget = state.capture, state.budget
        left = budget.max_sampled_tokens - cap.sampled_tokens
        if left <= 0:
            raise RequestError(f"this attempt has sampled its budget of {budget.max_sampled_tokens} tokens",
                               code="attempt_budget_exceeded")
        try:
            ids = cap.prompt(req.messages, req.tools)
        except TemplateError as e:
            raise RequestError(f"the chat template cannot render these messages: {e}", "messages") from None
        room = min(cap.room(), left)
        if room <= 0:
            raise RequestError(f"the conversation has {len(ids)} tokens, the endpoint's context is "
                               f"{budget.max_total_tokens}", "messages", code="context_length_exceeded")
        seed = req.seed
        if seed is None and budget.seed is not None:
            seed = attempt_seed(budget.seed, budget.seed_key[0], budget.seed_key[1], state.requests)
        state.requests += 1
        params = SamplingParams(
            max_new_tokens=min(req.max_tokens or budget.max_new_tokens, room),
            temperature=req.temperature if req.temperature is not None else budget.temperature,
            top_p=req.top_p if req.top_p is not None else budget.top_p,
            stop_token_ids=list(self.chat.stop_token_ids), stop_strings=list(req.stop), seed=seed)
        loop = asyncio.get_running_loop()
        start = loop.time()
        gen = await self.engine.agenerate(ids, params)
        self.stats.engine_s += loop.time() - start
        self.stats.sampled_tokens += len(gen.token_ids)
        message = self._message(gen.token_ids, gen.finish_reason, req)
        cap.record(gen, message)
        finish = "length" if gen.finish_reason == "length" else ("tool_calls" if message.tool_calls else "stop")
        texts = [self.chat.tokenizer.decode([t], skip_special_tokens=False) for t in gen.token_ids] \
            if req.logprobs else []
        return Completion(message, finish, len(ids), list(gen.token_ids), list(gen.logprobs), texts)

    def _message(self, token_ids: list[int], finish_reason: str, req: ChatRequest) -> Message:
        """The assistant message handed back: parsed tool calls get fresh ids."""
        stopped = bool(token_ids) and token_ids[-1] in self.chat.stop_token_ids
        text = self.chat.tokenizer.decode(token_ids[:-1] if stopped else token_ids, skip_special_tokens=False)
        if finish_reason == "stop" and not stopped and req.stop:
            # A stop string ended the turn inside its last token: OpenAI leaves the string (and
            # what that token wrote after it) out of the content; the sampled ids stay whole.
            cut = max(text.rfind(s) for s in req.stop)
            if cut >= 0:
                text = text[:cut]
        if not req.tools or req.tool_choice == "none":
            return Message("assistant", text.strip())
        parsed = self.chat.parse_assistant(text, req.tools)
        if parsed.errors:  # a malformed call: the agent gets the text as it was written
            return Message("assistant", text.strip())
        calls = [type(c)(c.name, c.arguments, f"call_{uuid.uuid4().hex[:16]}") for c in parsed.tool_calls]
        return Message("assistant", parsed.content, calls)
