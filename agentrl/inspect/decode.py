"""Token ids -> per-token text: a small injectable function, or None to show ids.

The viewers call a ``DecodeFn`` (``list[int] -> list[str]``, one string per id). One comes
from a tokenizer directory (``--tokenizer DIR``, or found in the run directory: a
``tokenizer/`` folder, or a local folder named in ``config.yaml`` under ``model.path``,
``model.name_or_path``, ``model.tokenizer`` or ``tokenizer``). Without one the viewers
show ids and the message text of ``messages``. Nothing is ever downloaded.

Example::

    decode = table_decoder({1: "Hello", 2: " world"})
    assert decode([1, 2, 3]) == ["Hello", " world", "<3>"]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.inspect.sources import InspectError, Sources

DecodeFn = Callable[[list[int]], list[str]]

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
_CONFIG_KEYS = (("model", "path"), ("model", "name_or_path"), ("model", "tokenizer"), ("tokenizer",),
                ("model",))


@dataclass(frozen=True)
class Decoding:
    """The decode function in use (None: ids only) and where it came from, for the header."""

    decode: DecodeFn | None
    origin: str  # e.g. "tokenizer /runs/a/tokenizer" or "no tokenizer: showing ids"


def table_decoder(table: Mapping[int, str]) -> DecodeFn:
    """A decoder from a fixed id -> text table (tests, tiny vocabularies)."""
    return lambda ids: [table.get(i, f"<{i}>") for i in ids]


def tokenizer_decoder(tokenizer: Any) -> DecodeFn:
    """Decode each id alone with a Hugging Face tokenizer (special tokens kept).

    A character split over several byte-level tokens shows as U+FFFD on each piece;
    that is what the model saw token by token.
    """
    backend = getattr(tokenizer, "_tokenizer", None)  # tokenizers.Tokenizer: batch decode in Rust
    if backend is not None and hasattr(backend, "decode_batch"):
        return lambda ids: backend.decode_batch([[i] for i in ids], skip_special_tokens=False)
    return lambda ids: tokenizer.batch_decode(
        [[i] for i in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False
    )


def load_decoder(path: str | Path) -> DecodeFn:
    """Load a tokenizer directory with transformers (local files only)."""
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as e:  # transformers raises many types; the message is what matters
        raise InspectError(
            f"--tokenizer {path}: cannot load a tokenizer there ({type(e).__name__}: {e}); "
            "pass a directory with tokenizer.json or vocab.json, or omit --tokenizer to show ids"
        ) from e
    return tokenizer_decoder(tok)


def _looks_like_tokenizer_dir(p: Path) -> bool:
    return p.is_dir() and any((p / name).is_file() for name in _TOKENIZER_FILES)


def _config_candidates(config: Path) -> list[Path]:
    import yaml

    try:
        cfg = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return []
    out = []
    for keys in _CONFIG_KEYS:
        node: Any = cfg
        for k in keys:
            node = node.get(k) if isinstance(node, dict) else None
        if isinstance(node, str):
            p = Path(node).expanduser()
            out.append(p if p.is_absolute() else config.parent / p)
            out.append(p)
    return out


def find_tokenizer_dir(sources: Sources) -> Path | None:
    """A local tokenizer directory belonging to the run, if any."""
    candidates = [sources.root / "tokenizer", sources.root / "model"]
    if sources.config is not None:
        candidates += _config_candidates(sources.config)
    return next((p for p in candidates if _looks_like_tokenizer_dir(p)), None)


def choose_decoding(sources: Sources, explicit: str | None) -> Decoding:
    """``--tokenizer`` wins; else a tokenizer found in the run; else ids only."""
    if explicit:
        return Decoding(load_decoder(explicit), f"tokenizer {explicit}")
    found = find_tokenizer_dir(sources)
    if found is None:
        return Decoding(None, "no tokenizer (pass --tokenizer DIR to see token text): showing ids")
    try:
        return Decoding(load_decoder(found), f"tokenizer {found}")
    except InspectError as e:
        return Decoding(None, f"found {found} but could not load it ({e.__cause__}): showing ids")
