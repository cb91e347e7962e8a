"""agentrl: train tool-using LLM agents with RL from verifiable rewards (GRPO).

The public API, imported lazily so ``import agentrl`` stays cheap::

    from agentrl import tool, ToolBox, ChatTemplate, HFEngine, RolloutRunner, RolloutConfig, Task
    from agentrl import load_config, train, Trajectory, read_jsonl
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    # tools
    "Tool": "agentrl.tool", "ToolBox": "agentrl.tool",
    "ToolContext": "agentrl.tool", "ToolResult": "agentrl.tool",
    # chat templates
    "ChatTemplate": "agentrl.chat", "check_prefix_preservation": "agentrl.template_check",
    # engines and rollout
    "HFEngine": "agentrl.engines.hf", "SamplingParams": "agentrl.engines.base",
    "RolloutRunner": "agentrl.rollout", "RolloutConfig": "agentrl.rollout",
    # data
    "Task": "agentrl.types", "Message": "agentrl.types", "ToolCall": "agentrl.types",
    "Trajectory": "agentrl.types", "Span": "agentrl.types",
    "read_jsonl": "agentrl.types", "write_jsonl": "agentrl.types",
    # environments
    "Environment": "agentrl.env", "Score": "agentrl.env", "final_answer": "agentrl.env",
    # training
    "Config": "agentrl.run.config", "load_config": "agentrl.run.config",
    "Trainer": "agentrl.run.trainer", "train": "agentrl.run.trainer",
    "group_advantages": "agentrl.algo.grpo", "policy_loss": "agentrl.algo.grpo",
    # models
    "ensure_tiny_model": "agentrl.models.tiny", "build_tiny_model": "agentrl.models.tiny",
}

__all__ = sorted([*_EXPORTS, "tool"])

# ``agentrl.tool`` is both a submodule and the decorator; bind the decorator eagerly so the
# submodule import cannot shadow it.
from agentrl.tool import tool  # noqa: E402


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'agentrl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
