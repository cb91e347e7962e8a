"""The multi-turn rollout engine: tasks x G attempts -> masked trajectories.

Two loops produce the same kind of trajectory:

- **per attempt** (engines with ``capabilities.per_request_async``, the default for them):
  every attempt is its own coroutine, generate -> parse -> run its tools -> append the
  observation -> generate, with no turn barrier. The engine batches whatever requests are in
  flight at each decode step (continuous batching), so an attempt whose tool returns rejoins
  decoding at once while others still decode or wait on their tools. Each attempt-turn samples
  from its own random stream (``attempt_seed``), whatever else shares its batches.
- **lock-step** (every other engine, or ``loop="lockstep"``): each turn, every active attempt
  generates together in one batch, then the turn's tool calls run concurrently.

Observations are appended as token ids taken from the chat template's rendering delta
(token-in-token-out: the sampled ids are never decoded and re-encoded).

Example::

    from agentrl import ChatTemplate, HFEngine, RolloutConfig, RolloutRunner, Task, ToolBox, tool
    from agentrl.models.tiny import ensure_tiny_model

    @tool
    def add(a: int, b: int) -> int:
        '''Add two integers.

        Args:
            a: first addend
            b: second addend
        '''
        return a + b

    engine = HFEngine.from_pretrained(ensure_tiny_model())
    chat = ChatTemplate(engine.tokenizer)
    runner = RolloutRunner(engine, chat, ToolBox([add], tokenizer=engine.tokenizer),
                           RolloutConfig(max_turns=3, max_new_tokens=32))
    batch = runner.run([Task(id="t0", prompt="What is 2+3?", answer="5")], num_samples=2,
                       system_prompt="Use the add tool.")
    traj = batch.trajectories[0]
    assert sum(traj.loss_mask) == sum(s.end - s.start for s in traj.spans if s.kind == "model")
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field

from agentrl.chat import ChatTemplate, Segment, encode_literal
from agentrl.chat.formats.base import MidTurnState
from agentrl.engines.base import Engine, Generation, SamplingParams, attempt_seed
from agentrl.engines.driver import run_hosted
from agentrl.rollout.base import DEFAULT_ANSWER_PATTERN, RolloutBatch, RolloutConfig, RolloutStats
from agentrl.rollout.compaction import CompactionState, Compactor, finish_segments
from agentrl.toolbox import ToolBox, ToolContext, ToolResult
from agentrl.types import Failure, Message, Task, TokenSequence, ToolCall, ToolCallRecord, Trajectory


class _ToolClock:
    """Wall time during which at least one tool call is in flight (the union of their spans)."""

    def __init__(self) -> None:
        self.seconds, self._running, self._since = 0.0, 0, 0.0

    async def timed(self, call):
        if self._running == 0:
            self._since = time.perf_counter()
        self._running += 1
        try:
            return await call
        finally:
            self._running -= 1
            if self._running == 0:
                self.seconds += time.perf_counter() - self._since


@dataclass
class _Attempt:
    task: Task
    sample_index: int
    seq: TokenSequence
    messages: list[Message]
    context: ToolContext
    records: list[ToolCallRecord] = field(default_factory=list)
    finish_reason: str | None = None  # None while active
    void_turns: int = 0
    turns: int = 0
    # calls the current turn asked for; parse errors are observations too
    pending: list[ToolCall | str] = field(default_factory=list)
    sampled_end: str | None = None  # the turn-closing marker the last sampled turn ended with
    # a mid-turn format's state of the turn in progress, set while that turn is paused: the
    # next generation continues the same assistant turn
    mid: MidTurnState | None = None
    failure: Failure | None = None  # a tool's infrastructure failed: the attempt ended (retried by the run)
    compaction: CompactionState | None = None  # rollout.compaction is on: its segments so far


class RolloutRunner:
    """Runs batches of multi-turn attempts through an engine, a chat template and tools."""

    def __init__(self, engine: Engine, chat: ChatTemplate, toolbox: ToolBox, config: RolloutConfig | None = None):
        self.engine = engine
        self.chat = chat
        self.toolbox = toolbox
        self.config = config or RolloutConfig()
        self.tokenizer = chat.tokenizer
        self._answer_re = re.compile(self.config.answer_pattern or DEFAULT_ANSWER_PATTERN, re.DOTALL)
        self._mid = chat.format.mid_turn
        self._compactor: Compactor | None = None  # set by arun from the config (rollout.compaction)
        if self._mid is not None and self._mid.tool not in toolbox.tools:
            raise ValueError(f"tool_call_format={chat.tool_call_format!r} runs the model's mid-turn calls in a tool "
                             f"named {self._mid.tool!r}, and the toolbox has {sorted(toolbox.tools) or 'none'}: "
                             f"add {self._mid.tool_hint or 'it'}")

    def close(self) -> None:
        """Nothing to release: the engine and the tools belong to whoever built them."""

    def run(self, tasks: list[Task], num_samples: int, system_prompt: str | None = None,
            seed: int | None = None, group_prefix: str = "") -> RolloutBatch:
        """Sample ``num_samples`` attempts of every task; returns them task-major."""
        per_attempt = self.uses_attempt_loop  # its ValueError (loop='attempt' on an engine that cannot)
        coro = self.arun(tasks, num_samples, system_prompt, seed, group_prefix)
        # per attempt, this thread serves the engine's batcher meanwhile (one OpenMP pool, not two:
        # engines/driver.py); lock-step generates on the loop's own thread, which is this one
        return run_hosted(coro) if per_attempt else asyncio.run(coro)

    async def arun(self, tasks: list[Task], num_samples: int, system_prompt: str | None = None,
                   seed: int | None = None, group_prefix: str = "") -> RolloutBatch:
        cfg = self.config
        stats = RolloutStats()
        t_start = time.perf_counter()
        # a mid-turn format's calls follow a convention the system prompt teaches: a template's
        # tool section would describe a call syntax (<tool_call>...) the format never reads
        tools = None if self._mid is not None else self.toolbox.schemas() or None
        attempts: list[_Attempt] = []
        compactor = self._compactor = Compactor(self.chat, cfg) if cfg.compaction != "none" else None
        for task in tasks:
            head = [Message("system", system_prompt)] if system_prompt else []
            head.append(Message("user", task.prompt))
            prompt_ids = self.chat.encode_prompt(head, tools)
            if len(prompt_ids) >= cfg.max_total_tokens:
                raise ValueError(
                    f"task {task.id!r}: prompt has {len(prompt_ids)} tokens, over "
                    f"max_total_tokens={cfg.max_total_tokens}; raise rollout.max_total_tokens"
                )
            if compactor is not None:
                compactor.check_prompt(task.id, len(prompt_ids))
            for i in range(num_samples):
                seq = TokenSequence()
                seq.append(prompt_ids, "prompt")
                ctx = self.toolbox.new_context(f"{group_prefix}{task.id}/{i}", seed)
                attempts.append(_Attempt(task, i, seq, list(head), ctx, compaction=None if compactor is None
                                         else CompactionState(list(head), cfg.compaction)))

        if self.uses_attempt_loop:
            await self._run_attempts(attempts, tools, seed, group_prefix, stats)
        else:
            await self._run_lockstep(attempts, tools, seed, stats)
        trajectories = []
        for a in attempts:
            await self.toolbox.close(a.context)
            trajectories.extend(self._finish(a, group_prefix))
        stats.sampled_tokens = sum(t.num_model_tokens for t in trajectories)
        stats.total_s = time.perf_counter() - t_start
        return RolloutBatch(trajectories, stats)

    @property
    def uses_attempt_loop(self) -> bool:
        """True when this runner runs one coroutine per attempt (see the module docstring)."""
        able = self.engine.capabilities.per_request_async
        if self.config.loop == "attempt" and not able:
            raise ValueError(f"rollout.loop='attempt' needs an engine that serves requests one by one "
                             f"(per_request_async); {type(self.engine).__name__} does not: use loop='auto'")
        return able and self.config.loop != "lockstep"

    @property
    def _limit(self) -> int:
        """A segment's length never exceeds it: max_total_tokens, or a smaller context budget."""
        c = self._compactor
        return self.config.max_total_tokens if c is None else c.limit

    def _params(self, max_new_tokens: int, seed: int | None) -> SamplingParams:
        cfg = self.config
        return SamplingParams(max_new_tokens=max(1, min(cfg.max_new_tokens, max_new_tokens)),
                              temperature=cfg.temperature, top_p=cfg.top_p,
                              stop_token_ids=list(self.chat.stop_token_ids),
                              stop_strings=[*cfg.stop_strings, *(self._mid.stop_strings if self._mid else ())],
                              seed=seed)

    # -- the per-attempt loop -------------------------------------------------------------

    async def _run_attempts(self, attempts: list[_Attempt], tools: list[dict] | None, seed: int | None,
                            group_prefix: str, stats: RolloutStats) -> None:
        batcher = self.engine.batcher_stats
        busy0 = batcher.busy_s if batcher is not None else 0.0
        clock = _ToolClock()
        await asyncio.gather(*(self._attempt(a, tools, seed, group_prefix, clock) for a in attempts))
        stats.generate_s = batcher.busy_s - busy0 if batcher is not None else 0.0
        stats.tools_s = clock.seconds
        stats.turns = sum(a.turns for a in attempts)
        stats.loop = "attempt"

    async def _attempt(self, a: _Attempt, tools: list[dict] | None, seed: int | None, group_prefix: str,
                       clock: _ToolClock) -> None:
        for turn in range(self.config.max_turns):
            budget = self._limit - len(a.seq)
            s = None if seed is None else attempt_seed(seed, f"{group_prefix}{a.task.id}", a.sample_index, turn)
            gen = await self.engine.agenerate(a.seq.token_ids, self._params(budget, s))
            self._absorb(a, gen, budget)
            if a.finish_reason is not None:
                return
            if turn == self.config.max_turns - 1:
                a.finish_reason = "max_turns"
                return
            records = await clock.timed(asyncio.gather(*(self._one_call(a, c, turn) for c in a.pending)))
            a.records.extend(records)
            if self._infra_failed(a):
                return
            self._append_observations(a, tools)
            if a.finish_reason is not None:
                return
            if a.compaction is not None and a.compaction.summary_due:
                budget = self._limit - len(a.seq)
                s = None if seed is None else attempt_seed(seed, f"{group_prefix}{a.task.id}#summary", a.sample_index,
                                                           len(a.compaction.closed))
                gen = await self.engine.agenerate(a.seq.token_ids, self._params(budget, s))
                self._compactor.absorb_summary(a, gen, budget, tools)
                if a.finish_reason is not None:
                    return

    # -- the lock-step loop ---------------------------------------------------------------

    async def _run_lockstep(self, attempts: list[_Attempt], tools: list[dict] | None, seed: int | None,
                            stats: RolloutStats) -> None:
        cfg = self.config
        for turn in range(cfg.max_turns):
            active = [a for a in attempts if a.finish_reason is None]
            if not active:
                break
            t0 = time.perf_counter()
            room = [self._limit - len(a.seq) for a in active]
            params = self._params(max(room), None if seed is None else seed + 7919 * turn)
            gens = self.engine.generate([a.seq.token_ids for a in active], params)
            for a, g, budget in zip(active, gens, room):
                self._absorb(a, g, budget)
            stats.generate_s += time.perf_counter() - t0
            stats.turns += 1
            calling = [a for a in active if a.finish_reason is None]
            if turn == cfg.max_turns - 1:
                for a in calling:
                    a.finish_reason = "max_turns"
                break
            t0 = time.perf_counter()
            results = await asyncio.gather(*(self._one_call(a, c, turn) for a in calling for c in a.pending))
            stats.tools_s += time.perf_counter() - t0
            it = iter(results)
            for a in calling:
                records = [next(it) for _ in a.pending]
                a.records.extend(records)
                if not self._infra_failed(a):
                    self._append_observations(a, tools)
            due = [a for a in calling if a.compaction is not None and a.compaction.summary_due]
            if due:  # the attempts that compact this turn sample their summaries together
                t0 = time.perf_counter()
                room = [self._limit - len(a.seq) for a in due]
                params = self._params(max(room), None if seed is None else seed + 7919 * turn + 4099)
                for a, g, budget in zip(due, self.engine.generate([a.seq.token_ids for a in due], params), room):
                    self._compactor.absorb_summary(a, g, budget, tools)
                stats.generate_s += time.perf_counter() - t0
                stats.turns += 1

    # -- one turn of one attempt ----------------------------------------------------------

    def _absorb(self, a: _Attempt, g: Generation, budget: int) -> None:
        """Append a sampled turn to the attempt, parse it, and decide what comes next."""
        ids, lps, finish = g.token_ids, g.logprobs, g.finish_reason
        if len(ids) > budget:  # the row ran past the whole-sequence budget
            ids, lps, finish = ids[:budget], lps[:budget], "length"
        a.turns += 1
        state, a.mid = a.mid, None
        if state is not None:  # a paused turn goes on: one assistant message per turn, however many pauses
            a.messages.pop()
        elif self._mid is not None:  # made before the turn's ids go in: the turn starts here
            state = self._mid.start(a.seq, self._decode)
        a.seq.append(ids, "model", lps)
        stopped_on_token = bool(ids) and ids[-1] in self.chat.stop_token_ids
        if state is not None and finish == "stop" and not stopped_on_token and self._paused(a, state, ids):
            return
        body = ids[:-1] if stopped_on_token else ids
        text = state.model_text(len(a.seq) - (1 if stopped_on_token else 0)) if state else self._decode(body)
        # The schemas type the arguments of formats that write them as text (XML forms).
        parsed = self.chat.parse_assistant(text, self.toolbox.schemas() or None)
        turn_calls = state.calls if state else []
        a.messages.append(Message("assistant", parsed.content, tool_calls=[*turn_calls, *parsed.tool_calls]))
        a.sampled_end = self.chat.turn_closers.get(ids[-1]) if stopped_on_token else None
        if finish == "length" or not (stopped_on_token or finish == "stop"):
            a.finish_reason = "length"
            return
        a.pending = [*parsed.tool_calls, *parsed.errors]
        if not a.pending:
            if not self._answer_re.search(parsed.content):
                a.void_turns += 1
            a.finish_reason = "stop"

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def _paused(self, a: _Attempt, state: MidTurnState, ids: list[int]) -> bool:
        """A mid-turn format's stop: the turn pauses (its call, if the format asks for one, runs
        and the turn resumes) or the format ends the attempt. False when the stop was not the
        format's (a user's own stop string ended the turn)."""
        pause = state.pause(ids)
        if pause is None:
            return False
        # the message of the turn so far; the turn's next generation replaces it
        a.messages.append(Message("assistant", state.model_text().strip(), tool_calls=list(state.calls)))
        if pause.end_attempt:
            a.void_turns += 1
            a.finish_reason = "stop"
            return True
        a.mid = state
        a.pending = [pause.call] if pause.call is not None else []
        return True

    async def _one_call(self, a: _Attempt, call: ToolCall | str, turn: int) -> ToolCallRecord:
        if isinstance(call, str):  # the model wrote a call that could not be parsed
            return ToolCallRecord(name="", arguments={}, result=f"Error: {call}", error="parse_error",
                                  latency_s=0.0, turn=turn)
        res: ToolResult = await self.toolbox.execute(call.name, call.arguments, a.context)
        if res.failure is not None and a.failure is None:
            a.failure = res.failure
        return ToolCallRecord(name=call.name, arguments=call.arguments, result=res.content,
                              error=res.error, latency_s=res.latency_s, turn=turn, retried=res.retried)

    @staticmethod
    def _infra_failed(a: _Attempt) -> bool:
        """A call's infrastructure failed: end the attempt here, before its observation is
        appended (the model never reads an outage as if its call had failed)."""
        if a.failure is None:
            return False
        a.finish_reason, a.pending = "error", []
        return True

    def _append_observations(self, a: _Attempt, tools: list[dict] | None) -> None:
        if a.mid is not None:
            return self._append_output(a, a.mid)
        records = a.records[len(a.records) - len(a.pending):]
        new = []
        for call, rec in zip(a.pending, records):
            cid = call.id if isinstance(call, ToolCall) else None
            new.append(Message("tool", rec.result, tool_call_id=cid, name=rec.name or None))
        try:
            segments: list[Segment] = self.chat.continuation(a.messages, new, tools, a.sampled_end)
        except Exception as e:  # a template that cannot render this conversation
            a.finish_reason = "error"
            a.pending = []
            a.messages.extend(new)
            a.records[-1].error = a.records[-1].error or f"template: {e}"
            return
        if self._compactor is not None and self._compactor.handle(a, new, segments, tools):
            return
        a.messages.extend(new)
        a.pending = []
        for s in segments:
            a.seq.append(s.token_ids, s.kind)
        if len(a.seq) >= self.config.max_total_tokens:
            a.finish_reason = "length"

    def _append_output(self, a: _Attempt, state: MidTurnState) -> None:
        """The real output of a mid-turn call, as tool tokens inside the assistant turn."""
        if a.pending:
            text = state.observation(a.records[-1].result)
            a.seq.append(encode_literal(self.tokenizer, text), "tool")  # untrusted: no special tokens
        a.pending = []
        if len(a.seq) >= self.config.max_total_tokens:
            a.finish_reason = "length"

    def _finish(self, a: _Attempt, group_prefix: str) -> list[Trajectory]:
        """The attempt's trajectory, or its segments' when it compacted (one verdict, one advantage)."""
        def segment(seq: TokenSequence, messages: list[Message], records: list[ToolCallRecord], turns: int):
            return Trajectory(
                token_ids=seq.token_ids,
                prompt_len=seq.spans[0].end,
                loss_mask=seq.loss_mask,
                logprobs=seq.logprobs,
                spans=seq.spans,
                messages=messages,
                tool_calls=records,
                group_id=f"{group_prefix}{a.task.id}",
                sample_index=a.sample_index,
                finish_reason=a.finish_reason or "stop",
                policy_version=self.engine.policy_version,
                task_id=a.task.id, family=a.task.family, turns=turns, void_turns=a.void_turns,
                failure=a.failure,
            )
        return finish_segments(a, segment)
