"""What one surrogate module gives the registry, and the tensor steps the surrogates share.

A surrogate turns log π_θ, log π_old, the advantages and the mask into a per-token loss
(:class:`TokenLoss`); what follows is the same for all of them and lives in
:func:`agentrl.algo.grpo.surrogate_policy_loss`: the IS weight against the sampler, the KL
term, the aggregation over tokens and attempts, and the metrics.

Torch is imported inside the functions, not here: :mod:`agentrl.algo.settings` reads the
surrogates' config fields while the config loads, and that must not load torch.

Numerical rules every surrogate keeps (tests/test_surrogates.py checks them): masked positions
are selected away with ``torch.where`` before any ``exp`` and every per-token log-ratio is
clamped to ±:data:`LOG_RATIO_CLAMP` first, so inf or NaN at untrained positions never reach the
loss or its gradient; and an attempt with A_i = 0 gets loss 0 and gradient 0 at every token
(the update skips such attempts when there is no KL term and no distillation, agentrl/algo/update.py).

The advantages are per attempt, A_i [B], or per token, A_t [B, T] (on-policy distillation,
:mod:`agentrl.algo.distill`); :func:`row_advantages` gives either the shape that broadcasts. A
surrogate that cannot take per-token advantages says so (``token_advantages = False``) and the
config refuses ``algo.distill`` with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from torch import Tensor

AGG_MODES: tuple[str, ...] = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm")
IS_SETTINGS: tuple[str, ...] = ("none", "token", "sequence")  # algo.is_level

# |log ratio| beyond 20 (a ratio of 5e8) means a broken batch, not a signal; clamping keeps
# exp() finite so one bad token cannot turn the whole gradient into NaN. Such a token is far
# outside any clip range, where the clipped objective has zero gradient anyway.
LOG_RATIO_CLAMP = 20.0


@dataclass
class TokenLoss:
    """A surrogate's per-token result, before the IS weight, the KL term and the aggregation.

    Values of ``per_token`` and ``ratio`` at positions where the mask is 0 are never used
    (the aggregation and the metrics select them away), whatever they are.
    """

    per_token: Tensor  # [B, T] L_t, carrying the gradient with respect to log π_θ
    # [B, T] bool, or float in [0, 1]: per token, the share of its policy gradient that the trust
    # region removes, 0 where the mask is 0; its mean over trained tokens is the logged clip_frac
    clipped: Tensor
    ratio: Tensor  # [B, T] ρ = π_θ/π_old per token (ratio_mean, ratio_max)
    dual: Tensor | None = None  # [B, T] bool: tokens capped by the dual clip (clip only)


class Surrogate:
    """One surrogate objective, as its module declares it (one instance, ``SURROGATE``).

    The class attributes say which config keys it owns and reads and which shared options it
    combines with; the methods give its printed line, its range rules and its loss.
    """

    name: ClassVar[str]  # the value of algo.loss
    # a frozen dataclass whose fields are this surrogate's own algo.* keys (AlgoConfig inherits them)
    fields: ClassVar[type | None] = None
    reads: ClassVar[tuple[str, ...]] = ()  # the surrogate-specific keys it reads (its own, or another's)
    aggs: ClassVar[tuple[str, ...]] = AGG_MODES  # the algo.agg values it combines with
    agg_reason: ClassVar[str] = ""  # why the others are refused
    is_levels: ClassVar[tuple[str, ...]] = IS_SETTINGS  # the algo.is_level values it combines with
    is_reason: ClassVar[str] = ""
    # whether it takes per-token advantages A_t [B, T] (algo.distill), and if not why and what instead
    token_advantages: ClassVar[bool] = True
    token_reason: ClassVar[str] = ""

    def describe(self, cfg: Any) -> str:
        """The text of the printed block's ``surrogate`` line (``cfg``: the AlgoConfig)."""
        raise NotImplementedError

    def rules(self, cfg: Any) -> list[tuple[str, bool, str]]:
        """``(key, ok, valid range)`` for each of its own keys; checked whichever surrogate is
        selected, so the ranges are loose enough that any value there is at least harmless."""
        return []

    def token_loss(self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                   cfg: Any) -> TokenLoss:
        """Its pure loss function, called with the keys it reads from ``cfg``."""
        raise NotImplementedError

    def refusal(self, cfg: Any) -> str | None:
        """The ConfigError message when a shared option of ``cfg`` does not combine with it."""
        if cfg.agg not in self.aggs:
            return (f"algo.agg={cfg.agg!r} does not combine with algo.loss={self.name}: {self.agg_reason}; "
                    f"set algo.agg={self.aggs[0]}")
        if cfg.is_level not in self.is_levels:
            return (f"algo.is_level={cfg.is_level!r} does not combine with algo.loss={self.name}: {self.is_reason}; "
                    f"set algo.is_level to one of {', '.join(self.is_levels)} (a run with train.max_staleness > 0 "
                    "defaults it to token, so set it there too)")
        if getattr(cfg, "distill", False) and not self.token_advantages:
            return f"algo.distill=true does not combine with algo.loss={self.name}: {self.token_reason}"
        return None


# ---------------------------------------------------------------- shared tensor steps


def masked_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """``(m, d)``: the mask as bool and ``d_t = clamp(log π_θ - log π_old, ±20)`` where m, 0
    elsewhere (selected before anything else, so masked inf/NaN go no further)."""
    import torch

    m = mask.bool()
    d = torch.where(m, logprobs - old_logprobs.detach(), torch.zeros_like(logprobs))
    return m, d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def row_advantages(advantages: Tensor, like: Tensor) -> Tensor:
    """The advantages as a detached constant of the loss, on the device and in the dtype of ``like`` [B, T]: per
    attempt A_i [B] as a [B, 1] column (it broadcasts over the tokens), per token A_t [B, T]
    (on-policy distillation, agentrl.algo.distill) as it is."""
    adv = advantages.detach().to(device=like.device, dtype=like.dtype)  # the update's A_i are made on the CPU
    if adv.dim() == 1 and adv.shape[0] == like.shape[0]:
        return adv[:, None]
    if tuple(adv.shape) == tuple(like.shape):
        return adv
    raise ValueError(f"advantages must be [B]={like.shape[0]} or [B, T]={tuple(like.shape)}, got {tuple(adv.shape)}")


def check_eps(eps_low: float, eps_high: float, *, low_below_one: bool) -> None:
    """A clip range ``[1 - eps_low, 1 + eps_high]`` that is not empty."""
    ok = eps_low >= 0 and eps_high >= 0 and (eps_low < 1 or not low_below_one)
    if not ok:
        bound = "0 <= eps_low < 1" if low_below_one else "eps_low >= 0"
        raise ValueError(f"need {bound} and eps_high >= 0; got {eps_low}, {eps_high}")
