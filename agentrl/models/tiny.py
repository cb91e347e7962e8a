"""The offline tiny model: a randomly initialised Qwen2-architecture causal LM plus a tokenizer.

Everything is built on the spot, without network access, deterministically from a seed, and
saved as an ordinary Hugging Face directory (``config.json``, ``model.safetensors``,
``tokenizer.json``, ``chat_template.jinja``) so every code path that loads a real model
(``AutoModelForCausalLM.from_pretrained``, ``AutoTokenizer.from_pretrained``, the engines, the
trainer) runs unchanged on a laptop CPU.

The default tokenizer is a byte-level BPE trained on a small synthetic corpus (English-ish
words, Python, numbers, JSON, chat/tool markup). It is lossless for any unicode text (byte
level) and splits digits one per token, which the arithmetic example needs. Token ids:
``<|endoftext|>`` = 0 (pad), ``<|im_start|>`` = 1, ``<|im_end|>`` = 2 (end of a chat turn), then
the tool/reasoning tags ``<tool_call>`` ... ``</answer>`` (ids 3-10, ordinary added tokens, so
``decode(skip_special_tokens=True)`` keeps them).
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from agentrl.models.cache import default_cache_dir, publish_once, save_hf

# Bump when the builder's output changes, so cached builds from older code are not reused.
BUILDER_VERSION = 2  # 2: compact tool listing in the chat template

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TAG_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
              "<think>", "</think>", "<answer>", "</answer>"]


def default_chat_template() -> str:
    """The compact Hermes/Qwen2.5 tool template shipped in ``agentrl.templates``
    (``hermes_compact.jinja``: tools listed as one-line signatures, short prompts)."""
    return resources.files("agentrl.templates").joinpath("hermes_compact.jinja").read_text(encoding="utf-8")


_WORDS = (
    "the of and to in is it you that he was for on are with as his they be at one have this from "
    "or had by word but what some we can out other were all there when up use your how said an "
    "each she which do their time if will way about many then them write would like so these her "
    "long make thing see him two has look more day could go come did number sound no most people "
    "my over know water than call first who may down side been now find any new work part take "
    "get place made live where after back little only round man year came show every good me give "
    "our under name very through just form sentence great think say help low line differ turn "
    "cause much mean before move right boy old too same tell does set three want air well also "
    "play small end put home read hand port large spell add even land here must big high such "
    "follow act why ask men change went light kind off need house picture try us again animal "
    "point mother world near build self earth father answer question search result tool code "
    "python function return value error file list string integer sum total compute find check "
    "step reason because therefore let first second final correct wrong capital city country"
).split()

_PY_SNIPPETS = [
    "def {f}({a}, {b}):\n    return {a} {op} {b}\n",
    "for {a} in range({n}):\n    print({a} {op} {m})\n",
    "import math\nprint(math.sqrt({n}))\n",
    "{a} = [{n}, {m}, {k}]\nprint(sum({a}), len({a}))\n",
    "result = {n} {op} {m}\nprint(result)\n",
    "def {f}(items):\n    total = 0\n    for x in items:\n        total += x\n    return total\n",
    "if {a} > {n}:\n    {b} = {a} - {n}\nelse:\n    {b} = {n}\n",
    "with open('{f}.txt') as fh:\n    data = fh.read()\n",
    "class {F}:\n    def __init__(self, {a}):\n        self.{a} = {a}\n",
    "try:\n    {a} = int('{n}')\nexcept ValueError as e:\n    print(e)\n",
    "{a} = {{'{b}': {n}, '{f}': \"{w}\"}}\nprint({a}['{b}'])\n",
    "while {a} < {n}:\n    {a} *= 2\n",
]

_UNICODE = ["café", "naïve", "über", "日本語", "中文", "Ελληνικά", "русский", "emoji 🙂", "→", "✓", "—", "…"]


def _synthetic_corpus(n_docs: int = 2500) -> list[str]:
    """A fixed, deterministic training corpus for the BPE (independent of the model seed)."""
    rng = random.Random(1234)
    docs: list[str] = []

    def words(k: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(k))

    def ident() -> str:
        return rng.choice(["x", "y", "n", "i", "total", "value", "data", "items", "result", "count"])

    def number() -> str:
        return str(rng.choice([rng.randint(0, 9), rng.randint(10, 99), rng.randint(100, 99999)]))

    for i in range(n_docs):
        kind = i % 6
        if kind == 0:
            sentence = words(rng.randint(5, 16))
            docs.append(sentence[0].upper() + sentence[1:] + rng.choice([".", "?", "!", ","]))
        elif kind == 1:
            tpl = rng.choice(_PY_SNIPPETS)
            docs.append(tpl.format(f=ident(), F=ident().title(), a=ident(), b=ident(), n=number(),
                                   m=number(), k=number(), w=rng.choice(_WORDS),
                                   op=rng.choice(["+", "-", "*", "/", "//", "%", "**"])))
        elif kind == 2:
            a, b = rng.randint(0, 9999), rng.randint(0, 9999)
            op = rng.choice(["+", "-", "*"])
            val = {"+": a + b, "-": a - b, "*": a * b}[op]
            docs.append(f"What is {a} {op} {b}? {a} {op} {b} = {val}. The answer is {val}.")
        elif kind == 3:
            call = {"name": rng.choice(["python", "search", "calculator", "get_weather"]),
                    "arguments": {rng.choice(["code", "query", "expression", "city"]): words(3)}}
            docs.append("<tool_call>\n" + json.dumps(call) + "\n</tool_call>")
        elif kind == 4:
            role = rng.choice(["system", "user", "assistant"])
            body = words(rng.randint(3, 10))
            tail = rng.choice(["", "\n<think>\n" + words(6) + "\n</think>",
                               "\n<answer>" + number() + "</answer>",
                               "\n<tool_response>\n" + number() + "\n</tool_response>"])
            docs.append(f"<|im_start|>{role}\n{body}{tail}<|im_end|>\n")
        else:
            docs.append(" ".join(rng.choice(_UNICODE) for _ in range(3)) + " " + words(4) + " "
                        + json.dumps({"id": number(), "ok": rng.random() < 0.5, "v": [1.5, None]}))
    return docs


def _split_on_markup(docs: list[str]) -> list[str]:
    """Cut the added tokens out of the corpus: the BPE trainer does not know them, and would
    otherwise learn merges such as ``<|`` that can never fire at encode time."""
    pieces = docs
    for marker in SPECIAL_TOKENS + TAG_TOKENS:
        pieces = [p for doc in pieces for p in doc.split(marker) if p]
    return pieces


def train_tokenizer(vocab_size: int = 1024):
    """Train the byte-level BPE and wrap it as a ``Qwen2Tokenizer`` (no chat template yet).

    The pipeline is exactly the one transformers' ``Qwen2Tokenizer`` rebuilds when it loads a
    directory whose model type is ``qwen2`` (NFC, Qwen's pre-tokenizer regex, byte level), so
    the tokenizer behaves the same freshly built, reloaded, and under transformers 4.x or 5.x.
    That regex isolates every number character (``\\p{N}``), so digits are single tokens.

    >>> tok = train_tokenizer(512)
    >>> tok.convert_ids_to_tokens(tok.encode("1234"))
    ['1', '2', '3', '4']
    """
    from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    added = SPECIAL_TOKENS + TAG_TOKENS
    if vocab_size < 256 + len(added) + 1:
        raise ValueError(f"vocab_size={vocab_size} is too small: a byte-level BPE needs at least "
                         f"{256 + len(added) + 1} (256 bytes + {len(added)} added tokens + 1 merge)")
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    # The added tokens come first in the vocabulary (ids 0..10) and count towards vocab_size.
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=added, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(_split_on_markup(_synthetic_corpus()), trainer)

    model_json = json.loads(bpe.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model_json["merges"]]
    tok = Qwen2Tokenizer(vocab=model_json["vocab"], merges=merges, unk_token=None, bos_token=None,
                         eos_token="<|im_end|>", pad_token="<|endoftext|>", model_max_length=32768,
                         clean_up_tokenization_spaces=False)
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS], special_tokens=True)
    # Tags are ordinary added tokens: always one id each, kept by decode(skip_special_tokens=True).
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    return tok


def build_tiny_model(out_dir: str | Path, *, seed: int = 0, hidden_size: int = 128, num_layers: int = 2,
                     num_heads: int = 4, num_kv_heads: int = 2, intermediate_size: int = 384,
                     vocab_size: int = 1024, tokenizer_dir: str | Path | None = None,
                     chat_template: str | None = None, overwrite: bool = False) -> Path:
    """Build a random Qwen2-architecture causal LM and its tokenizer into ``out_dir``.

    Same arguments give byte-identical files. With ``tokenizer_dir`` the model is built over
    that tokenizer (``vocab_size`` is ignored: it becomes ``len(tokenizer)``); keep
    ``hidden_size`` small then (e.g. 64), since a 151k-token embedding dominates the size.

    >>> import tempfile
    >>> from transformers import AutoModelForCausalLM
    >>> tmp = tempfile.TemporaryDirectory()
    >>> d = build_tiny_model(tmp.name + "/tiny", seed=0)
    >>> AutoModelForCausalLM.from_pretrained(d).config.model_type
    'qwen2'
    >>> tmp.cleanup()
    """
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{out} is not empty; pass overwrite=True or choose another out_dir")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)

    if tokenizer_dir is None:
        tokenizer = train_tokenizer(vocab_size)
        tokenizer.chat_template = chat_template if chat_template is not None else default_chat_template()
    else:
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        if chat_template is not None:
            tokenizer.chat_template = chat_template
        if not tokenizer.chat_template:
            raise ValueError(f"the tokenizer in {tokenizer_dir} has no chat template; pass chat_template=... "
                             "(e.g. agentrl.models.tiny.default_chat_template())")

    ids = _stop_ids(tokenizer)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        max_position_embeddings=32768, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        pad_token_id=ids.pad, bos_token_id=None, eos_token_id=ids.eos[0],
    )
    with torch.random.fork_rng(devices=[]):  # seeded init without disturbing the caller's RNG
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(eos_token_id=ids.eos, pad_token_id=ids.pad,
                                               bos_token_id=None, do_sample=True, temperature=1.0, top_p=1.0)
    save_hf(model, tokenizer, out)
    return out


@dataclass(frozen=True)
class _StopIds:
    eos: list[int]  # generation stops on any of these
    pad: int


def _stop_ids(tokenizer) -> _StopIds:
    """End-of-turn ids: ``<|im_end|>`` first (a chat turn ends there), then the document end."""
    vocab = tokenizer.get_vocab()
    eos = [vocab[t] for t in ("<|im_end|>", "<|endoftext|>") if t in vocab]
    if not eos and tokenizer.eos_token_id is not None:
        eos = [tokenizer.eos_token_id]
    if not eos:
        raise ValueError("the tokenizer has neither <|im_end|> nor an eos token; set tokenizer.eos_token first")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[-1]
    return _StopIds(eos=eos, pad=pad)


def ensure_tiny_model(cache_dir: str | Path | None = None, **kwargs) -> Path:
    """Build the tiny model once into ``<cache_dir>/tiny-<hash of kwargs>`` and reuse it after.

    The build goes to a temporary directory that is renamed into place, so concurrent callers
    never see a half-written model.

    >>> path = ensure_tiny_model()
    >>> ensure_tiny_model() == path
    True
    """
    if "out_dir" in kwargs or "overwrite" in kwargs:
        raise TypeError("ensure_tiny_model chooses the directory itself; call build_tiny_model for out_dir/overwrite")
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = {k: (str(Path(v).resolve()) if k == "tokenizer_dir" and v is not None else v) for k, v in kwargs.items()}
    import transformers
    key["_builder"] = BUILDER_VERSION
    key["_transformers"] = transformers.__version__
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    final = root / f"tiny-{digest}"

    def build(tmp: Path) -> None:
        # a few seconds (a BPE trained on the spot), once per machine: said on stderr, before and after
        t0 = time.perf_counter()
        print(f"building the offline tiny model (once per machine) -> {final}", file=sys.stderr, flush=True)
        build_tiny_model(tmp, overwrite=True, **kwargs)
        print(f"tiny model built in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)

    return publish_once(final, build)
