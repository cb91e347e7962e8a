"""The ``algo:`` section of a run config, defined once: the config loader builds it from these
fields (names, defaults, ``Literal`` choices) and :class:`agentrl.algo.objective.Objective`
extends it, so the objective a run computes has exactly the settings a user can write.

The shared settings are declared here; each surrogate's own keys (``eps_low`` ... for
``clip``, ``gspo_eps_low`` ... for ``gspo``) are declared in its module under
:mod:`agentrl.algo.surrogates` and inherited, so a new surrogate adds its keys without an
edit here; the keys of on-policy distillation (``distill`` ...) come last, from
:mod:`agentrl.algo.distill`. tests/test_config.py checks that every field reaches the objective and its printed
block.

Torch-free on purpose: :mod:`agentrl.run.config` imports it without loading torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from agentrl.algo.distill import DistillFields, distill_rules
from agentrl.algo.surrogates import FIELD_CLASSES, SURROGATES, SurrogateName
from agentrl.types import ConfigError


@dataclass(frozen=True)
class SharedSettings:
    """The settings every surrogate reads (the first fields of :class:`AlgoConfig`)."""

    num_samples: int = 8  # G attempts per prompt (the "sampling" line of the printed block)
    # advantage: A_i = (r_i - mean(r)) / std(r), or r_i - mean(r) with scale "none" (Dr. GRPO);
    # std "population" divides by G, "sample" by G - 1; a group with std < std_floor gets A = 0
    std: Literal["population", "sample"] = "population"
    scale: Literal["std", "none"] = "std"  # "none" = Dr. GRPO
    std_floor: float = 1e-6  # groups whose reward std is below this get advantage 0
    # the surrogate objective by name: "clip" (PPO's clipped ratio) or another module of agentrl/algo/surrogates
    # (names: agentrl.algo.surrogates.SURROGATES; equations, defaults, what combines: docs/objectives.md);
    # each surrogate's own keys follow the shared ones
    loss: SurrogateName = "clip"
    # aggregation over tokens and attempts; norm_len is Dr. GRPO's constant normalizer
    agg: Literal["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"] = "seq-mean-token-mean"
    norm_len: int | None = None  # Dr. GRPO normalizer; None = rollout.max_total_tokens
    # KL to the frozen reference: L_t += β·KL_t
    kl_coef: float = 0.0  # β; 0 loads no reference model
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"  # per-token KL estimate (Schulman's k1, k2, k3)
    # truncated importance weight min(π_old/μ, C) against the sampler μ ("none": off)
    is_level: Literal["none", "token", "sequence"] = "none"
    is_cap: float = 2.0  # C in min(π_old/μ, C)
    # which attempts enter the loss
    drop_zero_variance: bool = False  # DAPO dynamic sampling
    # keep sampling prompts until the batch has enough signal groups (with drop_zero_variance), or
    # enough groups that ran (groups dropped for infrastructure failures, docs/design.md "Failures")
    refill_batch: bool = False
    max_refills: int = 4  # the refill loop's bound (agentrl.run.collect); not part of the loss
    # attempts with finish_reason "length" (max_new_tokens or max_total_tokens hit) or
    # "max_turns" (still calling tools at rollout.max_turns) leave the loss (DAPO overlong filtering)
    mask_truncated: bool = False
    drop_void_turns: bool = False  # attempts with a void turn leave the loss (SimpleTIR)


# Bases in reverse so that the fields come in order: the shared ones, each surrogate's, distillation's.
@dataclass(frozen=True)
class AlgoConfig(DistillFields, *reversed(FIELD_CLASSES), SharedSettings):
    """The GRPO objective; the defaults are the ones in docs/design.md ("The objective") and docs/objectives.md."""

    def __post_init__(self) -> None:
        """Refuse out-of-range values (``Objective`` inherits this), naming the key and the range,
        and shared options the selected surrogate does not combine with, naming the fix."""
        if self.loss not in SURROGATES:  # the loader checks the Literal; this is for direct constructions
            raise ConfigError(f"algo.loss={self.loss!r} is not one of {list(SURROGATES)}")
        rules = [
            ("num_samples", self.num_samples >= 2, ">= 2: GRPO's baseline is the mean of a prompt's G attempts, "
                                                   "so with G=1 every advantage is 0 and nothing is learned"),
            ("std_floor", self.std_floor > 0, "> 0 (it detects zero-variance groups)"),
            ("norm_len", self.norm_len is None or self.norm_len >= 1, ">= 1, or null for rollout.max_total_tokens"),
            ("kl_coef", self.kl_coef >= 0, ">= 0 (0 = no KL term)"),
            ("is_cap", self.is_cap > 0, "> 0 (e.g. 2.0)"),
            ("max_refills", self.max_refills >= 0, ">= 0"),
        ]
        rules += [rule for s in SURROGATES.values() for rule in s.rules(self)] + distill_rules(self)
        for key, ok, valid in rules:
            if not ok:
                raise ConfigError(f"algo.{key}={getattr(self, key)!r} is out of range: use {valid}")
        problem = SURROGATES[self.loss].refusal(self)
        if problem:
            raise ConfigError(problem)

    def unread_keys(self) -> list[str]:
        """``key=value`` of the surrogate keys set away from their default that the selected
        surrogate does not read (the printed block's "ignored" line)."""
        reads = SURROGATES[self.loss].reads
        return [f"algo.{f.name}={getattr(self, f.name)!r}" for cls in FIELD_CLASSES for f in dataclasses.fields(cls)
                if f.name not in reads and getattr(self, f.name) != f.default]
