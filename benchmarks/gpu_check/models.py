"""The models of the check, built offline: a random-weight model with Qwen2.5-1.5B's config
(no download: the config is written out below) over the real Qwen2.5 tokenizer vendored in
``tests/fixtures/tokenizers/qwen2.5``, and agentrl's tiny model."""

from __future__ import annotations

import platform
import time
from pathlib import Path

from gpu_check.bootstrap import REPO, ImportReport
from gpu_check.profile import Profile
from gpu_check.results import SetupData

QWEN_TOKENIZER = REPO / "tests" / "fixtures" / "tokenizers" / "qwen2.5"
QWEN_DIR_NAME = "qwen2.5-1.5b-shaped"

# config.json of Qwen/Qwen2.5-1.5B-Instruct (the fields transformers reads).
QWEN25_1P5B_CONFIG: dict[str, object] = {
    "model_type": "qwen2",
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "max_window_layers": 21,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "use_sliding_window": False,
    "tie_word_embeddings": True,
    "vocab_size": 151936,
    "initializer_range": 0.02,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "use_cache": True,
}

DIMENSIONS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "vocab_size")


def torch_dtype(name: str):
    import torch

    return {"bfloat16": torch.bfloat16, "float32": torch.float32}[name]


def qwen_dir(work: Path) -> Path:
    return work / QWEN_DIR_NAME


def build_qwen_shaped(out: Path, profile: Profile, seed: int = 0) -> tuple[float, dict[str, int], int]:
    """Initialise the model on the profile's device (fast on a GPU), save it in the profile's
    dtype with the Qwen2.5 tokenizer and its chat template. Returns (params in M, dims, len(tokenizer))."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**{**QWEN25_1P5B_CONFIG, **profile.qwen_overrides})
    tokenizer = AutoTokenizer.from_pretrained(str(QWEN_TOKENIZER))
    with torch.random.fork_rng(devices=[]), torch.device(profile.device):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.to(torch_dtype(profile.dtype))
    model.generation_config = GenerationConfig(eos_token_id=[151645, 151643], pad_token_id=tokenizer.pad_token_id,
                                               bos_token_id=None, do_sample=True, temperature=1.0, top_p=1.0)
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)  # writes tokenizer.json: later loads skip the slow BPE conversion
    tmp.rename(out)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    dims = {k: int(getattr(config, k)) for k in DIMENSIONS}
    del model
    if profile.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return params, dims, len(tokenizer)


def run_setup(profile: Profile, work: Path, imports: ImportReport) -> SetupData:
    """Versions, device, and the two model directories the later sections load."""
    import torch
    import transformers

    from agentrl import ensure_tiny_model

    on_cuda = profile.device.startswith("cuda")
    if on_cuda and not torch.cuda.is_available():
        raise RuntimeError("the gpu profile needs CUDA, and torch.cuda.is_available() is False")
    data = SetupData(profile=profile.name, device=profile.device, python=platform.python_version(),
                     torch=torch.__version__, cuda=torch.version.cuda, transformers=transformers.__version__,
                     imports=imports,
                     device_name=torch.cuda.get_device_name() if on_cuda else platform.processor() or "cpu")
    t0 = time.perf_counter()
    out = qwen_dir(work)
    data.qwen_params_m, data.qwen_config, data.tokenizer_len = build_qwen_shaped(out, profile)
    data.qwen_dir, data.vocab_size = str(out), data.qwen_config["vocab_size"]
    data.tiny_dir = str(ensure_tiny_model())
    data.build_s = time.perf_counter() - t0
    return data
