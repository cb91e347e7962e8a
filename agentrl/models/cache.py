"""The machine-wide cache of built artifacts (the tiny model, warm starts, converted GGUF files):
built once, then reused; published atomically so a reader never sees half a directory. Also
how a model directory is written (:func:`save_hf`: the artifacts and the run's checkpoints).

    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> out = publish_once(root / "thing-abc", lambda d: (d / "config.json").write_text("{}"))
    >>> out.name, sorted(p.name for p in root.iterdir())
    ('thing-abc', ['thing-abc'])
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def default_cache_dir() -> Path:
    """``$AGENTRL_CACHE`` or ``$XDG_CACHE_HOME/agentrl`` or ``~/.cache/agentrl``."""
    if os.environ.get("AGENTRL_CACHE"):
        return Path(os.environ["AGENTRL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "agentrl"


def publish_once(final: Path, build: Callable[[Path], object], marker: str = "config.json") -> Path:
    """``final``, built by ``build(tmp)`` into a temporary directory beside it and renamed into
    place unless ``final/marker`` already exists. Two processes racing both build; the first
    rename wins and the loser's copy is removed (the results are identical by construction)."""
    if (final / marker).exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        build(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / marker).exists():  # not a lost race: a real failure
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def save_hf(model, tokenizer, directory: Path) -> None:
    """``save_pretrained`` of model and tokenizer into ``directory``, without transformers'
    "Writing model shards" bar (it would print through the GRPO progress bar every checkpoint)."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(directory, safe_serialization=True)
        tokenizer.save_pretrained(directory)
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
