"""``algo.loss: gspo``: Group Sequence Policy Optimization (Zheng et al. 2025, arXiv 2507.18071).

The ratio and the clip are per attempt, not per token. With m the mask and |y_i| = Σ_t m_it::

    s_i = exp( (1/|y_i|) Σ_t m_it (log π_θ(y_it) - log π_old(y_it)) )     (each term clamped to ±20)
    L_i = -min(s_i A_i, clip(s_i, 1 - ε_low, 1 + ε_high) A_i)
    loss = (1/G) Σ_i L_i

s_i is a geometric mean of token ratios, so it moves far less than one token's ratio: the
paper's clip range is ε_low = 3e-4, ε_high = 4e-4 ("we set the left and right clipping ranges
in Equation (5) to 3e-4 and 4e-4, respectively"), the defaults of ``algo.gspo_eps_low`` and
``algo.gspo_eps_high``. Gradient: ∇L_i = -A_i s_i (1/|y_i|) Σ_t ∇log π_θ(y_it) where unclipped.

Combines with: the KL term (added per token, so the loss is 1/G Σ_i (L_i + β·mean_t KL_t)), the
IS weight at sequence level (w_i multiplies L_i) and every filter. Refused: ``algo.agg`` other
than seq-mean-token-mean (the objective is a mean over attempts; token-mean would weight each
by its length), ``algo.is_level: token`` (the ratio being corrected is a sequence's) and
``algo.distill`` (its per-token advantages have no place in L_i, one term per attempt: averaging
them to one A_i would throw away which token the teacher disagreed with; GSPO-token, the paper's
per-token form, takes them).

The sequence is one trajectory row: a split attempt's segments each have their own s_i, as
they count as attempts in G (docs/objectives.md).

Metrics: ``clip_frac`` is the share of trained tokens in clipped attempts (the paper's
"fraction of clipped tokens"); ``ratio_mean``/``ratio_max`` stay per token.

    >>> import torch
    >>> lp = torch.tensor([[0.1, -0.1]], requires_grad=True)  # mean log-ratio 0: s = 1, inside the clip
    >>> out = gspo_loss(lp, torch.zeros(1, 2), torch.tensor([2.0]), torch.ones(1, 2))
    >>> out.per_token.tolist(), out.clipped.tolist()  # L_i = -s A = -2 on each token
    ([[-2.0, -2.0]], [[False, False]])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentrl.algo.surrogates.base import Surrogate, TokenLoss, check_eps, masked_log_ratio

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class GspoFields:
    """GSPO's keys (read with algo.loss=gspo and gspo_token)."""

    # GSPO's clip of the sequence ratio s_i: clip(s_i, 1-gspo_eps_low, 1+gspo_eps_high) (algo.loss=gspo,
    # gspo_token); s_i is a geometric mean over tokens, so it moves far less than one token's ratio
    gspo_eps_low: float = 3e-4  # Zheng et al. 2025: 3e-4
    gspo_eps_high: float = 4e-4  # Zheng et al. 2025: 4e-4


def sequence_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(m, d, log s)``: the mask, the clamped per-token log-ratios (0 where masked) and
    ``log s_i = Σ_t m d_t / |y_i|`` [B] (0 for a row with no trained token; within ±20)."""
    m, d = masked_log_ratio(logprobs, old_logprobs, mask)
    return m, d, d.sum(dim=1) / m.sum(dim=1).clamp(min=1).to(d.dtype)


def gspo_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *,
              eps_low: float = 3e-4, eps_high: float = 4e-4) -> TokenLoss:
    """``L_i = -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)`` on each trained token
    of attempt i (so seq-mean-token-mean gives 1/G Σ_i L_i). Shapes [B, T], ``advantages`` [B]:
    one per attempt, as s_i is (per-token advantages are GSPO-token's, :mod:`.gspo_token`)."""
    import torch

    if advantages.dim() != 1:
        raise ValueError(f"GSPO's advantages are one per attempt, [B]; got {tuple(advantages.shape)} "
                         "(per-token advantages: gspo_token_loss)")

    check_eps(eps_low, eps_high, low_below_one=False)  # s_i > 0: a lower bound <= 0 just never binds
    m, d, log_s = sequence_log_ratio(logprobs, old_logprobs, mask)
    s = torch.exp(log_s)
    adv = advantages.detach().to(device=logprobs.device, dtype=logprobs.dtype)
    unclipped, clipped = -s * adv, -s.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    seq_loss = torch.maximum(unclipped, clipped)
    per_token = torch.where(m, seq_loss[:, None].expand_as(logprobs), torch.zeros_like(logprobs))
    return TokenLoss(per_token, m & (clipped > unclipped)[:, None], torch.exp(d))


class Gspo(Surrogate):
    name = "gspo"
    fields = GspoFields
    reads = ("gspo_eps_low", "gspo_eps_high")
    aggs = ("seq-mean-token-mean",)
    agg_reason = "GSPO's loss is 1/G Σ_i L_i, a mean over attempts (Zheng et al. 2025)"
    is_levels = ("none", "sequence")
    is_reason = "its ratio is a sequence's, so the sampler correction is too"
    token_advantages = False
    token_reason = ("GSPO's loss L_i = -min(s_i A_i, clip(s_i)A_i) has one advantage per attempt, and distillation's "
                    "is per token; set algo.loss=gspo_token, GSPO's ratio carried per token, which takes per-token "
                    "advantages (Zheng et al. 2025), or algo.loss=clip")

    def describe(self, cfg: Any) -> str:
        return (f"L_t = L_i = -min(s_i A, clip(s_i, 1-{cfg.gspo_eps_low}, 1+{cfg.gspo_eps_high})A),  "
                "s_i = (π_θ/π_old)(y_i)^(1/|y_i|)   (GSPO)")

    def rules(self, cfg: Any) -> list[tuple[str, bool, str]]:
        return [("gspo_eps_low", cfg.gspo_eps_low >= 0, ">= 0 (GSPO: 3e-4)"),
                ("gspo_eps_high", cfg.gspo_eps_high >= 0, ">= 0 (GSPO: 4e-4)")]

    def token_loss(self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                   cfg: Any) -> TokenLoss:
        return gspo_loss(logprobs, old_logprobs, advantages, mask, eps_low=cfg.gspo_eps_low,
                         eps_high=cfg.gspo_eps_high)


SURROGATE = Gspo()
