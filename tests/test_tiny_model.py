"""The offline tiny model: deterministic build, HF round trip, tokenizer properties."""

from __future__ import annotations

import filecmp
import unicodedata
from pathlib import Path

import pytest
import torch

from agentrl.models.tiny import (SPECIAL_TOKENS, TAG_TOKENS, build_tiny_model, default_chat_template,
                                 ensure_tiny_model)
from fixture_paths import QWEN25, TEMPLATES



@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    torch.set_num_threads(1)
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", seed=0)


@pytest.fixture(scope="module")
def tokenizer(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


def _files(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def test_same_seed_gives_identical_files_and_other_seed_other_weights(tiny_dir, tmp_path):
    again = build_tiny_model(tmp_path / "again", seed=0)
    other = build_tiny_model(tmp_path / "other", seed=1)
    assert _files(again) == _files(tiny_dir)
    assert "model.safetensors" in _files(tiny_dir) and "tokenizer.json" in _files(tiny_dir)
    for name in _files(tiny_dir):
        assert filecmp.cmp(tiny_dir / name, again / name, shallow=False), name
    assert not filecmp.cmp(tiny_dir / "model.safetensors", other / "model.safetensors", shallow=False)
    # The tokenizer does not depend on the seed.
    assert filecmp.cmp(tiny_dir / "tokenizer.json", other / "tokenizer.json", shallow=False)


def test_build_refuses_to_clobber_without_overwrite(tiny_dir, tmp_path):
    target = tmp_path / "m"
    build_tiny_model(target, seed=0, num_layers=1)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        build_tiny_model(target, seed=0, num_layers=1)
    build_tiny_model(target, seed=0, num_layers=1, overwrite=True)


def test_from_pretrained_round_trip(tiny_dir, tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    cfg = model.config
    assert cfg.model_type == "qwen2" and cfg.tie_word_embeddings
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (128, 2, 4, 2)
    assert cfg.vocab_size == len(tokenizer) == 1024
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    im_end, eot = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert model.generation_config.eos_token_id == [im_end, eot]
    assert model.generation_config.pad_token_id == eot == tokenizer.pad_token_id
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                        return_dict=False)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), 1024) and torch.isfinite(logits).all()


def test_weights_are_seeded_random_not_default(tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    a = AutoModelForCausalLM.from_pretrained(tiny_dir)
    b = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "s1", seed=1))
    wa, wb = a.model.layers[0].mlp.up_proj.weight, b.model.layers[0].mlp.up_proj.weight
    assert 0.01 < wa.std().item() < 0.05  # initializer_range 0.02, not zeros/ones
    assert not torch.equal(wa, wb)


TRICKY = [
    "plain ascii: The quick brown fox.",
    "café naïve über — “quotes” … ✓ → ∑",
    "日本語のテキスト、中文，한국어",
    "emoji 🙂 👩‍👩‍👧‍👦 🏳️‍🌈 flags 🇯🇵 skin 👍🏽",
    "rtl: مرحبا بالعالم שלום",
    "controls:\t\r\n\x00\x01\x1b[0m\u200b\u200d\ufeff end",
    "  leading and trailing spaces  \n\n\n",
    "code:\n    def f(x):\n\treturn {'a': [1, 2.5e-3]}\n",
    "markup <|im_start|>user\n<tool_call>{\"a\": 1}</tool_call><|im_end|>",
    "\U0010ffff private \ue000 and astral \U0001d49c",
]


@pytest.mark.parametrize("text", TRICKY)
def test_tokenizer_is_lossless_on_unicode(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text


def test_tokenizer_normalizes_to_nfc_like_qwen(tokenizer):
    # transformers' Qwen2Tokenizer always applies NFC (as Qwen's own tokenizer does), so
    # decomposed input comes back composed.
    decomposed = "e\u0301 A\u030a"
    assert decomposed != unicodedata.normalize("NFC", decomposed)
    assert tokenizer.decode(tokenizer.encode(decomposed)) == unicodedata.normalize("NFC", decomposed)


def test_special_and_tag_token_ids(tokenizer):
    ids = tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS + TAG_TOKENS)
    assert ids == list(range(len(SPECIAL_TOKENS) + len(TAG_TOKENS)))
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    for tag in TAG_TOKENS + SPECIAL_TOKENS:
        assert tokenizer.encode(f"x{tag}y", add_special_tokens=False)[1:2] == tokenizer.convert_tokens_to_ids([tag])
    # Turn markers are special (dropped by skip_special_tokens); tool/answer tags are not.
    mixed = tokenizer.encode("<|im_start|>a<tool_call>b</tool_call><answer>4</answer><|im_end|>")
    assert tokenizer.decode(mixed, skip_special_tokens=True) == "a<tool_call>b</tool_call><answer>4</answer>"


def test_chat_template_is_the_compact_hermes_template(tiny_dir, tokenizer):
    assert tokenizer.chat_template == default_chat_template()
    assert (tiny_dir / "chat_template.jinja").read_text() == default_chat_template()
    messages = [{"role": "user", "content": "add 2 and 3"},
                {"role": "assistant", "content": "",
                 "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]},
                {"role": "tool", "content": "5"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                    "<|im_start|>user\nadd 2 and 3<|im_end|>\n"
                    '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
                    "<|im_end|>\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
                    "<|im_start|>assistant\n")
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.convert_tokens_to_ids("<tool_call>") in ids
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 5


def test_digits_are_single_tokens(tokenizer):
    text = "What is 12345 + 67890? 80235, x1=907."
    pieces = tokenizer.convert_ids_to_tokens(tokenizer.encode(text, add_special_tokens=False))
    digit_pieces = [p for p in pieces if any(c.isdigit() for c in p)]
    assert digit_pieces == list("12345678908023519" "07")
    multi = [t for t in tokenizer.get_vocab() if sum(c.isdigit() for c in t) > 1]
    assert multi == []


def test_ensure_tiny_model_builds_once_per_config(tmp_path):
    first = ensure_tiny_model(cache_dir=tmp_path, num_layers=1, hidden_size=64, intermediate_size=128)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    again = ensure_tiny_model(cache_dir=tmp_path, num_layers=1, hidden_size=64, intermediate_size=128)
    assert again == first and (again / "model.safetensors").stat().st_mtime_ns == stamp
    other = ensure_tiny_model(cache_dir=tmp_path, num_layers=1, hidden_size=64, intermediate_size=128, seed=3)
    assert other != first and other.name.startswith("tiny-")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.name, other.name])  # no temp leftovers
    with pytest.raises(TypeError, match="build_tiny_model"):
        ensure_tiny_model(cache_dir=tmp_path, out_dir=tmp_path / "x")


@pytest.mark.slow
def test_build_over_the_qwen25_tokenizer(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = build_tiny_model(tmp_path / "q", tokenizer_dir=QWEN25, hidden_size=64, intermediate_size=128,
                           num_heads=2, num_kv_heads=1, num_layers=1)
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert len(tok) == model.config.vocab_size == 151665
    official = TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja"
    if official.exists():
        assert tok.chat_template == official.read_text()
    im_end, eot = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert model.generation_config.eos_token_id == [im_end, eot] == [151645, 151643]
    assert tok.convert_tokens_to_ids("<tool_call>") == 151657
    ids = tok.apply_chat_template([{"role": "user", "content": "Hi, this is a test!"}], add_generation_prompt=True,
                                  return_dict=False)
    assert ids[-5:] == [151645, 198, 151644, 77091, 198]
    with torch.no_grad():
        assert model(torch.tensor([ids])).logits.shape == (1, len(ids), 151665)
    # An explicit template replaces the tokenizer's own.
    custom = build_tiny_model(tmp_path / "c", tokenizer_dir=QWEN25, hidden_size=32, intermediate_size=64,
                              num_heads=2, num_kv_heads=1, num_layers=1, chat_template=default_chat_template())
    assert AutoTokenizer.from_pretrained(custom).chat_template == default_chat_template()
