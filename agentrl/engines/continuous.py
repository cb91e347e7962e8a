"""Continuous batching for the embedded engine: many requests in flight, one decode batch.

Each ``await batcher.generate(prompt, params)`` queues a request. One driver thread repeats a
step (its tensor work releases the GIL, so the attempts' own Python work on the event loop
- parsing, templates, tool calls - runs beside it):

1. admit every queued request: its prompt is prefilled (prefix cache first) and its rows join
   the running batch (``FastDecoder.join``; the stock decoder, which cannot join, admits a new
   batch only when the running one is empty);
2. sample one token for every running row from its own pre-drawn uniforms, record it, and
   finish the rows that hit a stop token, a stop string or their own ``max_new_tokens``
   (their KV goes to the prefix cache, their future is resolved at once);
3. drop finished rows once they are a quarter of the batch (compaction copies the cache);
4. feed the sampled tokens (one decode step for the whole batch); requests queued meanwhile
   (attempts whose tools returned) join at the next step.

The driver waits without spinning while nothing is queued or running (every attempt on its
tools), and its thread ends after ``IDLE_EXIT_S`` seconds of that.

Random streams are per request: a request with ``params.seed`` draws its ``max_new_tokens``
uniforms from its own generator, so its tokens do not depend on which requests share its
batches, up to the float summation order of batched matrix products (the tests check token
equality against each request run alone). Without a seed the draws come from the engine's
generator in admission order.

A request whose awaiting task is cancelled (a per-attempt timeout) leaves the batch at the
next step; its slot and KV are freed at the next compaction.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from agentrl.engines.base import Generation, SamplingParams
from agentrl.engines.driver import BatcherStats, DriverThread, Pending
from agentrl.engines.grammar import RowMatcher, mask_rows
from agentrl.engines.sampling import StopStrings, sample_tokens


@dataclass
class _Request:
    prompt: list[int]
    params: SamplingParams
    pending: Pending  # the caller's future, on the caller's loop
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None  # None while running; "cancelled" when its awaiter went away
    on_tokens: Callable[[list[int]], None] | None = None  # called (on the caller's loop) with each sampled id
    matcher: RowMatcher | None = None  # params.grammar's state: the row samples under its mask


class ContinuousBatcher:
    """Serves ``generate`` requests, from any event loop, from one continuously batched decode
    that runs in a driver thread of its own.

    ``engine`` is an ``HFEngine`` (its decoder, tokenizer, generator and the sampling mode it
    enters around each busy period).
    """

    def __init__(self, engine, stats: BatcherStats):
        self.engine = engine
        # its own batch state over the engine's prefix cache, made by each busy period on the thread
        # that serves it (making one may run the decoder's probe: torch work, kept off the caller's loop)
        self.decoder = None
        self.stats = stats  # the engine's counters
        self.rows: list[_Request] = []  # the decoder's batch rows, in order (driver thread only)
        self.logits: Tensor | None = None  # (len(rows), V): next-token logits of every row
        self.draws: Tensor | None = None  # (len(rows), W): row j's uniform for its k-th token at [j, k]
        self.at: Tensor | None = None  # (len(rows),) long: tokens each row has sampled
        self.driver = DriverThread("agentrl-batcher", self._serve, self._drain)
        self._stops: dict[tuple[str, ...], StopStrings] = {}

    @property
    def idle(self) -> bool:
        return self.driver.idle

    async def generate(self, prompt: list[int], params: SamplingParams,
                       on_tokens: Callable[[list[int]], None] | None = None) -> Generation:
        """Sample one continuation of ``prompt``; other requests share the decode batch.
        ``on_tokens``: called on the caller's loop with each id as it is sampled (streaming).
        A grammar is compiled here, so that a schema it refuses fails this request only."""
        matcher = self.engine.row_matcher(params) if params.grammar is not None else None
        return await self.driver.submit(_Request(list(prompt), params, self.driver.pending(), on_tokens=on_tokens,
                                                 matcher=matcher))

    def _serve(self) -> None:
        """One busy period: admit and step until nothing is queued or running."""
        self.decoder = self.engine.new_decoder()  # the engine's current model and forward
        try:
            # Eval mode, threads and the prefix cache check once per busy period.
            with self.engine.sampling_mode():
                while (self.rows or self.driver.queued) and not self.driver.closing:
                    start, copied = time.perf_counter(), getattr(self.decoder, "copy_s", 0.0)
                    with torch.inference_mode():
                        self._admit()
                        admitted = time.perf_counter()
                        self._step()
                    self.stats.admit_s += admitted - start
                    self.stats.copy_s += getattr(self.decoder, "copy_s", 0.0) - copied
                    self.stats.busy_s += time.perf_counter() - start
        finally:
            self.logits = None
            self.decoder.release()

    def _drain(self) -> list[_Request]:
        """After a failed busy period: the rows it held (failed by the driver), forgotten."""
        rows, self.rows = self.rows, []
        return rows

    # -- one step ---------------------------------------------------------------------------

    def _admit(self) -> None:
        decoder = self.decoder
        if self.rows and not hasattr(decoder, "join"):
            return
        new = self.driver.take()
        if not new:
            return
        if self.rows and any(r.finish for r in self.rows):
            self._compact()  # the merge copies the cache anyway: do not carry finished rows
        longest = max(r.params.max_new_tokens for r in new)
        draws = torch.zeros(len(new), longest, device=self.engine.device)
        for i, r in enumerate(new):
            if r.params.temperature > 0:
                gen = self.engine.generator_for(r.params.seed)
                draws[i, : r.params.max_new_tokens] = torch.rand(r.params.max_new_tokens, generator=gen,
                                                                 device=self.engine.device)
        prompts = [r.prompt for r in new]
        at = torch.zeros(len(new), dtype=torch.long, device=self.engine.device)
        if self.rows:
            logits = decoder.join(prompts, longest)
            self.logits = torch.cat([self.logits, logits])
            width = max(self.draws.shape[1], longest)
            self.draws = torch.cat([F.pad(self.draws, (0, width - self.draws.shape[1])),
                                    F.pad(draws, (0, width - longest))])
            self.at = torch.cat([self.at, at])
            self.stats.joins += len(new)
        else:
            self.logits = decoder.prefill(prompts, longest)
            self.draws, self.at = draws, at
        self.rows += new
        self.stats.admitted += len(new)
        self.stats.max_rows = max(self.stats.max_rows, len(self.rows))

    def _step(self) -> None:
        if not self.rows:
            return
        live = [j for j, r in enumerate(self.rows) if r.finish is None]
        tokens = torch.zeros(len(self.rows), dtype=torch.long, device=self.logits.device)
        # Row j's draw for its k-th token is draws[j, k], whatever else is in the batch.
        u_all = self.draws.gather(1, self.at.clamp(max=self.draws.shape[1] - 1)[:, None])[:, 0]
        self.at += 1
        constrained = [j for j in live if self.rows[j].matcher is not None]  # the other rows are not touched
        mask_rows(self.logits, constrained, [self.rows[j].matcher for j in constrained])
        for (temperature, top_p), idx in _groups(self.rows, live).items():
            whole = len(idx) == len(self.rows)
            part = self.logits if whole else self.logits[idx]
            tok, lp = sample_tokens(part, temperature=temperature, top_p=top_p, uniforms=u_all if whole else u_all[idx])
            tokens[idx] = tok
            for j, t, p in zip(idx, tok.tolist(), lp.tolist()):
                r = self.rows[j]
                r.tokens.append(t)
                r.logprobs.append(p)
                if r.matcher is not None:
                    r.matcher.advance(t)
                if r.on_tokens is not None:
                    r.pending.notify(r.on_tokens, [t])
        self._finish_rows(live)
        self.stats.steps += 1
        if all(r.finish for r in self.rows):
            self.rows, self.logits = [], None
            self.decoder.release()
            return
        if sum(1 for r in self.rows if r.finish) >= 0.25 * len(self.rows):
            tokens = tokens[self._compact()]
        start = time.perf_counter()
        self.logits = self.decoder.step(tokens)
        self.stats.step_s += time.perf_counter() - start

    def _finish_rows(self, live: list[int]) -> None:
        decoder = self.decoder
        by_stops: dict[tuple[str, ...], list[int]] = {}
        for j in live:
            r = self.rows[j]
            if r.pending.cancelled:
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
        done = []
        for j in live:
            r = self.rows[j]
            if r.finish is None and len(r.tokens) >= r.params.max_new_tokens:
                r.finish = "length"
            if r.finish is not None and r.finish != "cancelled":
                done.append(j)
        if done:  # a finished row has fed its prompt and every sampled id but the last one
            decoder.remember(done, [self.rows[j].prompt + self.rows[j].tokens[:-1] for j in done])
        for j in done:
            r = self.rows[j]
            r.pending.resolve(Generation(r.tokens, r.logprobs, r.finish))

    def _compact(self) -> Tensor:
        """Drop finished rows from the decoder; returns the kept row indices."""
        keep = torch.tensor([j for j, r in enumerate(self.rows) if r.finish is None], dtype=torch.long,
                            device=self.logits.device)
        self.decoder.keep(keep)
        self.rows = [self.rows[j] for j in keep.tolist()]
        self.logits, self.draws, self.at = self.logits[keep], self.draws[keep], self.at[keep]
        return keep


def _groups(rows: list[_Request], live: list[int]) -> dict[tuple[float, float], list[int]]:
    """Live row indices by (temperature, top_p): each group is sampled in one call."""
    out: dict[tuple[float, float], list[int]] = {}
    for j in live:
        out.setdefault((rows[j].params.temperature, rows[j].params.top_p), []).append(j)
    return out

