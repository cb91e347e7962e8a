"""An engine that replays fixed token sequences: for tests and for debugging templates.

Example::

    from agentrl.engines import SamplingParams
    from agentrl.engines.scripted import ScriptedEngine

    eng = ScriptedEngine([[5, 6, 2], [7, 2]])           # turn 0 writes 5 6 2, turn 1 writes 7 2
    out = eng.generate([[1, 2, 3]], SamplingParams(stop_token_ids=[2]))
    assert out[0].token_ids == [5, 6, 2] and out[0].finish_reason == "stop"
"""

from __future__ import annotations

from typing import Callable

from agentrl.engines.base import EngineCapabilities, Generation, SamplingParams

Script = Callable[[list[int], int], list[int]]


class ScriptedEngine:
    """Call ``k`` of :meth:`generate` answers every row with ``turns[k]``.

    Rows of one rollout move through turns together, so the call index is the turn index.
    A callable ``script(prompt_ids, call_index) -> ids`` gives per-row answers instead.
    Each sampled token gets log-prob ``logprob``.
    """

    capabilities = EngineCapabilities(shares_trainer_weights=True, background_sampling=True, can_sleep=False)

    def __init__(self, turns: list[list[int]] | Script, logprob: float = -0.5):
        self._script: Script = turns if callable(turns) else (lambda _p, k: turns[k])
        self.logprob = logprob
        self.calls = 0
        self.policy_version = 0

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        out = []
        for prompt in prompts:
            ids = list(self._script(list(prompt), self.calls))
            finish = "length"
            for i, t in enumerate(ids):
                if t in params.stop_token_ids:
                    ids, finish = ids[: i + 1], "stop"
                    break
            if len(ids) > params.max_new_tokens:
                ids, finish = ids[: params.max_new_tokens], "length"
            elif finish == "length" and len(ids) < params.max_new_tokens:
                finish = "stop"  # the script ended the turn without a stop token
            out.append(Generation(token_ids=ids, logprobs=[self.logprob] * len(ids), finish_reason=finish))
        self.calls += 1
        return out

    def sync_weights(self, model=None) -> None:
        self.policy_version += 1
