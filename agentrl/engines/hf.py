"""The embedded generation engine: batched KV-cached sampling on a Hugging Face causal LM.

The engine shares its model with the trainer (the same parameter tensors), so a weight sync
is free: ``sync_weights`` only bumps ``policy_version``. Sampling runs on the fast
hand-written decoder for Qwen2/Llama models and on the model's own forward otherwise (see
``decode.py``); finished rows leave the batch as it goes.

Multi-turn rollouts send each row's whole conversation every turn. The engine keeps, after
each call, every row's KV cache keyed by the tokens it holds (a ``PrefixCache`` of at most
``max_cached_tokens`` tokens) and prefills a prompt that shares a prefix with a kept sequence
from there on; the samples and log-probs are the same as without it. The cache is dropped on
``sync_weights`` and whenever the parameters were modified or replaced (the KV belongs to the
weights that computed it). The stock decoder does not cache.

Every returned log-prob is what a teacher-forced forward over ``prompt + sampled ids`` gives:
``log_softmax(logits / T)[token]`` (``T = 1`` for greedy), before any top-p truncation, which is
the quantity the trainer recomputes for the importance ratio. A request with a grammar
(``SamplingParams.grammar``, constrained decoding) records the log-prob under the masked,
renormalised distribution it was drawn from instead (``agentrl.engines.grammar``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from contextlib import contextmanager

import torch

from agentrl.engines.base import EngineCapabilities, Generation, SamplingParams, early_answer, validate_request
from agentrl.engines.continuous import ContinuousBatcher
from agentrl.engines.driver import BatcherStats
from agentrl.engines.grammar import Constrainer, RowMatcher, mask_rows
from agentrl.engines.decode import FAST_MODEL_TYPES, FastDecoder, make_decoder
from agentrl.engines.sampler_dtype import CastWeights, sampler_dtype
from agentrl.engines.stock_decoder import StockDecoder
from agentrl.engines.prefix_cache import PrefixCache
from agentrl.engines.sampling import StopStrings, sample_tokens
from agentrl.types import ConfigError


SMALL_MODEL_PARAMS = 50_000_000


def default_threads(model, device: torch.device) -> int | None:
    """Torch threads while sampling: 1 for small models on CPU, else torch's own setting (None).

    A decode step of a small model is a few hundred tiny ops; OpenMP fan-out costs more than it
    saves there, and collapses when the cores are shared: on the 2-core development box the tiny
    model ran 5-9 ms/step with 1 thread and 24-86 ms/step with 2 (benchmarks/engine.py).
    """
    if device.type != "cpu":
        return None
    return 1 if sum(p.numel() for p in model.parameters()) < SMALL_MODEL_PARAMS else None


DEFAULT_MAX_CACHED_TOKENS = 65_536


def _weights_fingerprint(model) -> tuple[tuple[int, int], ...]:
    """Changes when any parameter is modified in place (its version counter moves: optimizer
    steps, ``copy_``, ``load_state_dict``) or gets new storage (``.to()``, a new tensor)."""
    return tuple((p.data_ptr(), p._version) for p in model.parameters())


class HFEngine:
    """Batched sampling from a transformers causal LM, token ids in, ids + log-probs out.

    ``num_threads``: torch threads used during ``generate`` on CPU (set for the call, then
    restored, so the trainer keeps its own setting); None picks 1 for models under 50M
    parameters and leaves torch's setting for bigger ones.

    ``max_cached_tokens``: tokens of KV kept between calls for prefix reuse, all rows together
    (least recently used out first; 0 disables). Each token costs
    ``2 * layers * kv_heads * head_dim`` elements of the model's dtype: 1 KiB on the tiny model,
    12 KiB for Qwen2.5-0.5B in bfloat16, so the default 65,536 is 64 MiB and 768 MiB.

    ``sampler_dtype``: None samples with the model's own tensors; ``torch.bfloat16`` has the
    fast decoder read bfloat16 copies of them, made once per weight version, and keep its KV
    in bfloat16 (``agentrl/engines/sampler_dtype.py``; ``model.sampler_dtype`` in a run).

    >>> from agentrl.models.tiny import ensure_tiny_model
    >>> engine = HFEngine.from_pretrained(ensure_tiny_model())
    >>> [g.finish_reason for g in engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4))]
    ['length']
    """

    capabilities = EngineCapabilities(shares_trainer_weights=True, background_sampling=True, can_sleep=False,
                                      per_request_async=True, can_score=True, streams=True, constrained=True)
    policy_version: int
    batcher_stats: BatcherStats

    @classmethod
    def from_run(cls, cfg, model, tokenizer, model_path: str) -> "HFEngine":
        """The engine of a run config: samples from the trainer's ``model`` itself."""
        # None lets the engine choose (1 thread for small models, during generation only)
        return cls(model, tokenizer, seed=cfg.seed, num_threads=cfg.model.num_threads,
                   sampler_dtype=sampler_dtype(cfg.model.sampler_dtype))

    def __init__(self, model, tokenizer, *, num_threads: int | None = None, seed: int = 0,
                 max_cached_tokens: int = DEFAULT_MAX_CACHED_TOKENS, sampler_dtype: torch.dtype | None = None):
        if max_cached_tokens < 0:
            raise ValueError(f"max_cached_tokens={max_cached_tokens}: pass 0 to disable the prefix cache")
        self.model = model
        self.tokenizer = tokenizer
        self.policy_version = 0
        self.device = model.get_input_embeddings().weight.device
        self.num_threads = num_threads if num_threads is not None else default_threads(model, self.device)
        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        self._decoder: FastDecoder | StockDecoder | None = None
        # the fast decoder's weights: the model's own (None) or bfloat16 copies (sampler_dtype.py)
        self.cast = CastWeights(sampler_dtype)
        self.prefix_cache = PrefixCache(max_cached_tokens) if max_cached_tokens else None
        self._fingerprint: tuple[tuple[int, int], ...] = ()
        self._lock = threading.RLock()
        self._batcher: ContinuousBatcher | None = None
        self._batcher_lock = threading.Lock()
        self.batcher_stats = BatcherStats()  # what the continuous batcher did (agenerate)
        self._constrainer: Constrainer | None = None  # built on the first constrained request

    @classmethod
    def from_pretrained(cls, name_or_path: str, *, device: str | None = None, num_threads: int | None = None,
                        seed: int = 0, max_cached_tokens: int = DEFAULT_MAX_CACHED_TOKENS,
                        sampler_dtype: torch.dtype | None = None, **model_kwargs) -> "HFEngine":
        """Load a model directory (or hub name, when online) and its tokenizer.

        ``model_kwargs`` go to ``AutoModelForCausalLM.from_pretrained`` (e.g. ``dtype=torch.bfloat16``).
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

        name = str(name_or_path)
        # Read at call time (huggingface_hub reads HF_HUB_OFFLINE only once, at import).
        offline = any(os.environ.get(v, "") not in ("", "0", "false", "False")
                      for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
        local_only = model_kwargs.pop("local_files_only", offline)
        try:
            if (os.path.isabs(name) or name.startswith(".")) and not os.path.isdir(name):
                raise FileNotFoundError(f"no directory {name}")
            tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=local_only)
            model = AutoModelForCausalLM.from_pretrained(name, local_files_only=local_only, **model_kwargs)
        except (OSError, ValueError) as err:
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            if local_only and not os.path.isdir(name) and not isinstance(err, FileNotFoundError):
                reason = "not a local directory, and not in the local Hugging Face cache"
            raise FileNotFoundError(
                f"cannot load model {name!r}{' (offline mode)' if local_only else ''}: {reason}\n"
                "Fix: pass a local directory holding config.json, the weights and the tokenizer "
                "(download it first where there is network: `hf download NAME --local-dir DIR`), "
                "or use the offline tiny model: "
                "`from agentrl.models.tiny import ensure_tiny_model; HFEngine.from_pretrained(ensure_tiny_model())`."
            ) from err
        if device is not None:
            model.to(device)
        return cls(model, tokenizer, num_threads=num_threads, seed=seed, max_cached_tokens=max_cached_tokens,
                   sampler_dtype=sampler_dtype)

    @property
    def decoder(self) -> FastDecoder | StockDecoder:
        """The forward used for sampling (chosen by an exactness probe, re-chosen if the model's
        structure changes, e.g. LoRA layers wrapped around the projections after creation).
        A fast decoder gets the engine's prefix cache (also one set from outside)."""
        if self._decoder is None or (isinstance(self._decoder, FastDecoder) and not FastDecoder.supports(self.model)):
            self._decoder = make_decoder(self.model, cast=self.cast)
            if self.cast.dtype is not None and not isinstance(self._decoder, FastDecoder):
                raise ConfigError(f"model.sampler_dtype={str(self.cast.dtype).removeprefix('torch.')} needs the fast "
                                  f"decoder, which does not run {type(self.model).__name__} (supported: "
                                  f"{', '.join(FAST_MODEL_TYPES)}); set model.sampler_dtype=float32")
            self.clear_prefix_cache()  # a new forward: KV from the old one is not trusted
        if isinstance(self._decoder, FastDecoder):
            self._decoder.prefix_cache = self.prefix_cache
        return self._decoder

    def clear_prefix_cache(self) -> None:
        """Forget every kept KV cache (the next call prefills every prompt whole)."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    def sync_weights(self, model=None) -> None:
        """The trainer took an optimizer step: later samples come from the new policy.

        The engine shares the trainer's parameter tensors, so nothing is copied; a ``model``
        other than the engine's own (e.g. the trainer rebuilt or wrapped it) is adopted.
        """
        if model is not None and model is not self.model:
            self.model = model
            self.device = model.get_input_embeddings().weight.device
            self._decoder = None
            self.cast.clear()
        self.clear_prefix_cache()  # computed by the old weights
        self.policy_version += 1

    def sleep(self) -> None:
        """Free what the coming optimizer step makes stale, so that it is not held through the
        update: the bfloat16 copies of the weights (``sampler_dtype``; 0.27 GB for SmolLM2-135M)
        and the kept KV caches. The weights themselves are the trainer's own: nothing else to
        free (``can_sleep`` is False). The next turns cast and prefill again, as they would have."""
        self.cast.clear()
        self.clear_prefix_cache()

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        """Teacher-forced log-probs at T=1 under the weights the engine samples with (a forward
        of its own model, the one its decoder reads): ``out[i][t] = log p(seq[t] | seq[:t])``,
        ``out[i][0] = 0.0``, the layout of ``agentrl.algo.batching.score_tokens``. Touches
        neither the prefix cache nor the random stream.

        >>> from agentrl.models.tiny import ensure_tiny_model
        >>> engine = HFEngine.from_pretrained(ensure_tiny_model())
        >>> [len(row) for row in engine.score([[1, 2, 3], [4, 5]])]
        [3, 2]
        """
        validate_request(sequences, SamplingParams())
        out = []
        with self.sampling_mode(), torch.inference_mode():
            # a narrower sampler dtype: score on the copies it samples with, through its own forward
            narrow = self.cast.dtype is not None and isinstance(self.decoder, FastDecoder)
            scorer = FastDecoder(self.model, None, self.cast) if narrow else None
            for seq in sequences:  # one row each: no padding to get right, a few dozen tokens
                ids = torch.tensor([seq], device=self.device)
                if scorer is not None:
                    logits = scorer.prefill([list(seq)], 1, every_position=True)[None]
                    scorer.release()
                else:
                    logits = self.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits
                lp = torch.log_softmax(logits[0, :-1].float(), dim=-1).gather(1, ids[0, 1:, None])[:, 0]
                out.append([0.0] + lp.tolist())
        return out

    def generator_for(self, seed: int | None) -> torch.Generator:
        """A request's random stream: its own when it has a seed, else the engine's."""
        if seed is None:
            return self._generator
        return torch.Generator(device=self.device).manual_seed(seed)

    @contextmanager
    def sampling_mode(self):
        """Eval mode, the sampling thread count and a prefix cache that matches the weights,
        around one piece of sampling work; the trainer's settings come back afterwards. Holds
        the engine's lock: the batch ``generate`` and the continuous batcher never interleave."""
        with self._lock:
            was_training, threads = self.model.training, torch.get_num_threads()
            self.model.eval()  # no dropout while sampling
            if self.num_threads:
                torch.set_num_threads(self.num_threads)
            if self.prefix_cache is not None:
                # A safety net under sync_weights: weights changed without it still invalidate the KV.
                fingerprint = _weights_fingerprint(self.model)
                if fingerprint != self._fingerprint:
                    self.clear_prefix_cache()
                    self._fingerprint = fingerprint
            try:
                yield
            finally:
                self.model.train(was_training)
                torch.set_num_threads(threads)

    def row_matcher(self, params: SamplingParams) -> RowMatcher:
        """A fresh grammar state for one row of a request with ``params.grammar``."""
        if self._constrainer is None:
            vocab = self.model.get_output_embeddings().weight.shape[0]  # the logits' width
            self._constrainer = Constrainer(self.tokenizer, vocab)
        return self._constrainer.matcher(params.grammar, params.stop_token_ids)

    def new_decoder(self) -> FastDecoder | StockDecoder:
        """A decoder of the engine's kind with its own batch state (the continuous batcher's),
        sharing the engine's prefix cache."""
        proto = self.decoder
        if isinstance(proto, FastDecoder):
            return FastDecoder(self.model, self.prefix_cache, self.cast)
        return StockDecoder(self.model)

    async def agenerate(self, prompt: list[int], params: SamplingParams) -> Generation:
        """Sample one continuation of one prompt, continuously batched with every other
        request in flight (see ``agentrl.engines.continuous``).

        >>> import asyncio
        >>> from agentrl.models.tiny import ensure_tiny_model
        >>> engine = HFEngine.from_pretrained(ensure_tiny_model())
        >>> async def two():
        ...     p = SamplingParams(max_new_tokens=3, seed=1)
        ...     return await asyncio.gather(engine.agenerate([1, 2], p), engine.agenerate([3], p))
        >>> [len(g.token_ids) for g in asyncio.run(two())]
        [3, 3]
        """
        return await self.agenerate_stream(prompt, params, None)

    async def agenerate_stream(self, prompt: list[int], params: SamplingParams,
                               on_tokens: Callable[[list[int]], None] | None) -> Generation:
        """``agenerate``, calling ``on_tokens([id])`` on the caller's loop after each decode step
        (the request's own row only; the same draws, so the same tokens)."""
        validate_request([prompt], params)
        done = early_answer([prompt], params)
        if done is not None:
            return done[0]
        with self._batcher_lock:
            if self._batcher is None:
                self._batcher = ContinuousBatcher(self, self.batcher_stats)
        return await self._batcher.generate(prompt, params, on_tokens)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Sample one continuation per prompt (see ``agentrl.engines.base.Engine``)."""
        validate_request(prompts, params)
        done = early_answer(prompts, params)
        if done is not None:
            return done
        with self.sampling_mode():
            try:
                return self._generate(prompts, params, self.generator_for(params.seed))
            finally:
                self.decoder.release()  # free the KV cache between calls

    def _generate(self, prompts: list[list[int]], params: SamplingParams, gen: torch.Generator) -> list[Generation]:
        decoder = self.decoder
        n = len(prompts)
        stop_ids = set(params.stop_token_ids)
        stops = StopStrings(self.tokenizer, params.stop_strings)
        tokens_out: list[list[int]] = [[] for _ in range(n)]
        logprobs_out: list[list[float]] = [[] for _ in range(n)]
        finish: list[str | None] = [None] * n
        rows = list(range(n))  # prompt index of each row the decoder still holds
        caching = getattr(decoder, "prefix_cache", None) is not None
        matchers = [self.row_matcher(params) for _ in range(n)] if params.grammar is not None else None

        def remember(batch_rows: list[int]) -> None:
            # A row has fed its prompt and every sampled id but the last one.
            decoder.remember(batch_rows, [prompts[rows[j]] + tokens_out[rows[j]][:-1] for j in batch_rows])

        with torch.inference_mode():
            # All uniforms up front, one row per prompt: row r's draws are the first numbers of
            # its own row of the stream, whatever the other rows do (or how many there are).
            uniforms = torch.rand(n, params.max_new_tokens, generator=gen, device=self.device) \
                if params.temperature > 0 else torch.zeros(n, params.max_new_tokens, device=self.device)
            logits = decoder.prefill(prompts, params.max_new_tokens)
            row_index = torch.arange(n, device=self.device)
            for step in range(params.max_new_tokens):
                if matchers is not None:
                    live_rows = [j for j, r in enumerate(rows) if finish[r] is None]
                    mask_rows(logits, live_rows, [matchers[rows[j]] for j in live_rows])
                tok, lp = sample_tokens(logits, temperature=params.temperature, top_p=params.top_p,
                                        uniforms=uniforms[row_index, step])
                tok_list, lp_list = tok.tolist(), lp.tolist()
                running = []
                for j, r in enumerate(rows):
                    if finish[r] is not None:
                        continue  # finished earlier, still in the decoder until the next compaction
                    tokens_out[r].append(tok_list[j])
                    logprobs_out[r].append(lp_list[j])
                    if matchers is not None:
                        matchers[r].advance(tok_list[j])
                    if tok_list[j] in stop_ids:
                        finish[r] = "stop"
                    else:
                        running.append(r)
                for r, hit in zip(running, stops.hits([tokens_out[r] for r in running])):
                    if hit:
                        finish[r] = "stop"
                live = [j for j, r in enumerate(rows) if finish[r] is None]
                if not live or step == params.max_new_tokens - 1:
                    break
                if len(live) <= 0.75 * len(rows):
                    # Compacting copies the whole cache, so do it once a quarter of the rows are done.
                    if caching:
                        remember(sorted(set(range(len(rows))) - set(live)))
                    keep = torch.tensor(live, device=self.device)
                    decoder.keep(keep)
                    rows = [rows[j] for j in live]
                    row_index = row_index[keep]
                    tok = tok[keep]
                logits = decoder.step(tok)
            if caching:
                remember(list(range(len(rows))))
        return [Generation(tokens_out[i], logprobs_out[i], finish[i] or "length") for i in range(n)]
