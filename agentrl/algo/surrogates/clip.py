"""``algo.loss: clip`` (the default): the clipped ratio of PPO, as GRPO and DAPO use it.

Per trained token of attempt i, with ρ_t = π_θ(y_t)/π_old(y_t) and A = A_i::

    L_t = -min(ρ_t A, clip(ρ_t, 1 - eps_low, 1 + eps_high) A)
    dual clip (Ye et al. 2020, "Mastering Complex Control in MOBA Games"), A < 0 only, c > 1:
        L_t = min(L_t, -c A)

Defaults ε_low = ε_high = 0.2 (Schulman et al. 2017, PPO; Shao et al. 2024, GRPO); DAPO's
clip-higher (Yu et al. 2025) is ε_high = 0.28. Combines with every aggregation, the KL term,
the IS weight at token or sequence level and every filter.

Metrics: ``clip_frac`` is the share of trained tokens where the clipped branch is taken (its
gradient is 0 there), ``dual_clip_frac`` the share capped by the dual clip.

    >>> import torch
    >>> out = clip_loss(torch.tensor([[0.5]]), torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1))
    >>> round(out.per_token.item(), 4), out.clipped.tolist()  # ρ = e^0.5 = 1.65 > 1.2: -1.2 A, clipped
    (-1.2, [[True]])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentrl.algo.surrogates.base import Surrogate, TokenLoss, check_eps, masked_log_ratio, row_advantages

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class ClipFields:
    """The clip surrogate's keys (read with algo.loss=clip only)."""

    # clipped surrogate L_t = -min(ρA, clip(ρ, 1-eps_low, 1+eps_high)A), ρ = π_θ/π_old (algo.loss=clip);
    # clip-higher when eps_high > eps_low; dual clip for A < 0: L_t = min(L_t, -c·A)
    eps_low: float = 0.2
    eps_high: float = 0.2  # DAPO clip-higher: 0.28
    dual_clip: float | None = None  # c, e.g. 3.0


def clip_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *,
              eps_low: float = 0.2, eps_high: float = 0.2, dual_clip: float | None = None) -> TokenLoss:
    """``L_t = -min(ρ A, clip(ρ, 1 - eps_low, 1 + eps_high) A)``, then ``min(L_t, -c A)`` for
    A < 0 when ``dual_clip = c``. Shapes [B, T], ``advantages`` [B] (A_i) or [B, T] (A_t); the gradient flows
    through ``logprobs`` only. (This is the computation ``policy_loss`` always made, op for op.)"""
    import torch

    check_eps(eps_low, eps_high, low_below_one=True)
    if dual_clip is not None and not dual_clip > 1:
        raise ValueError(f"dual_clip={dual_clip} must be > 1 (Ye et al. use 3), or None")
    m, log_ratio = masked_log_ratio(logprobs, old_logprobs, mask)
    ratio = torch.exp(log_ratio)
    adv = row_advantages(advantages, logprobs)
    loss_unclipped = -ratio * adv
    loss_clipped = -ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    pg = torch.maximum(loss_unclipped, loss_clipped)
    clipped = m & (loss_clipped > loss_unclipped)
    dual = torch.zeros_like(m)
    if dual_clip is not None:
        cap = -dual_clip * adv  # > 0 exactly where A < 0
        dual = m & (adv < 0) & (pg > cap)
        pg = torch.where(adv < 0, torch.minimum(pg, cap), pg)
    return TokenLoss(pg, clipped, ratio, dual)


class Clip(Surrogate):
    name = "clip"
    fields = ClipFields
    reads = ("eps_low", "eps_high", "dual_clip")

    def describe(self, cfg: Any) -> str:
        text = f"L_t = -min(ρA, clip(ρ, 1-{cfg.eps_low}, 1+{cfg.eps_high})A),  ρ = π_θ/π_old"
        if cfg.dual_clip:
            text += f";  dual-clip for A<0: L_t = min(L_t, -{cfg.dual_clip}·A)"
        return text

    def rules(self, cfg: Any) -> list[tuple[str, bool, str]]:
        return [
            ("eps_low", cfg.eps_low >= 0, ">= 0 (e.g. 0.2)"),
            ("eps_high", cfg.eps_high >= 0, ">= 0 (e.g. 0.2, or 0.28 for clip-higher)"),
            ("dual_clip", cfg.dual_clip is None or cfg.dual_clip > 1, "> 1 (e.g. 3.0), or null for off"),
        ]

    def token_loss(self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                   cfg: Any) -> TokenLoss:
        return clip_loss(logprobs, old_logprobs, advantages, mask, eps_low=cfg.eps_low, eps_high=cfg.eps_high,
                         dual_clip=cfg.dual_clip)


SURROGATE = Clip()
