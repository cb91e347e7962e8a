"""The rollout: tasks x G attempts in, masked trajectories out.

- ``base.py``: the :class:`Runner` protocol both runners implement, their budgets
  (:class:`RolloutConfig`) and what they return (:class:`RolloutBatch`, :class:`RolloutStats`);
- ``runner.py``: :class:`RolloutRunner`, agentrl's own multi-turn loop (the model's turns parsed
  by the chat template's format, tools run from a ``ToolBox``), per attempt or lock-step;
- ``agent_runner.py``: :class:`agentrl.rollout.agent_runner.AgentRunner`, whose attempts are
  user code written against the OpenAI API, served and captured by ``agentrl.serve``.

A trajectory's tokens grow in a :class:`agentrl.types.TokenSequence`, where mask and spans
follow from each append's kind.
"""

from agentrl.engines.base import attempt_seed
from agentrl.rollout.base import RolloutBatch, RolloutConfig, RolloutStats, Runner
from agentrl.rollout.runner import RolloutRunner

__all__ = ["RolloutBatch", "RolloutConfig", "RolloutRunner", "RolloutStats", "Runner", "attempt_seed"]
