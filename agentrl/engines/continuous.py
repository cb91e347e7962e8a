"""Continuous batching for the embedded engine: many requests in flight, one decode batch.

Each ``await batcher.generate(prompt, params)`` queues a request. One driver coroutine, on
the caller's event loop, repeats a step:

1. admit every queued request: its prompt is prefilled (prefix cache first) and its rows join
   the running batch (``FastDecoder.join``; the stock decoder, which cannot join, admits a new
   batch only when the running one is empty);
2. sample one token for every running row from its own pre-drawn uniforms, record it, and
   finish the rows that hit a stop token, a stop string or their own ``max_new_tokens``
   (their KV goes to the prefix cache, their future is resolved at once);
3. drop finished rows once they are a quarter of the batch (compaction copies the cache);
4. feed the sampled tokens (one decode step for the whole batch), then yield to the event
   loop, so that tool calls that returned meanwhile can queue their next request, which joins
   at the next step.

The driver stops when nothing is queued or running and restarts with the next request, so
an idle engine costs nothing while every attempt waits on its tools.

Random streams are per request: a request with ``params.seed`` draws its ``max_new_tokens``
uniforms from its own generator, so its tokens do not depend on which requests share its
batches, up to the float summation order of batched matrix products (the tests check token
equality against each request run alone). Without a seed the draws come from the engine's
generator in admission order.

A request whose awaiting task is cancelled (a per-attempt timeout) leaves the batch at the
next step; its slot and KV are freed at the next compaction.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from agentrl.engines.base import Generation, SamplingParams
from agentrl.engines.sampling import StopStrings, sample_tokens


@dataclass
class _Request:
    prompt: list[int]
    params: SamplingParams
    future: asyncio.Future
    uniforms: Tensor | None = None  # (max_new_tokens,) this request's draws, set on admission
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None  # None while running; "cancelled" when its awaiter went away


@dataclass
class BatcherStats:
    """What the drivers of an engine did since it was created (monotone counters)."""

    steps: int = 0  # decode steps (each samples one token for every running row)
    busy_s: float = 0.0  # seconds the driver computed (prefill, sampling, decode steps)
    admitted: int = 0  # requests that joined a running batch or started one
    joins: int = 0  # admissions into a batch that already had running rows
    max_rows: int = 0  # the largest batch it ran


class ContinuousBatcher:
    """Serves ``generate`` requests of one event loop from one continuously batched decode.

    ``engine`` is an ``HFEngine`` (its decoder, tokenizer, generator and the sampling mode it
    enters around the driver's work).
    """

    def __init__(self, engine, loop: asyncio.AbstractEventLoop, stats: BatcherStats):
        self.engine = engine
        self.decoder = engine.new_decoder()  # its own batch state; the engine's prefix cache
        self.loop = loop
        self.queue: list[_Request] = []
        self.rows: list[_Request] = []  # the decoder's batch rows, in order
        self.logits: Tensor | None = None  # (len(rows), V): next-token logits of every row
        self.stats = stats  # the engine's counters, across loops
        self._driver: asyncio.Task | None = None
        self._stops: dict[tuple[str, ...], StopStrings] = {}

    @property
    def idle(self) -> bool:
        return self._driver is None and not self.queue and not self.rows

    async def generate(self, prompt: list[int], params: SamplingParams) -> Generation:
        """Sample one continuation of ``prompt``; other requests share the decode batch."""
        req = _Request(list(prompt), params, self.loop.create_future())
        self.queue.append(req)
        if self._driver is None:
            self.decoder = self.engine.new_decoder()  # the engine's current model and forward
            self._driver = self.loop.create_task(self._drive())
        return await req.future

    async def _drive(self) -> None:
        try:
            while self.queue or self.rows:
                start = time.perf_counter()
                with self.engine.sampling_mode(), torch.inference_mode():
                    self._admit()
                    self._step()
                self.stats.busy_s += time.perf_counter() - start
                await asyncio.sleep(0)  # let returned tools queue their next turn
        except BaseException as err:  # fail every waiter rather than hang them
            for r in self.queue + self.rows:
                if not r.future.done():
                    r.future.set_exception(err)
            self.queue, self.rows = [], []
            if not isinstance(err, Exception):
                raise
        finally:
            self.rows, self.logits = [], None
            self.decoder.release()
            self._driver = None

    # -- one step ---------------------------------------------------------------------------

    def _admit(self) -> None:
        decoder = self.decoder
        can_join = hasattr(decoder, "join")
        if not self.queue or (self.rows and not can_join):
            return
        new = [r for r in self.queue if not r.future.cancelled()]
        self.queue = []
        if not new:
            return
        if self.rows and any(r.finish for r in self.rows):
            self._compact()  # the merge copies the cache anyway: do not carry finished rows
        for r in new:
            if r.params.temperature > 0:
                gen = self.engine.generator_for(r.params.seed)
                r.uniforms = torch.rand(r.params.max_new_tokens, generator=gen, device=self.engine.device)
            else:
                r.uniforms = torch.zeros(r.params.max_new_tokens, device=self.engine.device)
        prompts = [r.prompt for r in new]
        longest = max(r.params.max_new_tokens for r in new)
        if self.rows:
            logits = decoder.join(prompts, longest)
            self.logits = torch.cat([self.logits, logits])
            self.stats.joins += len(new)
        else:
            self.logits = decoder.prefill(prompts, longest)
        self.rows += new
        self.stats.admitted += len(new)
        self.stats.max_rows = max(self.stats.max_rows, len(self.rows))

    def _step(self) -> None:
        if not self.rows:
            return
        live = [j for j, r in enumerate(self.rows) if r.finish is None]
        tokens = torch.zeros(len(self.rows), dtype=torch.long, device=self.logits.device)
        for (temperature, top_p), idx in _groups(self.rows, live).items():
            u = torch.stack([self.rows[j].uniforms[len(self.rows[j].tokens)] for j in idx])
            part = self.logits if len(idx) == len(self.rows) else self.logits[idx]
            tok, lp = sample_tokens(part, temperature=temperature, top_p=top_p, uniforms=u)
            tokens[idx] = tok
            for j, t, p in zip(idx, tok.tolist(), lp.tolist()):
                self.rows[j].tokens.append(t)
                self.rows[j].logprobs.append(p)
        self._finish_rows(live)
        self.stats.steps += 1
        if all(r.finish for r in self.rows):
            self.rows, self.logits = [], None
            self.decoder.release()
            return
        if sum(1 for r in self.rows if r.finish) >= 0.25 * len(self.rows):
            tokens = tokens[self._compact()]
        self.logits = self.decoder.step(tokens)

    def _finish_rows(self, live: list[int]) -> None:
        decoder = self.decoder
        by_stops: dict[tuple[str, ...], list[int]] = {}
        for j in live:
            r = self.rows[j]
            if r.future.cancelled():
                r.finish = "cancelled"
            elif r.tokens[-1] in r.params.stop_token_ids:
                r.finish = "stop"
            elif r.params.stop_strings:
                by_stops.setdefault(tuple(r.params.stop_strings), []).append(j)
        for key, idx in by_stops.items():
            checker = self._stops.setdefault(key, StopStrings(self.engine.tokenizer, list(key)))
            for j, hit in zip(idx, checker.hits([self.rows[j].tokens for j in idx])):
                if hit:
                    self.rows[j].finish = "stop"
        for j in live:
            r = self.rows[j]
            if r.finish is None and len(r.tokens) >= r.params.max_new_tokens:
                r.finish = "length"
            if r.finish is None or r.finish == "cancelled":
                continue
            # The row has fed its prompt and every sampled id but the last one.
            decoder.remember([j], [r.prompt + r.tokens[:-1]])
            r.future.set_result(Generation(r.tokens, r.logprobs, r.finish))

    def _compact(self) -> Tensor:
        """Drop finished rows from the decoder; returns the kept row indices."""
        keep = torch.tensor([j for j, r in enumerate(self.rows) if r.finish is None], dtype=torch.long,
                            device=self.logits.device)
        self.decoder.keep(keep)
        self.rows = [self.rows[j] for j in keep.tolist()]
        self.logits = self.logits[keep]
        return keep


def _groups(rows: list[_Request], live: list[int]) -> dict[tuple[float, float], list[int]]:
    """Live row indices by (temperature, top_p): each group is sampled in one call."""
    out: dict[tuple[float, float], list[int]] = {}
    for j in live:
        out.setdefault((rows[j].params.temperature, rows[j].params.top_p), []).append(j)
    return out
