"""The objective a run optimizes, as one object: resolved once from the config, it computes
the advantages, picks the attempts that enter the loss, computes the loss, and prints itself.

Its settings are the ``algo:`` config section itself (:class:`agentrl.algo.settings.AlgoConfig`,
which it extends). The surrogate is the one ``algo.loss`` names in the registry
(:mod:`agentrl.algo.surrogates`: its loss, its keys, its printed line); the IS weight, KL,
aggregation and filters around it are shared. With ``algo.distill`` the advantage becomes per
token (:mod:`agentrl.algo.distill`: a teacher's negative reverse KL, with or without A_i) and
the same surrogate takes it. The printed block comes from the same object that computes the
loss, so the two cannot drift apart.

Example (the defaults: GRPO with population std, ε = 0.2, seq-mean-token-mean, no KL)::

    >>> import torch
    >>> obj = Objective()
    >>> adv = obj.advantages(torch.tensor([1., 1, 1, 0, 0, 0, 0, 0]), ["g"] * 8)
    >>> [round(a, 2) for a in adv.advantages[[0, 3]].tolist()]
    [1.29, -0.77]
    >>> print(obj.describe().splitlines()[2])
     surrogate   L_t = -min(ρA, clip(ρ, 1-0.2, 1+0.2)A),  ρ = π_θ/π_old
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from torch import Tensor

from agentrl.algo.distill import describe_distill, distill_advantages, reverse_kl_tokens, unread_distill_keys
from agentrl.algo.filters import FilterResult, filter_attempts
from agentrl.algo.grpo import (GroupAdvantages, PolicyLossOutput, group_advantages, surrogate_policy_loss,
                               truncated_is_weights)
from agentrl.algo.settings import AlgoConfig
from agentrl.algo.surrogates import SURROGATES, Surrogate


@dataclass(frozen=True)
class Objective(AlgoConfig):
    """The resolved GRPO objective (defaults: docs/design.md, "The objective").

    Every ``algo:`` setting is inherited from :class:`AlgoConfig`; only what a run resolves
    from other sections is declared here. Build it with :meth:`from_config`, which resolves
    those once; ``Objective(kl_coef=0.05)`` and the like are for tests and benchmarks.
    """

    # algo.norm_len resolved: the rollout's token budget when the config leaves it None
    norm_len: int = 2048
    # the sampling temperature (rollout.temperature), which the trainer's log-probs must use too
    temperature: float = 1.0
    # the printed "sampling" line: G, prompts/step, T, iterations, learning rate
    sampling: str = ""

    @classmethod
    def from_config(cls, cfg) -> "Objective":  # cfg: agentrl.run.config.Config
        """The objective of a run config: every ``algo`` field as set, the rest resolved here."""
        a = cfg.algo
        sampling = (f"G={a.num_samples}, prompts/step={cfg.train.prompts_per_step}, T={cfg.rollout.temperature}, "
                    f"iterations/step={cfg.train.num_iterations}, lr={cfg.optim.lr} "
                    f"(warmup {cfg.optim.warmup_steps}, {cfg.optim.schedule})")
        settings = {f.name: getattr(a, f.name) for f in dataclasses.fields(AlgoConfig)}
        return cls(**{**settings, "norm_len": a.norm_len or cfg.rollout.max_total_tokens},
                   temperature=cfg.rollout.temperature, sampling=sampling)

    @property
    def surrogate(self) -> Surrogate:
        """The surrogate ``algo.loss`` selects (its module in :mod:`agentrl.algo.surrogates`)."""
        return SURROGATES[self.loss]

    @property
    def uses_reference(self) -> bool:
        """Whether the loss needs a reference model's log-probs (β > 0)."""
        return self.kl_coef > 0

    @property
    def uses_teacher(self) -> bool:
        """Whether the advantage needs a teacher's log-probs (on-policy distillation)."""
        return self.distill

    @property
    def uses_is_weights(self) -> bool:
        return self.is_level != "none"

    def advantages(self, rewards: Tensor, group_ids: Sequence[Hashable]) -> GroupAdvantages:
        """A_i of every attempt, normalized within its group."""
        return group_advantages(rewards, group_ids, std=self.std, scale=self.scale, std_floor=self.std_floor)

    def select(self, adv: GroupAdvantages, finish_reasons: Sequence[str], has_void_turn: Sequence[bool]) -> FilterResult:
        """Which attempts enter the loss (the filters that are on), each exclusion counted."""
        return filter_attempts(adv, finish_reasons, has_void_turn, drop_zero_variance=self.drop_zero_variance,
                               mask_truncated=self.mask_truncated, drop_void_turns=self.drop_void_turns)

    def token_advantages(self, advantages: Tensor, sampler_logprobs: Tensor, teacher_logprobs: Tensor,
                         mask: Tensor) -> tuple[Tensor, Tensor]:
        """On-policy distillation's per-token advantages A_t [B, T] from the attempts' A_i [B], and
        the per-token reverse KL d_t [B, T] they were made from (the ``distill/reverse_kl`` metric):
        ``A_t = [A_i +] distill_coef · (log π_T - log μ)(y_t)`` (:func:`distill_advantages`)."""
        env = advantages if self.distill_reward else None
        return (distill_advantages(sampler_logprobs, teacher_logprobs, mask, coef=self.distill_coef,
                                   env_advantages=env),
                reverse_kl_tokens(sampler_logprobs, teacher_logprobs, mask))

    def is_weights(self, old_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor) -> Tensor | None:
        """min(π_old/μ, C) per token [B, T], or None when the IS weight is off."""
        if not self.uses_is_weights:
            return None
        return truncated_is_weights(old_logprobs, sampler_logprobs, mask, cap=self.is_cap, level=self.is_level)

    def policy_loss(self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *,
                    total_seqs: int, total_tokens: int, is_weights: Tensor | None = None,
                    ref_logprobs: Tensor | None = None) -> PolicyLossOutput:
        """The loss of one micro-batch, normalized by the whole batch's counts (``total_seqs``
        attempts, ``total_tokens`` trained tokens) so micro-batch gradients sum to the batch's.
        ``advantages``: A_i [B], or A_t [B, T] with distillation (:meth:`token_advantages`).
        (Not ``loss``: that name is the ``algo.loss`` setting, the surrogate's name.)"""
        surrogate = self.surrogate
        return surrogate_policy_loss(
            lambda lp, old, adv, m: surrogate.token_loss(lp, old, adv, m, self),
            logprobs, old_logprobs, advantages, mask, agg=self.agg, total_seqs=total_seqs, total_tokens=total_tokens,
            norm_len=self.norm_len, is_weights=is_weights, ref_logprobs=ref_logprobs if self.uses_reference else None,
            kl_coef=self.kl_coef, kl_estimator=self.kl_estimator,
        )

    def describe(self) -> str:
        """The block a run prints at start: advantage, surrogate, aggregation, KL, IS, filters."""
        adv = ("A_i = (r_i - mean(r)) / std(r)" if self.scale == "std"
               else "A_i = r_i - mean(r)   (Dr. GRPO: no std division)")
        norm = {
            "seq-mean-token-mean": "1/G Σ_i 1/|y_i| Σ_t L_t   (seq-mean-token-mean)",
            "token-mean": "Σ_i Σ_t L_t / Σ_i |y_i|   (token-mean, DAPO)",
            "seq-mean-token-sum-norm": f"Σ_i Σ_t L_t / (G · {self.norm_len})   (seq-mean-token-sum-norm, Dr. GRPO)",
        }[self.agg]
        kl = ("none (β = 0, no reference model loaded)" if not self.uses_reference
              else f"β={self.kl_coef}, estimator {self.kl_estimator}")
        isw = ("off (π_old is the sampler)" if not self.uses_is_weights
               else f"min(π_old/μ, {self.is_cap}) at {self.is_level} level")
        unread = self.unread_keys()  # another surrogate's keys, set: shown, so that no setting goes unseen
        unread_distill = unread_distill_keys(self)  # distillation's, set while it is off: the same
        filters = [name for name, on in [
            ("drop zero-variance groups" + (" (refill batch)" if self.refill_batch else ""), self.drop_zero_variance),
            ("mask truncated attempts", self.mask_truncated),
            ("drop attempts with void turns", self.drop_void_turns),
        ] if on]
        lines = [
            "── objective ───────────────────────────────────────────────",
            f" advantage   {adv}   std={self.std}, floor={self.std_floor} (zero-variance group -> A=0)",
            f" surrogate   {self.surrogate.describe(self)}",
            *([f" ignored     {', '.join(unread)} (not read by algo.loss={self.loss})"] if unread else []),
            # printed only when on, so that the block of every config without distillation is unchanged
            *([f" distill     {describe_distill(self)}"] if self.distill else []),
            *([f" ignored     {', '.join(unread_distill)} (not read with algo.distill=false)"]
              if unread_distill else []),
            f" aggregate   {norm}",
            f" KL          {kl}",
            f" IS weight   {isw}",
            f" filters     {', '.join(filters) if filters else 'none'}",
        ]
        if self.sampling:
            lines.append(f" sampling    {self.sampling}")
        lines.append("────────────────────────────────────────────────────────────")
        return "\n".join(lines)


def describe_objective(cfg) -> str:
    """The printed block of a run config (:meth:`Objective.describe` of its objective)."""
    return Objective.from_config(cfg).describe()
