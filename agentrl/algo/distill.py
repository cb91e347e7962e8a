"""On-policy distillation (``algo.distill``): a teacher scores the student's own sampled tokens.

The student samples as in GRPO; a frozen teacher (``model.teacher_path``, any model with the
student's tokenizer) is run teacher-forced over the same tokens, one forward pass in the update's
micro-batches, no sampling (the reference model's path, :func:`agentrl.algo.batching.score_tokens`).
Per trained token t of attempt i, with μ the sampler that drew it and π_T the teacher::

    d_t = clamp(log μ(y_t) - log π_T(y_t), ±20)        one-sample estimate of the reverse KL(μ || π_T)
    A_t = A_i + distill_coef · (-d_t)                    algo.distill_reward = true (default)
    A_t =       distill_coef · (-d_t)                    algo.distill_reward = false: pure distillation
    A_t = 0                                              where the loss mask is 0 (prompt, template, tool)

A_t replaces the per-attempt A_i in the surrogate (``algo.loss``): with the default clip surrogate
and ρ = π_θ/π_old, L_t = -min(ρ_t A_t, clip(ρ_t, 1-ε, 1+ε) A_t), and at ρ = 1 the gradient is
-A_t ∇log π_θ(y_t): the per-token policy gradient of -KL(π_θ || π_T) with the future terms
dropped (Tinker's ``kl_discount_factor = 0``), plus GRPO's own when the reward is kept.

The form is the Tinker cookbook's (thinking-machines-lab/tinker-cookbook,
``distillation/train_on_policy.py``, ``incorporate_kl_penalty``): "the advantage is the negative
reverse KL", ``kl_penalty_coef`` 1.0 by default, *added* to the environment's advantage, with the
student's log-prob taken from the **sampler** (``sampled_logprobs``), and the importance-sampling
loss. agentrl takes the sampler's log-probs too (``Trajectory.logprobs``): μ is the distribution
the tokens were actually drawn from, so -d_t estimates the reverse KL of what was sampled, it is
known before the update's first forward (the advantage is a constant of every iteration), and
with a stale or different sampler it is the sampler's distance to the teacher that is scored (the
IS weight, ``algo.is_level``, corrects the ratio as for GRPO). TRL's MiniLLM trainer instead takes
the training forward's log-probs, equal to μ's up to numerics in a synchronous run.

The ±20 clamp is the project's rule for every log-ratio (agentrl.algo.surrogates.base): a token
the teacher gives e^-20 is already the strongest signal there is, and a finite advantage keeps
NaN out of the surrogates' masked branches.

Torch is imported inside the functions: :mod:`agentrl.algo.settings` reads :class:`DistillFields`
while the config loads, and that must not load torch.

    >>> import torch
    >>> mu, teacher, m = torch.tensor([[-1.0, -0.5]]), torch.tensor([[-0.2, -3.0]]), torch.tensor([[1.0, 0.0]])
    >>> a = distill_advantages(mu, teacher, m, coef=1.0, env_advantages=torch.tensor([0.5]))
    >>> [round(v, 4) for v in a[0].tolist()]  # 0.5 + (-0.2 - -1.0); the untrained token: 0
    [1.3, 0.0]
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

# the clamp of every log-ratio (agentrl.algo.surrogates.base.LOG_RATIO_CLAMP): imported lazily
# there would import torch-free too, but one number is not worth an import edge
_CLAMP = 20.0


@dataclass(frozen=True)
class DistillFields:
    """The keys of on-policy distillation (the last fields of ``algo:``)."""

    # on-policy distillation from the teacher model.teacher_path: per trained token,
    # A_t = A_i + distill_coef·(log π_teacher - log μ)(y_t), μ the sampler (Tinker's form; docs/objectives.md)
    distill: bool = False
    distill_coef: float = 1.0  # weight of the negative reverse KL in A_t (Tinker's kl_penalty_coef: 1.0)
    # keep the environment's group advantage A_i in A_t; false = pure distillation (the teacher alone)
    distill_reward: bool = True


def reverse_kl_tokens(sampler_logprobs: Tensor, teacher_logprobs: Tensor, mask: Tensor) -> Tensor:
    """``d_t = clamp(log μ(y_t) - log π_T(y_t), ±20)`` on trained tokens, 0 where the mask is 0
    (selected first, so inf or NaN there go no further). Shapes [B, T]; detached.

    >>> import torch
    >>> reverse_kl_tokens(torch.tensor([[-1.0, 0.0]]), torch.tensor([[-3.0, float("nan")]]),
    ...                   torch.tensor([[1, 0]])).tolist()
    [[2.0, 0.0]]
    """
    import torch

    if sampler_logprobs.shape != teacher_logprobs.shape or sampler_logprobs.shape != mask.shape \
            or sampler_logprobs.dim() != 2:
        raise ValueError(f"expected [B, T] tensors of one shape, got {tuple(sampler_logprobs.shape)}, "
                         f"{tuple(teacher_logprobs.shape)}, {tuple(mask.shape)}")
    m = mask.bool()
    zero = torch.zeros_like(sampler_logprobs, dtype=torch.float32)
    d = torch.where(m, sampler_logprobs.detach().float() - teacher_logprobs.detach().float(), zero)
    return torch.where(m, d.clamp(-_CLAMP, _CLAMP), zero)


def distill_advantages(sampler_logprobs: Tensor, teacher_logprobs: Tensor, mask: Tensor, *, coef: float = 1.0,
                       env_advantages: Tensor | None = None) -> Tensor:
    """Per-token advantages [B, T] of on-policy distillation::

        A_t = A_i + coef · (-d_t),   d_t = clamp(log μ(y_t) - log π_T(y_t), ±20)   on trained tokens
        A_t = 0                                                                   elsewhere

    ``env_advantages`` [B] is A_i (None: pure distillation, A_i left out). ``sampler_logprobs``
    (μ, the sampler's), ``teacher_logprobs`` and ``mask`` are [B, T]. float32, detached.
    """
    import torch

    if not coef >= 0:
        raise ValueError(f"coef={coef} must be >= 0")
    d = reverse_kl_tokens(sampler_logprobs, teacher_logprobs, mask)
    adv = -coef * d
    if env_advantages is not None:
        if tuple(env_advantages.shape) != (d.shape[0],):
            raise ValueError(f"env_advantages must be [B]={d.shape[0]}, got {tuple(env_advantages.shape)}")
        adv = adv + env_advantages.detach().to(adv.dtype)[:, None]
    return torch.where(mask.bool(), adv, torch.zeros_like(adv))


def describe_distill(cfg: Any) -> str:
    """The printed block's ``distill`` line (``cfg``: the AlgoConfig), when distillation is on."""
    signal = f"{cfg.distill_coef}·(log π_T - log μ)(y_t)"
    if cfg.distill_reward:
        return f"A_t = A_i + {signal},  π_T: model.teacher_path, μ: the sampler   (on-policy distillation)"
    return f"A_t = {signal},  π_T: model.teacher_path, μ: the sampler   (pure on-policy distillation: no A_i)"


def distill_rules(cfg: Any) -> list[tuple[str, bool, str]]:
    """``(key, ok, valid range)`` of the distillation keys (checked whether it is on or off)."""
    return [("distill_coef", cfg.distill_coef > 0, "> 0 (Tinker's kl_penalty_coef: 1.0)")]


def unread_distill_keys(cfg: Any) -> list[str]:
    """``key=value`` of the distillation keys set away from their default while ``algo.distill``
    is off (the printed block's "ignored" line: no setting goes unseen)."""
    if cfg.distill:
        return []
    return [f"algo.{f.name}={getattr(cfg, f.name)!r}" for f in dataclasses.fields(DistillFields)
            if f.name != "distill" and getattr(cfg, f.name) != f.default]
