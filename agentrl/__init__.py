"""agentrl: train tool-using LLM agents with RL from verifiable rewards (GRPO).

The public API is the names below. They are imported on first use, so that ``import
agentrl`` (and every ``agentrl.x`` submodule import, the sandbox's included) does not load
torch and transformers; the ``TYPE_CHECKING`` block states the same names as explicit
imports for editors and type checkers (``tests/test_public_api.py`` keeps the two in step)::

    from agentrl import tool, ToolBox, ChatTemplate, HFEngine, RolloutRunner, RolloutConfig, Task
    from agentrl import load_config, train, Trajectory, read_jsonl
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

if TYPE_CHECKING:
    from agentrl.algo.grpo import group_advantages, policy_loss
    from agentrl.algo.objective import Objective
    from agentrl.chat.template import ChatTemplate
    from agentrl.engines.base import SamplingParams
    from agentrl.engines.hf import HFEngine
    from agentrl.env import Environment, Score, final_answer
    from agentrl.models.tiny import build_tiny_model, ensure_tiny_model
    from agentrl.rollout.base import RolloutConfig
    from agentrl.rollout.runner import RolloutRunner
    from agentrl.run.config import Config, load_config
    from agentrl.run.trainer import Trainer, train
    from agentrl.chat.check import check_prefix_preservation
    from agentrl.toolbox.box import ToolBox
    from agentrl.toolbox.tool import Tool, ToolContext, ToolResult, tool
    from agentrl.types import Failure, InfraError, Message, Span, Task, ToolCall, Trajectory, read_jsonl, write_jsonl

# name -> the module that defines it
_EXPORTS: dict[str, str] = {
    # tools
    "tool": "agentrl.toolbox.tool", "Tool": "agentrl.toolbox.tool", "ToolBox": "agentrl.toolbox.box",
    "ToolContext": "agentrl.toolbox.tool", "ToolResult": "agentrl.toolbox.tool",
    # chat templates
    "ChatTemplate": "agentrl.chat.template", "check_prefix_preservation": "agentrl.chat.check",
    # engines and rollout
    "HFEngine": "agentrl.engines.hf", "SamplingParams": "agentrl.engines.base",
    "RolloutRunner": "agentrl.rollout.runner", "RolloutConfig": "agentrl.rollout.base",
    # data
    "Task": "agentrl.types", "Message": "agentrl.types", "ToolCall": "agentrl.types",
    "Trajectory": "agentrl.types", "Span": "agentrl.types",
    "InfraError": "agentrl.types", "Failure": "agentrl.types",
    "read_jsonl": "agentrl.types", "write_jsonl": "agentrl.types",
    # environments
    "Environment": "agentrl.env", "Score": "agentrl.env", "final_answer": "agentrl.env",
    # training
    "Config": "agentrl.run.config", "load_config": "agentrl.run.config",
    "Trainer": "agentrl.run.trainer", "train": "agentrl.run.trainer",
    "Objective": "agentrl.algo.objective",
    "group_advantages": "agentrl.algo.grpo", "policy_loss": "agentrl.algo.grpo",
    # models
    "ensure_tiny_model": "agentrl.models.tiny", "build_tiny_model": "agentrl.models.tiny",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'agentrl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
