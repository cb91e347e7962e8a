"""Generation backends behind one protocol (see base.py)."""

from agentrl.engines.base import Engine, Generation, SamplingParams

__all__ = ["Engine", "Generation", "SamplingParams"]
