"""Continuous batching on the in-process vLLM engine: ``VLLMEngine.agenerate``.

A driver thread (``driver.py``; during ``run_hosted``, the thread that called it) feeds vLLM's
own scheduler step by step: it adds every queued request to ``llm.llm_engine``
(``add_request``: token ids, per-request ``SamplingParams`` with the request's seed), calls
``step()``, and resolves each request as vLLM reports it finished.
A request queued while others run joins at the next step; vLLM's scheduler batches and
prefix-caches them as it does inside ``LLM.generate``. A request whose caller gave up is
aborted (``abort_request``), freeing its KV blocks.

The batch ``generate`` (evaluation, ``score``) and the stepper share the engine through its
lock: a batch call waits for the stepper's busy period to end, and the other way round.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

from agentrl.engines.base import SamplingParams
from agentrl.engines.driver import BatcherStats, DriverThread, Pending


@dataclass
class _Request:
    prompt: list[int]
    params: SamplingParams
    pending: Pending
    request_id: str = ""


class VLLMStepper:
    """Serves ``agenerate`` for a ``VLLMEngine`` (see the module docstring)."""

    def __init__(self, engine, stats: BatcherStats):
        self.engine = engine
        self.stats = stats
        self.running: dict[str, _Request] = {}
        self.driver = DriverThread("agentrl-vllm-stepper", self._serve, self._drain)
        self._ids = itertools.count()

    async def generate(self, prompt: list[int], params: SamplingParams):
        return await self.driver.submit(_Request(list(prompt), params, self.driver.pending()))

    def _serve(self) -> None:
        from vllm.inputs import TokensPrompt

        import torch

        llm_engine = self.engine.llm.llm_engine
        # vLLM's CPU attention plans its work for the thread count the engine was built with;
        # OpenMP keeps that count per thread, so this thread sets it too (through torch._C:
        # vLLM's CPU worker replaces torch.set_num_threads with a no-op after binding threads).
        # On a hosting thread (run_hosted: the trainer's own) its count comes back afterwards.
        threads = torch.get_num_threads()
        torch._C.set_num_threads(self.engine.num_threads)
        with self.engine.lock:
            self.engine.wake_up()
            try:
                while (self.running or self.driver.queued) and not self.driver.closing:
                    start = time.perf_counter()
                    for r in self.driver.take():
                        r.request_id = f"agentrl-{next(self._ids)}"
                        sp = self.engine.request_params(r.params)
                        llm_engine.add_request(r.request_id, TokensPrompt(prompt_token_ids=r.prompt), sp)
                        self.stats.joins += bool(self.running)
                        self.running[r.request_id] = r
                        self.stats.admitted += 1
                    self.stats.max_rows = max(self.stats.max_rows, len(self.running))
                    gone = [rid for rid, r in self.running.items() if r.pending.cancelled]
                    if gone:
                        llm_engine.abort_request(gone)
                        for rid in gone:
                            del self.running[rid]
                    if self.running:
                        for out in llm_engine.step():
                            r = self.running.get(out.request_id)
                            if r is None or not out.finished:
                                continue
                            del self.running[out.request_id]
                            c = out.outputs[0]
                            r.pending.resolve(self.engine.generation_of(c))
                        self.stats.steps += 1
                    self.stats.busy_s += time.perf_counter() - start
            finally:
                if self.running:  # an error: drop what vLLM still holds for us
                    llm_engine.abort_request(list(self.running))
                torch._C.set_num_threads(threads)

    def _drain(self) -> list[_Request]:
        """After a failed busy period: the requests it held (failed by the driver), forgotten."""
        held, self.running = list(self.running.values()), {}
        return held
