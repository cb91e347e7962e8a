"""``algo.loss: sapo``: Soft Adaptive Policy Optimization (Gao et al. 2025, Qwen, arXiv 2511.20347).

The hard clip is replaced by a smooth gate of the token ratio, steeper for negative advantages::

    f(ρ) = σ(τ (ρ - 1)) · 4/τ,        τ = τ_pos if A_i > 0, τ_neg if A_i < 0
    L_t = -f(ρ_t) A_i
    loss = (1/G) Σ_i (1/|y_i|) Σ_t L_it                  (seq-mean-token-mean, as GRPO)
    ∇L_t = -A_i · 4 σ(1 - σ) · ρ_t ∇log π_θ(y_t)        (σ at τ(ρ_t - 1); = -A_i ∇log π_θ at ρ = 1)

The gate's weight 4σ(1-σ) is 1 at ρ = 1 and fades smoothly away from it, where the clip cuts
to 0. Defaults τ_pos = 1.0, τ_neg = 1.05, the paper's (τ_neg > τ_pos: a negative update raises
the logits of many unsampled tokens, so it is damped faster), as ms-swift and Trinity-RFT take
them from it. Note f(1) = 2/τ: at ρ = 1 the loss value is -2A/τ, not -A.

Combines with every aggregation (per-token loss), the KL term, the IS weight at token or
sequence level and every filter.

Metrics: with no hard clip, ``clip_frac`` is the gradient share the gate removes, the mean of
1 - 4σ(1-σ) over trained tokens (for a hard clip that is the share of clipped tokens); 0 at ρ = 1.

    >>> import torch
    >>> out = sapo_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1))
    >>> round(out.per_token.item(), 4), out.clipped.item()  # ρ = 1, A < 0: -(2/1.05)(-1)
    (1.9048, 0.0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentrl.algo.surrogates.base import Surrogate, TokenLoss, masked_log_ratio, row_advantages

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class SapoFields:
    """SAPO's keys (read with algo.loss=sapo only)."""

    # SAPO's soft gate f(ρ) = σ(τ(ρ-1))·4/τ in place of the clip, L_t = -f(ρ)A (algo.loss=sapo);
    # the larger τ, the faster the gate fades away from ρ = 1
    sapo_tau_pos: float = 1.0  # τ for A > 0 (Gao et al. 2025: 1.0)
    sapo_tau_neg: float = 1.05  # τ for A < 0 (Gao et al. 2025: 1.05)


def sapo_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *,
              tau_pos: float = 1.0, tau_neg: float = 1.05) -> TokenLoss:
    """``L_t = -σ(τ(ρ_t - 1)) · 4/τ · A_i`` with τ by the sign of A_i. Shapes [B, T],
    ``advantages`` [B] (A_i) or [B, T] (A_t, τ then by the sign of each A_t)."""
    import torch

    if not (tau_pos > 0 and tau_neg > 0):
        raise ValueError(f"need tau_pos > 0 and tau_neg > 0; got {tau_pos}, {tau_neg}")
    m, d = masked_log_ratio(logprobs, old_logprobs, mask)
    ratio = torch.exp(d)
    adv = row_advantages(advantages, logprobs)
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
    sig = torch.sigmoid(tau * (ratio - 1.0))
    per_token = -(sig * (4.0 / tau)) * adv
    removed = torch.where(m, 1.0 - 4.0 * sig * (1.0 - sig), torch.zeros_like(sig)).detach()
    return TokenLoss(per_token, removed, ratio)


class Sapo(Surrogate):
    name = "sapo"
    fields = SapoFields
    reads = ("sapo_tau_pos", "sapo_tau_neg")

    def describe(self, cfg: Any) -> str:
        return (f"L_t = -f(ρ)A,  f(ρ) = σ(τ(ρ-1))·4/τ,  τ = {cfg.sapo_tau_pos} (A>0), {cfg.sapo_tau_neg} (A<0),  "
                "ρ = π_θ/π_old   (SAPO)")

    def rules(self, cfg: Any) -> list[tuple[str, bool, str]]:
        return [("sapo_tau_pos", cfg.sapo_tau_pos > 0, "> 0 (SAPO: 1.0)"),
                ("sapo_tau_neg", cfg.sapo_tau_neg > 0, "> 0 (SAPO: 1.05)")]

    def token_loss(self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                   cfg: Any) -> TokenLoss:
        return sapo_loss(logprobs, old_logprobs, advantages, mask, tau_pos=cfg.sapo_tau_pos,
                         tau_neg=cfg.sapo_tau_neg)


SURROGATE = Sapo()
