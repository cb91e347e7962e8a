"""``algo.loss: gspo_token``: GSPO-token (Zheng et al. 2025, arXiv 2507.18071).

GSPO's sequence ratio carried per token, so that a per-token loss (and per-token weights)
can be written with it. With sg the stop-gradient and s_i GSPO's sequence ratio::

    s_it = sg[s_i] · π_θ(y_it) / sg[π_θ(y_it)]          (value s_i, gradient s_i ∇log π_θ(y_it))
    L_it = -min(s_it A_i, clip(s_it, 1 - ε_low, 1 + ε_high) A_i)
    loss = (1/G) Σ_i (1/|y_i|) Σ_t L_it                  (seq-mean-token-mean)

Its value and gradient equal GSPO's when A is constant within an attempt, as it is without
distillation (one A_i per attempt; tests/test_surrogates.py checks the equality). It reads GSPO's
keys ``algo.gspo_eps_low`` / ``algo.gspo_eps_high`` (3e-4 / 4e-4).

Per-token advantages A_it (``algo.distill``) are what the paper wrote GSPO-token for: L_it takes
A_it in place of A_i, so the gradient is -s_i A_it ∇log π_θ(y_it) where unclipped (the sequence's
ratio, each token's advantage); the clip still acts on s_i, per token by the sign of A_it.

Combines with: the KL term, the IS weight at token or sequence level (a per-token factor of a
per-token loss), per-token advantages (``algo.distill``) and every filter. Refused: ``algo.agg``
other than seq-mean-token-mean (the paper's form, and the one where the gradient is GSPO's).

Metrics: ``clip_frac`` is the share of trained tokens whose s_it is clipped (all tokens of a
clipped attempt, as with GSPO).

    >>> import torch
    >>> out = gspo_token_loss(torch.tensor([[0.5, 0.5]]), torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2))
    >>> [round(v, 4) for v in out.per_token[0].tolist()], out.clipped.tolist()  # s = e^0.5 > 1.0004
    ([-1.0004, -1.0004], [[True, True]])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentrl.algo.surrogates.base import Surrogate, TokenLoss, check_eps, row_advantages
from agentrl.algo.surrogates.gspo import sequence_log_ratio

if TYPE_CHECKING:
    from torch import Tensor


def gspo_token_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *,
                    eps_low: float = 3e-4, eps_high: float = 4e-4) -> TokenLoss:
    """``L_it = -min(s_it A_i, clip(s_it, 1 - eps_low, 1 + eps_high) A_i)`` with
    ``s_it = sg[s_i] · π_θ(y_it)/sg[π_θ(y_it)]``. Shapes [B, T], ``advantages`` [B] (A_i) or [B, T] (A_it)."""
    import torch

    check_eps(eps_low, eps_high, low_below_one=False)
    m, d, log_s = sequence_log_ratio(logprobs, old_logprobs, mask)
    zero = torch.zeros_like(logprobs)
    # log s_it = sg[log s_i] + (log π_θ - sg[log π_θ]): the second term is 0 in value, and the
    # where() keeps a masked NaN out of it; so exp() sees log s_i, within ±20
    s = torch.exp(log_s.detach()[:, None] + torch.where(m, logprobs - logprobs.detach(), zero))
    adv = row_advantages(advantages, logprobs)
    unclipped, clipped = -s * adv, -s.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    return TokenLoss(torch.maximum(unclipped, clipped), m & (clipped > unclipped), torch.exp(d))


class GspoToken(Surrogate):
    name = "gspo_token"
    reads = ("gspo_eps_low", "gspo_eps_high")  # GSPO's keys, declared in gspo.py
    aggs = ("seq-mean-token-mean",)
    agg_reason = "GSPO-token is defined with 1/G Σ_i 1/|y_i| Σ_t, the form whose gradient is GSPO's (Zheng et al. 2025)"

    def describe(self, cfg: Any) -> str:
        return (f"L_t = -min(s_t A, clip(s_t, 1-{cfg.gspo_eps_low}, 1+{cfg.gspo_eps_high})A),  "
                "s_t = sg[s_i]·π_θ(y_t)/sg[π_θ(y_t)],  s_i: GSPO's   (GSPO-token)")

    def token_loss(self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                   cfg: Any) -> TokenLoss:
        return gspo_token_loss(logprobs, old_logprobs, advantages, mask, eps_low=cfg.gspo_eps_low,
                               eps_high=cfg.gspo_eps_high)


SURROGATE = GspoToken()
