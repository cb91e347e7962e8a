"""An engine that replays fixed token sequences: for tests and for debugging templates.

Example::

    from agentrl.engines import SamplingParams
    from agentrl.engines.scripted import ScriptedEngine

    eng = ScriptedEngine([[5, 6, 2], [7, 2]])           # turn 0 writes 5 6 2, turn 1 writes 7 2
    out = eng.generate([[1, 2, 3]], SamplingParams(stop_token_ids=[2]))
    assert out[0].token_ids == [5, 6, 2] and out[0].finish_reason == "stop"
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Callable

from agentrl.engines.base import EngineCapabilities, Generation, SamplingParams, not_per_request
from agentrl.engines.sampling import StopStrings

if TYPE_CHECKING:
    from agentrl.engines.driver import BatcherStats

Script = Callable[[list[int], int], list[int]]


class ScriptedEngine:
    """Call ``k`` of :meth:`generate` answers every row with ``turns[k]``.

    Rows of one rollout move through turns together, so the call index is the turn index.
    A callable ``script(prompt_ids, call_index) -> ids`` gives per-row answers instead.
    Each sampled token gets log-prob ``logprob``. With a ``tokenizer``, ``params.stop_strings``
    end a row as the real engines end it: after the token in whose text a stop string ends.
    """

    capabilities = EngineCapabilities(shares_trainer_weights=True, background_sampling=True, can_sleep=False)
    policy_version: int
    batcher_stats: BatcherStats | None = None  # no continuous batcher

    def __init__(self, turns: list[list[int]] | Script, logprob: float = -0.5, tokenizer=None):
        self._script: Script = turns if callable(turns) else (lambda _p, k: turns[k])
        self.logprob = logprob
        self.tokenizer = tokenizer
        self.calls = 0
        self.policy_version = 0

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        out = [self._answer(list(prompt), self.calls, params) for prompt in prompts]
        self.calls += 1
        return out

    def _answer(self, prompt: list[int], turn: int, params: SamplingParams) -> Generation:
        ids = list(self._script(prompt, turn))
        finish = "length"
        stops = StopStrings(self.tokenizer, params.stop_strings) if self.tokenizer is not None else None
        for i, t in enumerate(ids):
            if t in params.stop_token_ids or (stops is not None and stops.hits([ids[: i + 1]])[0]):
                ids, finish = ids[: i + 1], "stop"
                break
        if len(ids) > params.max_new_tokens:
            ids, finish = ids[: params.max_new_tokens], "length"
        elif finish == "length" and len(ids) < params.max_new_tokens:
            finish = "stop"  # the script ended the turn without a stop token
        return Generation(token_ids=ids, logprobs=[self.logprob] * len(ids), finish_reason=finish)

    async def agenerate(self, prompt: list[int], params: SamplingParams) -> Generation:
        """Not served: a call's index is the turn of the whole batch (see PerRequestScriptedEngine)."""
        raise not_per_request(self)

    def sync_weights(self, model=None) -> None:
        self.policy_version += 1

    def sleep(self) -> None:
        """Nothing to free."""


class PerRequestScriptedEngine(ScriptedEngine):
    """The scripted engine behind the per-attempt rollout loop (``agenerate``): a request's
    turn index is the number of distinct earlier prompts that are strict prefixes of its
    prompt (the attempt's own earlier turns), so attempts need not move together.

    >>> import asyncio
    >>> eng = PerRequestScriptedEngine([[5, 2], [7, 2]])
    >>> async def turns():
    ...     first = await eng.agenerate([1], SamplingParams(stop_token_ids=[2]))
    ...     return first, await eng.agenerate([1, *first.token_ids, 9], SamplingParams(stop_token_ids=[2]))
    >>> [g.token_ids for g in asyncio.run(turns())]
    [[5, 2], [7, 2]]
    """

    capabilities = EngineCapabilities(shares_trainer_weights=True, background_sampling=True, can_sleep=False,
                                      per_request_async=True)

    def __init__(self, turns: list[list[int]] | Script, logprob: float = -0.5, tokenizer=None):
        super().__init__(turns, logprob, tokenizer)
        self.seen: set[tuple[int, ...]] = set()
        self.request_log: list[tuple[int, ...]] = []  # prompts in the order requests arrived

    async def agenerate(self, prompt: list[int], params: SamplingParams) -> Generation:
        key = tuple(prompt)
        turn = sum(1 for p in self.seen if len(p) < len(key) and key[: len(p)] == p)
        self.seen.add(key)
        self.request_log.append(key)
        await asyncio.sleep(0)  # a real engine answers later: let other attempts run meanwhile
        return self._answer(list(prompt), turn, params)
