"""Generation backends behind one protocol (see base.py), and the registry that names them.

A new engine is one module with a class that implements :class:`~agentrl.engines.base.Engine`
(``capabilities``, ``policy_version``, ``batcher_stats``, ``generate``, ``agenerate``,
``sync_weights``, ``sleep``, and the ``from_run`` constructor) plus one line in
:data:`ENGINES`; the config key ``model.engine`` then accepts its name, and
``tests/test_engine_protocol.py`` checks the new class has every member.

    >>> engine_class("hf").capabilities.shares_trainer_weights
    True
"""

from __future__ import annotations

import importlib

from agentrl.engines.base import Engine, EngineCapabilities, Generation, SamplingParams

# model.engine name -> "module:Class" (imported on use: vLLM is an optional dependency)
ENGINES: dict[str, str] = {
    "hf": "agentrl.engines.hf:HFEngine",
    "vllm": "agentrl.engines.vllm:VLLMEngine",
}


def engine_class(name: str) -> type:
    """The engine class registered as ``name``; ValueError naming the registered ones."""
    if name not in ENGINES:
        raise ValueError(f"model.engine={name!r} is not a registered engine; use one of: {', '.join(ENGINES)}")
    module, cls = ENGINES[name].split(":")
    return getattr(importlib.import_module(module), cls)


__all__ = ["ENGINES", "Engine", "EngineCapabilities", "Generation", "SamplingParams", "engine_class"]
