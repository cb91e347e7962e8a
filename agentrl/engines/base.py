"""The generation-engine protocol: token ids in, sampled token ids + log-probs out."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from agentrl.engines.driver import BatcherStats
    from agentrl.engines.grammar import Grammar


@dataclass
class SamplingParams:
    """How to sample one batch of continuations."""

    max_new_tokens: int = 256  # per call (one model turn)
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    stop_token_ids: list[int] = field(default_factory=list)  # row stops after sampling one
    stop_strings: list[str] = field(default_factory=list)  # row stops once its text ends with one
    seed: int | None = None  # None: continue the engine's own generator
    # Constrained decoding (capabilities.constrained): every token is drawn from the tokens the
    # grammar allows next, and its log-prob is the masked, renormalised one (agentrl.engines.grammar).
    grammar: Grammar | None = None


def attempt_seed(seed: int, group_id: str, sample_index: int, turn: int) -> int:
    """The seed of one attempt-turn's random stream: a hash of (run seed, group, sample,
    turn), so its tokens do not depend on the other attempts of the batch.

    >>> attempt_seed(0, "t0", 1, 2) == attempt_seed(0, "t0", 1, 2) != attempt_seed(0, "t0", 2, 2)
    True
    """
    digest = hashlib.blake2b(f"{seed}/{group_id}/{sample_index}/{turn}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # torch seeds are < 2**63


@dataclass
class Generation:
    """One row's sampled continuation.

    ``token_ids`` and ``logprobs`` have the same length; ``logprobs[i]`` is the log-prob of
    ``token_ids[i]`` under the sampling distribution (temperature applied; greedy gives the
    temperature-1 log-prob). A stop token, when hit, is the last element of ``token_ids``.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (stop token or string) or "length" (max_new_tokens)


@dataclass(frozen=True)
class EngineCapabilities:
    """What an engine can do, declared by its class: the trainer, the weight sync and the
    rollout thread read these flags, never the engine's name."""

    shares_trainer_weights: bool  # samples from the trainer's own nn.Module: no copy, nothing to push
    background_sampling: bool  # may sample in a thread beside the trainer (train.max_staleness > 0)
    can_sleep: bool  # sleep() frees its accelerator memory for the update; generate() wakes it
    per_request_async: bool = False  # serves requests one by one while others are in flight
    can_score: bool = False  # score() gives teacher-forced log-probs under the weights it samples with
    streams: bool = False  # agenerate_stream() hands over each token as it is sampled
    constrained: bool = False  # honours SamplingParams.grammar (engines without it refuse a grammar)


class Engine(Protocol):
    """A generation backend (hf, vllm, scripted) behind one interface: every member a caller
    (rollout runners, endpoint, trainer, weight sync, rollout thread) uses is declared here,
    and no caller probes an engine for anything else (tests/test_engine_protocol.py checks
    every engine class declares all of them).

    ``agenerate`` serves one request while others are in flight; an engine whose
    ``capabilities.per_request_async`` is False raises (:func:`not_per_request`) rather than
    pretend: callers read the flag first, and a batch ``generate`` per request would break
    engines whose calls are turns of one batch (``ScriptedEngine``). ``sleep`` frees the
    accelerator memory where ``capabilities.can_sleep``; elsewhere it does nothing (there is
    nothing of the engine's own to free). ``batcher_stats`` are the continuous batcher's
    counters (:class:`agentrl.engines.driver.BatcherStats`, read before and after a batch of
    ``agenerate`` calls); None for an engine without one.

    ``score`` and ``agenerate_stream`` are the optional members: only an engine whose
    ``capabilities.can_score`` (``capabilities.streams``) is True defines it, and callers read
    the flag first (the weight-sync canary, ``agentrl.run.canary``, is skipped on the others;
    the endpoint streams the others' completions in one piece once generated).

    A class in :mod:`agentrl.engines`' registry also offers the classmethod
    ``from_run(cfg, model, tokenizer, model_path)``, building it from a run config.
    """

    capabilities: EngineCapabilities
    policy_version: int  # optimizer steps behind its weights (bumped by sync_weights; the trainer may set it)
    batcher_stats: BatcherStats | None

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Sample one continuation for each prompt (token ids, never text)."""
        ...

    async def agenerate(self, prompt: list[int], params: SamplingParams) -> Generation:
        """Sample one continuation of one prompt, batched with the other requests in flight
        (``capabilities.per_request_async``; otherwise it raises)."""
        ...

    async def agenerate_stream(self, prompt: list[int], params: SamplingParams,
                               on_tokens: Callable[[list[int]], None]) -> Generation:
        """Optional (``capabilities.streams``): ``agenerate``, also calling ``on_tokens(new_ids)``
        on the caller's event loop as ids are sampled, every one of them before it returns. What
        is sampled is exactly what ``agenerate`` samples (the live stream of the endpoint)."""
        ...

    def sync_weights(self, model=None) -> None:
        """The trainer took an optimizer step: sample from ``model``'s current weights from
        now on (in place; engines sharing the trainer's parameters only bump the version)."""
        ...

    def sleep(self) -> None:
        """Free the engine's memory for the update: its accelerator memory where
        ``capabilities.can_sleep``, else at most what the update makes stale (copies of the
        weights, KV caches); the trainer's next ``sync_weights`` brings it back."""
        ...

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        """Optional (``capabilities.can_score``): teacher-forced log-probs at T=1 under the
        weights the engine samples with, ``out[i][t] = log p(seq[t] | seq[:t])`` and
        ``out[i][0] = 0.0``, the layout of ``agentrl.algo.batching.score_tokens``."""
        ...


def not_per_request(engine: object) -> NotImplementedError:
    """The error ``agenerate`` raises on an engine that does not serve requests one by one."""
    return NotImplementedError(
        f"{type(engine).__name__} does not serve requests one by one (capabilities.per_request_async is "
        "False): call generate() with the whole batch, or use an engine that does (model.engine=hf)")


def validate_request(prompts: list[list[int]], params: SamplingParams) -> None:
    """Reject a request no engine can serve, with the fix in the message."""
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token id; an empty prompt has nothing to condition on "
                         "(render a chat template or add a BOS token)")
    if params.max_new_tokens < 0 or params.temperature < 0 or not 0 < params.top_p <= 1:
        raise ValueError(f"invalid SamplingParams {params}: need max_new_tokens >= 0, temperature >= 0 "
                         "and 0 < top_p <= 1")


def early_answer(prompts: list[list[int]], params: SamplingParams) -> list[Generation] | None:
    """The answer to a request that needs no sampling (no prompts, or ``max_new_tokens == 0``),
    else None: every engine's ``generate`` starts with it, after validating the request."""
    if not prompts:
        return []
    if params.max_new_tokens == 0:
        return [Generation([], [], "length") for _ in prompts]
    return None
