"""What a model name means, and how fast a name that is not local fails.

A model is named by a local directory, a shortcut agentrl builds or converts on the spot
(``tiny``, the offline tiny model; ``smollm2`` or a ``.gguf`` file, converted once into the
cache), or a Hugging Face hub name (``Qwen/Qwen2.5-0.5B-Instruct``). :func:`resolve_shortcut`
turns the shortcuts into directories, the same way for ``train``, ``serve`` and
``check-template``.

A hub name is looked up in the local Hugging Face cache first. Without network,
``from_pretrained`` spends a minute on retries (five, with backoff, per file) before it says
it could not connect; so whether the hub may be asked is decided once per process instead
(:func:`hub_refusal`): not when ``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE`` is set, nor when
the hub does not answer one HEAD request within ``AGENTRL_HUB_TIMEOUT`` seconds (default 3).
Then the name loads from the cache (``local_files_only=True``) or fails at once with the fix
(:func:`from_pretrained`, :class:`ModelNotLocal`).

    >>> resolve_shortcut("Qwen/Qwen2.5-0.5B-Instruct")  # a hub name: left as it is
    'Qwen/Qwen2.5-0.5B-Instruct'
    >>> is_hub_name("Qwen/Qwen2.5-0.5B-Instruct"), is_hub_name("./my-model"), is_hub_name("tiny")
    (True, False, False)
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from agentrl.models.gguf import SHORTCUTS as GGUF_SHORTCUTS
from agentrl.types import ConfigError

# Whether the hub answered, per endpoint, for the life of the process (None: it did; else why not).
_PROBED: dict[str, str | None] = {}
_TRUE = {"1", "ON", "YES", "TRUE"}  # huggingface_hub's spelling of a true environment variable
SHORTCUT_NAMES = ("tiny", *GGUF_SHORTCUTS)  # matched lower-cased


def resolve_shortcut(name: str, *, tiny_seed: int = 0, gguf_file: str | None = None) -> str:
    """The directory behind a shortcut, built or converted on first use: ``tiny`` (always the
    offline tiny model, as for ``model.path``), ``smollm2`` (unless a local path of that name
    exists), a ``.gguf`` file, or a directory with ``gguf_file`` in it; any other name (a
    model directory, a hub name) unchanged. One resolution for ``train``, ``serve`` and
    ``check-template``."""
    if name == "tiny":
        if gguf_file is not None:
            raise ConfigError("model.gguf_file names a file in the directory model.path; model.path=tiny has none")
        from agentrl.models.tiny import ensure_tiny_model

        return str(ensure_tiny_model(seed=tiny_seed))
    from agentrl.models.gguf import resolve_gguf

    converted = resolve_gguf(name, gguf_file)
    return str(converted) if converted is not None else name


def is_hub_name(name: str) -> bool:
    """True for a name only the hub (or its local cache) can resolve: not an existing path, not
    written as a path (``/``, ``.``, ``~``), not a shortcut."""
    name = str(name)
    if name.startswith(("/", ".", "~")) or name.strip().lower() in SHORTCUT_NAMES:
        return False
    return not Path(name).exists()


def offline_variable() -> str | None:
    """The variable that asks for offline mode (``HF_HUB_OFFLINE``, ``TRANSFORMERS_OFFLINE``),
    read now: huggingface_hub reads it once, when it is imported."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().upper() in _TRUE:
            return var
    return None


def hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def probe_timeout() -> float:
    try:
        return float(os.environ.get("AGENTRL_HUB_TIMEOUT", "") or 3.0)
    except ValueError:
        return 3.0


def _ask_hub(endpoint: str, timeout: float) -> str | None:
    """One HEAD request to the endpoint, no retries (proxies from the environment apply). Any
    HTTP answer, an error status included, means the hub is reachable."""
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout).close()
    except urllib.error.HTTPError:
        return None
    except (OSError, ValueError) as e:  # URLError (DNS, refused, no route), timeouts, a malformed HF_ENDPOINT
        reason = getattr(e, "reason", e)
        return f"{endpoint} is unreachable ({type(reason).__name__}: {reason})"
    return None


def hub_reachability(timeout: float | None = None) -> str | None:
    """None when the hub answers, else why not; asked once per process and endpoint. The
    answer is awaited at most ``timeout`` seconds (a hanging DNS lookup included)."""
    endpoint = hub_endpoint()
    if endpoint not in _PROBED:
        timeout = probe_timeout() if timeout is None else timeout
        result: list[str | None] = []
        worker = threading.Thread(target=lambda: result.append(_ask_hub(endpoint, timeout)), daemon=True)
        worker.start()
        worker.join(timeout + 0.5)
        _PROBED[endpoint] = result[0] if result else f"{endpoint} did not answer within {timeout:g} s"
    return _PROBED[endpoint]


def hub_refusal(name: str) -> str | None:
    """Why loading ``name`` must stay with local files (an offline variable is set, or the hub
    is unreachable), or None when the hub may be asked. A local directory or a path never
    needs the hub, so nothing is probed for one."""
    if not is_hub_name(name):
        return None
    var = offline_variable()
    why = f"{var}={os.environ[var]} is set" if var is not None else hub_reachability()
    if why is not None:
        _hub_offline_for_this_process()
    return why


def _hub_offline_for_this_process() -> None:
    """Tell huggingface_hub as well (it read ``HF_HUB_OFFLINE`` once, at import): no request of
    this process goes out after the decision, such as the agent registry that huggingface_hub
    2.x fetches (3 s timeout) the first time it builds request headers, even for
    ``local_files_only`` loads."""
    try:
        from huggingface_hub import constants
    except ImportError:  # pragma: no cover - transformers depends on huggingface_hub
        return
    constants.HF_HUB_OFFLINE = True


def hf_cache_dir() -> str:
    try:
        from huggingface_hub import constants

        return str(constants.HF_HUB_CACHE)
    except ImportError:  # pragma: no cover - transformers depends on huggingface_hub
        return "~/.cache/huggingface/hub"


class ModelNotLocal(ConfigError):
    """A hub name that is not in the local cache while the hub cannot be asked."""


def not_local_message(name: str, why: str, pass_as: str = "model.path=DIR") -> str:
    """The error for a hub name that cannot be had, with the fix; ``pass_as`` says how the
    command takes a directory (``model.path=DIR`` for train, ``DIR`` for check-template)."""
    return (f"{name!r} is not a local directory and not in the Hugging Face cache ({hf_cache_dir()}), and the "
            f"hub was not asked: {why}. Fix: download it where there is network (`hf download {name} "
            f"--local-dir DIR`) and pass {pass_as}, or copy that machine's Hugging Face cache here; or use "
            "the offline tiny model (tiny)")


def cached_snapshot(name: str) -> str:
    """The local Hugging Face cache's copy of hub name ``name`` (its snapshot directory), read
    without the network, for what needs a directory (the warm start hashes and copies files);
    a :class:`ModelNotLocal` with the fix when it is not cached."""
    try:
        from huggingface_hub import snapshot_download

        return str(snapshot_download(name, local_files_only=True))
    except Exception as e:  # not cached (LocalEntryNotFoundError), a malformed name (HFValidationError)
        raise ModelNotLocal(f"the warm start (warmstart.enabled) needs the model's files on this machine, and "
                            f"{name!r} is not a local directory and not in the Hugging Face cache "
                            f"({hf_cache_dir()}). Fix: download it (`hf download {name} --local-dir DIR`) and set "
                            "model.path=DIR, or set warmstart.enabled=false") from e


def from_pretrained(loader, name: str, *, pass_as: str = "model.path=DIR", **kwargs):
    """``loader.from_pretrained(name, **kwargs)`` (``loader``: ``AutoTokenizer``,
    ``AutoModelForCausalLM``, ...), kept to local files when :func:`hub_refusal` says so: a
    cached hub name still loads offline, an uncached one raises :class:`ModelNotLocal` at
    once instead of after a minute of retries."""
    why = None if kwargs.get("local_files_only") else hub_refusal(name)
    if why is None:
        return loader.from_pretrained(name, **kwargs)
    try:
        return loader.from_pretrained(name, **{**kwargs, "local_files_only": True})
    except (OSError, ValueError) as e:
        raise ModelNotLocal(not_local_message(name, why, pass_as)) from e
