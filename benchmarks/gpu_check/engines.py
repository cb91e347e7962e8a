"""Engine wrappers the policy sections swap into ``trainer.runner`` for one step: the fixed-token
engine here, and ``benchmarks/scripted_turns.py``'s ``ScriptedTurnsEngine``. Both are
``WrappedEngine``s: every member of ``agentrl.engines.base.Engine`` but sampling, and every
other attribute, is the real engine's; only what is sampled changes.
"""

from __future__ import annotations

import contextlib
import random

from scripted_turns import WrappedEngine


class FixedTokensEngine(WrappedEngine):
    """Answers every row with ``max_new_tokens`` random ordinary token ids at once (no model call).

    For timing the update on a batch of known shape: the rollout costs next to nothing and
    every attempt has exactly ``max_new_tokens`` sampled tokens. The ids are below
    ``plain_ids`` (the tokenizer's ordinary vocabulary), so none ends a turn or opens a tool
    call. The log-probs returned (μ) are a constant, so the step's sampler/trainer mismatch
    figures mean nothing.
    """

    batcher_stats = None  # no batcher: nothing is computed

    def __init__(self, inner, plain_ids: int, seed: int = 0):
        super().__init__(inner)
        self.plain_ids = plain_ids
        self.rng = random.Random(seed)

    def _fixed(self, n: int):
        from agentrl.engines.base import Generation

        return Generation([self.rng.randrange(self.plain_ids) for _ in range(n)], [-12.0] * n, "length")

    def generate(self, prompts, params):
        return [self._fixed(params.max_new_tokens) for _ in prompts]

    async def agenerate(self, prompt, params):
        # the per-attempt loop (the inner engine is per_request_async) asks here, not the model
        return self._fixed(params.max_new_tokens)


@contextlib.contextmanager
def runner_engine(trainer, engine):
    """``trainer.runner`` samples with ``engine`` inside the block; the trainer's own engine
    (weight sync, policy version) is untouched."""
    real = trainer.runner.engine
    trainer.runner.engine = engine
    try:
        yield engine
    finally:
        trainer.runner.engine = real
