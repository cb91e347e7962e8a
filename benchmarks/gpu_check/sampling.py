"""Sampling speed: HFEngine (agentrl's KV-cached decoder) against transformers ``generate``.

Same model object, same prompts (chat-formatted arithmetic questions, ``sampling_group`` rows
per prompt as in a GRPO group), temperature 1, no stop token: every row samples all
``sampling_new_tokens`` tokens on both paths. Each path is warmed up once with a few tokens;
then one timed call per batch size (the GPU is synchronised around it). The engine's prefix
cache is cleared before each call, so both paths prefill every prompt.
"""

from __future__ import annotations

import copy
import time

from gpu_check.models import torch_dtype
from gpu_check.profile import Profile
from gpu_check.results import SamplingData, SamplingRow


def make_prompts(tokenizer, batch: int, group: int) -> list[list[int]]:
    """``batch`` prompt id lists, ``group`` consecutive rows per distinct question."""
    questions = [f"What is {17 * i + 3} * {i % 13 + 2} - {i * 7 % 11}? Use the python tool, then answer."
                 for i in range(max(1, batch // group))]
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                             tokenize=True, return_dict=False) for q in questions]
    return [list(prompts[(i // group) % len(prompts)]) for i in range(batch)]


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _peak_reset(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()


def _peak_gb(device: str) -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None


def engine_call(engine, prompts: list[list[int]], new: int, device: str) -> float:
    """Seconds for one ``HFEngine.generate`` of ``new`` tokens per row (all rows run to the end)."""
    from agentrl import SamplingParams

    engine.clear_prefix_cache()
    _sync(device)
    t0 = time.perf_counter()
    out = engine.generate(prompts, SamplingParams(max_new_tokens=new, temperature=1.0, seed=0))
    _sync(device)
    seconds = time.perf_counter() - t0
    if any(len(g.token_ids) != new for g in out):
        raise RuntimeError("a row of the engine stopped early although no stop token was set")
    return seconds


def generate_call(model, prompts: list[list[int]], new: int, pad_id: int, device: str) -> float:
    """Seconds for one transformers ``generate`` on the left-padded batch, sampling, no eos."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    cfg = copy.deepcopy(model.generation_config)
    cfg.update(eos_token_id=None, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new,
               min_new_tokens=new, pad_token_id=pad_id)
    with torch.inference_mode():
        _sync(device)
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, generation_config=cfg)
        _sync(device)
        seconds = time.perf_counter() - t0
    if out.shape[1] != width + new:
        raise RuntimeError(f"generate returned {out.shape[1] - width} new tokens, expected {new}")
    return seconds


def run_sampling(profile: Profile, model_dir: str, label: str) -> SamplingData:
    """Both paths, every batch size of the profile, on the model in ``model_dir``."""
    import torch

    from agentrl import HFEngine

    dev = profile.device
    engine = HFEngine.from_pretrained(model_dir, device=dev, dtype=torch_dtype(profile.dtype))
    model, tok = engine.model, engine.tokenizer
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    prompts = make_prompts(tok, max(profile.sampling_batches), profile.sampling_group)
    lengths = sorted(len(p) for p in prompts)
    data = SamplingData(model=label, params_m=sum(p.numel() for p in model.parameters()) / 1e6,
                        dtype=profile.dtype, prompt_tokens=[lengths[0], lengths[-1]])
    big = prompts[: max(profile.sampling_batches)]
    engine_call(engine, big, profile.sampling_warmup_tokens, dev)  # warm-up: kernels, allocator
    generate_call(model, big, profile.sampling_warmup_tokens, pad_id, dev)
    new = profile.sampling_new_tokens
    for batch in profile.sampling_batches:
        rows = prompts[:batch]
        for path in ("engine", "generate"):
            _peak_reset(dev)
            seconds = (engine_call(engine, rows, new, dev) if path == "engine"
                       else generate_call(model, rows, new, pad_id, dev))
            data.rows.append(SamplingRow(batch=batch, path=path, seconds=seconds, new_tokens=new,
                                         tokens_per_s=batch * new / seconds, ms_per_step=1000 * seconds / new,
                                         peak_gpu_gb=_peak_gb(dev)))
    del engine, model
    if dev.startswith("cuda"):
        torch.cuda.empty_cache()
    return data
