"""What every rollout runner shares: its budgets, what it returns, and the ``Runner`` protocol.

Two runners implement :class:`Runner`: :class:`agentrl.rollout.runner.RolloutRunner` (the
model's turns parsed by agentrl, tools run from a ``ToolBox``) and
:class:`agentrl.rollout.agent_runner.AgentRunner` (user code written against the OpenAI API
drives the attempt). The trainer, the evaluator and the rollout thread hold a ``Runner`` and
never ask which one it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from agentrl.types import ConfigError, Task, Trajectory

if TYPE_CHECKING:
    from agentrl.chat import ChatTemplate
    from agentrl.engines.base import Engine
    from agentrl.toolbox import ToolBox


DEFAULT_ANSWER_PATTERN = r"<answer>.*?</answer>"


@dataclass
class RolloutConfig:
    """Budgets and sampling of a multi-turn rollout."""

    max_turns: int = 4  # model turns per attempt
    max_new_tokens: int = 256  # per model turn
    max_total_tokens: int = 2048  # whole sequence, prompt included
    temperature: float = 1.0  # sampling temperature of training rollouts
    top_p: float = 1.0  # nucleus sampling; 1.0 = off
    stop_strings: list[str] = field(default_factory=list)  # more strings that end a model turn
    # A turn with no tool call that does not match this counts as "void" (SimpleTIR);
    # None: the environment's ``answer_pattern`` when it has one, else <answer>...</answer>.
    answer_pattern: str | None = None
    # "auto": per attempt when the engine serves requests one by one, else lock-step.
    loop: str = "auto"
    # Infrastructure failures (a tool or agent raised agentrl.InfraError, lost its endpoint, the
    # checker raised; docs/design.md "Failures"): rounds of retries of a failed attempt, with a new
    # seed stream, then it is left out of its group's baseline and the loss (never scored 0).
    infra_retries: int = 2
    infra_backoff_s: float = 1.0  # seconds before the first retry round; doubled each round
    # The fault-injection harness: this share of tool calls (and of OpenAI-API agent attempts)
    # fails with an injected infrastructure fault, seeded. 0 in real runs; for measuring.
    fault_rate: float = 0.0
    # Context compaction (docs/compaction.md): the model's window in tokens; None = no window
    # (max_total_tokens alone bounds a sequence). Needs rollout.compaction other than none.
    context_budget: int | None = None
    # When a turn's tool results would leave fewer than max_new_tokens of the window for the
    # next turn: "truncate" drops the oldest tool turns; "summarize" has the policy write a
    # summary (trained, with the attempt's advantage) and goes on in a new segment from
    # [system, task + summary]; "frozen_summary" the same, the summary masked out of the loss.
    # "none": no compaction (the attempt runs on into max_total_tokens).
    compaction: str = "none"
    # The instruction that asks for the summary; None: the environment's compaction_prompt, else
    # a generic one (agentrl.rollout.compaction.DEFAULT_COMPACTION_PROMPT).
    compaction_prompt: str | None = None
    max_compactions: int = 4  # per attempt; one more ends it "length"

    def __post_init__(self) -> None:
        if self.loop not in LOOPS:
            raise ConfigError(f"rollout.loop={self.loop!r}: choose one of {', '.join(LOOPS)}")
        rules = [("max_turns", self.max_turns >= 1, ">= 1"), ("max_new_tokens", self.max_new_tokens >= 1, ">= 1"),
                 ("max_total_tokens", self.max_total_tokens >= 1, ">= 1"),
                 ("temperature", self.temperature >= 0, ">= 0 (0 = greedy)"),
                 ("top_p", 0 < self.top_p <= 1, "a value in (0, 1]"),
                 ("infra_retries", self.infra_retries >= 0, ">= 0 (0 = no retry)"),
                 ("infra_backoff_s", self.infra_backoff_s >= 0, ">= 0 seconds"),
                 ("fault_rate", 0 <= self.fault_rate <= 1, "a value in [0, 1] (0 = no injected faults)"),
                 ("max_compactions", self.max_compactions >= 1, ">= 1"),
                 ("context_budget", self.context_budget is None or self.context_budget >= 2, ">= 2 tokens, or null")]
        for key, ok, valid in rules:
            if not ok:
                raise ConfigError(f"rollout.{key}={getattr(self, key)!r} is out of range: use {valid}")
        if self.compaction not in COMPACTIONS:
            raise ConfigError(f"rollout.compaction={self.compaction!r}: choose one of {', '.join(COMPACTIONS)}")
        if self.compaction != "none" and self.context_budget is None:
            raise ConfigError(f"rollout.compaction={self.compaction} compacts when the context budget is full, and "
                              "rollout.context_budget is not set: set it, e.g. rollout.context_budget=512")
        if self.compaction == "none" and self.context_budget is not None:
            raise ConfigError(f"rollout.context_budget={self.context_budget} is only read by compaction, and "
                              "rollout.compaction is none: set rollout.compaction=summarize (or truncate), or bound "
                              "the sequence with rollout.max_total_tokens instead")


LOOPS = ("auto", "attempt", "lockstep")
COMPACTIONS = ("none", "truncate", "summarize", "frozen_summary")


@dataclass
class RolloutStats:
    """Where the time of one batch went. In the per-attempt loop generation and tools
    overlap: ``generate_s + tools_s`` may exceed ``total_s``."""

    generate_s: float = 0.0  # lock-step: inside engine.generate; per attempt: the engine's compute
    tools_s: float = 0.0  # wall time during which at least one tool call was running
    total_s: float = 0.0
    sampled_tokens: int = 0
    turns: int = 0  # lock-step: batched generation calls; per attempt: generation requests
    loop: str = "lockstep"  # which loop ran


@dataclass
class RolloutBatch:
    trajectories: list[Trajectory]  # task-major: the G attempts of a task are adjacent
    stats: RolloutStats


class Runner(Protocol):
    """Tasks x G attempts -> a :class:`RolloutBatch` of masked trajectories, task-major."""

    engine: "Engine"
    chat: "ChatTemplate"
    toolbox: "ToolBox"  # the environment's tools (an OpenAI-API agent brings its own)
    config: RolloutConfig

    def run(self, tasks: list[Task], num_samples: int, system_prompt: str | None = None,
            seed: int | None = None, group_prefix: str = "") -> RolloutBatch:
        """Sample ``num_samples`` attempts of every task."""
        ...

    async def arun(self, tasks: list[Task], num_samples: int, system_prompt: str | None = None,
                   seed: int | None = None, group_prefix: str = "") -> RolloutBatch:
        """:meth:`run` inside a running event loop."""
        ...

    def close(self) -> None:
        """Release what the runner holds (an endpoint's server thread); idempotent."""
        ...
