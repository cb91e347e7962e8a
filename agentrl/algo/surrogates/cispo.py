"""``algo.loss: cispo``: Clipped IS-weight Policy Optimization (MiniMax-M1, arXiv 2506.13585).

The clip moves from the objective to a detached weight, so no token loses its gradient::

    L_t = -sg(clip(ρ_t, 1 - ε_low, 1 + ε_high)) · A_i · log π_θ(y_t)
    loss (the paper's token-mean, algo.agg=token-mean) = Σ_{i,t} m_it L_it / Σ_i |y_i|
    ∇L_t = -clip(ρ_t, ...) · A_i · ∇log π_θ(y_t)       (= the plain policy gradient at ρ = 1)

MiniMax-M1 clips the upper side only ("we did not impose a lower bound on the IS weight by
setting ε_low to a large value; instead, we only tuned ε_high") and publishes no ε_high. The
defaults: ``algo.cispo_eps_low = 1.0`` (the weight's floor is 0: no lower bound, since ρ > 0)
and ``algo.cispo_eps_high = 3.0``, a cap of 4 on the weight: the default of the CISPO loss of
Thinking Machines' Tinker (clip_high_threshold = 4.0), which cites MiniMax-M1 and ScaleRL
(Khatri et al. 2025, arXiv 2510.13786).

Combines with every aggregation (the loss is per token; MiniMax-M1 uses token-mean, the
default agg is GRPO's seq-mean-token-mean: set ``algo.agg: token-mean`` for the paper's), the
KL term, the IS weight at token or sequence level (a further detached factor) and every filter.

Its loss value is -w·A·log π (not -ρA): ``loss``/``pg_loss`` are not comparable with clip's.
Metrics: ``clip_frac`` is the share of trained tokens whose weight is clipped (their gradient
is scaled down, never dropped).

    >>> import torch
    >>> out = cispo_loss(torch.tensor([[-2.0]]), torch.tensor([[-2.0]]), torch.tensor([0.5]), torch.ones(1, 1))
    >>> out.per_token.item(), out.clipped.tolist()  # ρ = 1: -1 · 0.5 · (-2)
    (1.0, [[False]])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentrl.algo.surrogates.base import Surrogate, TokenLoss, check_eps, masked_log_ratio, row_advantages

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class CispoFields:
    """CISPO's keys (read with algo.loss=cispo only)."""

    # CISPO's detached weight sg(clip(ρ, 1-cispo_eps_low, 1+cispo_eps_high)) on -A·log π_θ (algo.loss=cispo)
    cispo_eps_low: float = 1.0  # 1.0 = no lower bound (weight floor 0), as MiniMax-M1
    cispo_eps_high: float = 3.0  # weight cap 1 + 3 = 4 (Tinker's CISPO default; MiniMax-M1 gives no value)


def cispo_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *,
               eps_low: float = 1.0, eps_high: float = 3.0) -> TokenLoss:
    """``L_t = -sg(clip(ρ_t, 1 - eps_low, 1 + eps_high)) A_i log π_θ(y_t)``. Shapes [B, T],
    ``advantages`` [B] (A_i) or [B, T] (A_t); 0 where the mask is 0."""
    import torch

    check_eps(eps_low, eps_high, low_below_one=False)  # eps_low >= 1: the floor is <= 0, no bound
    m, d = masked_log_ratio(logprobs, old_logprobs, mask)
    ratio = torch.exp(d).detach()
    weight = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)  # sg(): a constant of the loss
    logp = torch.where(m, logprobs, torch.zeros_like(logprobs))  # masked NaN/inf never multiply
    per_token = -weight * row_advantages(advantages, logprobs) * logp
    clipped = m & ((ratio > 1.0 + eps_high) | (ratio < 1.0 - eps_low))
    return TokenLoss(per_token, clipped, ratio)


class Cispo(Surrogate):
    name = "cispo"
    fields = CispoFields
    reads = ("cispo_eps_low", "cispo_eps_high")

    def describe(self, cfg: Any) -> str:
        lo, hi = cfg.cispo_eps_low, cfg.cispo_eps_high
        weight = f"min(ρ, 1+{hi})" if lo >= 1 else f"clip(ρ, 1-{lo}, 1+{hi})"
        return f"L_t = -sg({weight})·A·log π_θ(y_t),  ρ = π_θ/π_old   (CISPO)"

    def rules(self, cfg: Any) -> list[tuple[str, bool, str]]:
        return [("cispo_eps_low", cfg.cispo_eps_low >= 0, ">= 0 (1.0 or more: no lower bound)"),
                ("cispo_eps_high", cfg.cispo_eps_high >= 0, ">= 0 (e.g. 3.0: the weight is capped at 4)")]

    def token_loss(self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                   cfg: Any) -> TokenLoss:
        return cispo_loss(logprobs, old_logprobs, advantages, mask, eps_low=cfg.cispo_eps_low,
                          eps_high=cfg.cispo_eps_high)


SURROGATE = Cispo()
