"""``agentrl serve MODEL_OR_CHECKPOINT``: the OpenAI-compatible endpoint on its own, for running
an OpenAI-API agent against a checkpoint (evaluation, debugging an agent before training it).

Requests to ``/v1/chat/completions`` are served from the embedded engine (continuously
batched); nothing is captured. The attempt routes are not opened (they are the trainer's).
"""

from __future__ import annotations

import threading
from pathlib import Path

from agentrl.serve.server import EndpointServer
from agentrl.serve.service import AttemptBudget, ChatService


def build_service(model: str, *, template: str | None = None, max_total_tokens: int = 4096,
                  max_new_tokens: int = 1024, temperature: float = 1.0, seed: int = 0,
                  model_name: str | None = None) -> ChatService:
    """A service over ``model``: a model directory, a training checkpoint
    (``runs/NAME/checkpoints/step_XXXXXX``: its ``model/`` and its run's template), ``tiny``,
    or a GGUF model (``smollm2`` or a ``.gguf`` file, converted once into the cache)."""
    from agentrl.chat import ChatTemplate
    from agentrl.engines import engine_class
    from agentrl.models.names import ModelNotLocal, hub_refusal, not_local_message, resolve_shortcut

    path, tool_call_format = resolve_shortcut(model), None  # tiny, smollm2, a .gguf file: as for train
    if path == model and (Path(model) / "model" / "config.json").exists():  # a training checkpoint: its model, its run's template
        path = str(Path(model) / "model")
        if (Path(model) / "config.yaml").exists():
            from agentrl.run.config import load_config

            run = load_config(Path(model) / "config.yaml")
            template, tool_call_format = template or run.model.template, run.model.tool_call_format
    # A hub name stays with the local cache when the hub cannot be asked (offline: seconds, not a minute)
    why = hub_refusal(path)
    try:
        engine = engine_class("hf").from_pretrained(  # the registry: the core never names a leaf
            path, seed=seed, **({"local_files_only": True} if why is not None else {}))
    except FileNotFoundError as e:
        if why is None:
            raise
        raise ModelNotLocal(not_local_message(path, why, "the directory (agentrl serve DIR)")) from e
    chat = ChatTemplate(engine.tokenizer, template, tool_call_format=tool_call_format)
    budget = AttemptBudget(max_total_tokens=max_total_tokens, max_sampled_tokens=max_total_tokens,
                           max_new_tokens=max_new_tokens, temperature=temperature, top_p=1.0)
    return ChatService(engine, chat, budget, model_name=model_name or model)


def serve(model: str, *, host: str = "127.0.0.1", port: int = 8000, template: str | None = None,
          max_total_tokens: int = 4096, max_new_tokens: int = 1024, stop: threading.Event | None = None) -> int:
    """Serve until interrupted (or until ``stop`` is set); prints the base URL."""
    service = build_service(model, template=template, max_total_tokens=max_total_tokens,
                            max_new_tokens=max_new_tokens)
    server = EndpointServer(service, host=host, port=port).start()
    print(f"serving {model} at {server.base_url()}  (OpenAI-compatible; Ctrl-C stops)", flush=True)
    stop = stop or threading.Event()
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0
