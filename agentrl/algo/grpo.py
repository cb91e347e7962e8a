"""The GRPO objective as pure functions on tensors (equations of docs/design.md, "The objective").

Shapes: ``B`` attempts (rows), ``T`` token positions, ``V`` vocabulary. ``mask[b, t] == 1``
means the policy generated token ``t`` of attempt ``b``: train on it. Values at positions
where the mask is 0 never reach a loss or its gradient, even when they are inf or NaN
(every function selects with ``torch.where`` *before* any ``exp``).

Pipeline the trainer runs::

    adv = group_advantages(rewards, group_ids)                # A_i, one per attempt
    logp, ent = token_logprobs(logits, targets, temperature)  # log pi_theta(y_t)
    w = truncated_is_weights(old_logp, sampler_logp, mask, cap=2.0)   # optional
    out = policy_loss(logp, old_logp, adv.advantages, mask, is_weights=w)   # the clip surrogate
    out.loss.backward()

Other surrogates (``algo.loss``: GSPO, CISPO, ...) are modules of :mod:`agentrl.algo.surrogates`;
:func:`surrogate_policy_loss` adds to any of them the IS weight, the KL term and the aggregation.
On-policy distillation (``algo.distill``, :mod:`agentrl.algo.distill`) passes per-token
advantages A_t [B, T] where GRPO passes A_i [B]; everything else is the same.

Example (3 successes of 8, the worked example of docs/design.md, "The objective")::

    >>> import torch
    >>> adv = group_advantages(torch.tensor([[1., 1, 1, 0, 0, 0, 0, 0]]))
    >>> [round(a, 2) for a in adv.advantages[[0, 3]].tolist()]
    [1.29, -0.77]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

# AGG_MODES and LOG_RATIO_CLAMP (±20 on every log-ratio before exp) are shared with the surrogates
from agentrl.algo.surrogates.base import AGG_MODES, LOG_RATIO_CLAMP, TokenLoss
from agentrl.algo.surrogates.clip import clip_loss

STD_KINDS: tuple[str, ...] = ("population", "sample")
SCALES: tuple[str, ...] = ("std", "none")
KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3")
IS_LEVELS: tuple[str, ...] = ("token", "sequence")



def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not valid; use one of: {', '.join(choices)}")


def _check_same_2d(**tensors: Tensor | None) -> None:
    shapes = {k: tuple(v.shape) for k, v in tensors.items() if v is not None}
    first = next(iter(shapes.values()))
    if len(first) != 2 or any(s != first for s in shapes.values()):
        raise ValueError(f"expected [B, T] tensors of one shape, got {shapes}")


# ---------------------------------------------------------------- advantages


@dataclass
class GroupAdvantages:
    """Per-attempt advantages and which groups gave no signal.

    ``advantages`` [N] float (float64 if the rewards were, else float32), in input order
    (a ``[num_groups, G]`` input is flattened row-major); ``zero_variance`` [num_groups]
    bool; ``group_index`` [N] long; ``group_keys[g]`` is the caller's id of group ``g``
    (groups are numbered in order of first appearance).
    """

    advantages: Tensor
    zero_variance: Tensor
    group_index: Tensor
    group_keys: list[Hashable]

    @property
    def num_groups(self) -> int:
        return len(self.group_keys)


def group_advantages(
    rewards: Tensor,
    group_ids: Sequence[Hashable] | Tensor | None = None,
    *,
    std: str = "population",
    scale: str = "std",
    std_floor: float = 1e-6,
) -> GroupAdvantages:
    """Group-relative advantages: ``A_i = (r_i - mean_g(r)) / std_g(r)``.

    ``std="population"`` divides the squared deviations by G (ddof=0), ``"sample"`` by
    G-1. ``scale="none"`` gives ``A_i = r_i - mean_g(r)`` (Dr. GRPO). A group whose std is
    below ``std_floor`` (all rewards equal, or a single attempt) gets ``A_i = 0`` for every
    member, with either scale, and is flagged in ``zero_variance``.

    ``rewards`` is ``[num_groups, G]`` (``group_ids`` None) or flat ``[N]`` with one
    hashable group id per attempt (groups may differ in size). Stats are in float64.

    >>> a = group_advantages(torch.tensor([1., 0, 1, 1]), ["p", "p", "q", "q"])
    >>> a.advantages.tolist(), a.zero_variance.tolist(), a.group_keys
    ([1.0, -1.0, 0.0, 0.0], [False, True], ['p', 'q'])
    """
    _check_choice("std", std, STD_KINDS)
    _check_choice("scale", scale, SCALES)
    if not std_floor > 0:
        raise ValueError(f"std_floor={std_floor} must be > 0 (it detects zero-variance groups)")
    r = torch.as_tensor(rewards)
    if group_ids is None:
        if r.dim() != 2:
            raise ValueError(
                f"rewards of shape {tuple(r.shape)} need group ids: pass group_ids=[...] "
                "for flat [N] rewards, or a [num_groups, G] tensor"
            )
        keys: list[Hashable] = list(range(r.shape[0]))
        index = torch.arange(r.shape[0], device=r.device).repeat_interleave(r.shape[1])
        flat = r.reshape(-1)
    else:
        ids = group_ids.tolist() if isinstance(group_ids, Tensor) else list(group_ids)
        if r.dim() != 1 or len(ids) != r.numel():
            raise ValueError(
                f"group_ids ({len(ids)} ids) must match flat rewards [N], got {tuple(r.shape)}"
            )
        first_seen: dict[Hashable, int] = {}
        order = [first_seen.setdefault(k, len(first_seen)) for k in ids]
        keys = list(first_seen)
        index = torch.tensor(order, dtype=torch.long, device=r.device)
        flat = r
    if flat.numel() == 0:
        raise ValueError("no rewards: a group needs at least one attempt")
    x = flat.to(torch.float64)
    bad = (~torch.isfinite(x)).nonzero().flatten().tolist()
    if bad:
        raise ValueError(f"rewards must be finite numbers; attempts {bad[:8]} are not (check the checker)")

    ng = len(keys)
    counts = torch.bincount(index, minlength=ng).to(torch.float64)
    mean = torch.zeros(ng, dtype=torch.float64, device=x.device).index_add_(0, index, x) / counts
    dev = x - mean[index]
    sq = torch.zeros_like(mean).index_add_(0, index, dev * dev)
    dof = counts - (1.0 if std == "sample" else 0.0)
    sd = torch.where(dof > 0, (sq / dof.clamp(min=1.0)).sqrt(), torch.zeros_like(sq))
    zero_var = sd < std_floor
    denom = sd if scale == "std" else torch.ones_like(sd)
    denom = torch.where(zero_var, torch.ones_like(denom), denom)
    adv = torch.where(zero_var[index], torch.zeros_like(dev), dev / denom[index])
    out_dtype = torch.float64 if flat.dtype == torch.float64 else torch.float32
    return GroupAdvantages(adv.to(out_dtype), zero_var, index, keys)


# ---------------------------------------------------------------- log-probs


def token_logprobs(
    logits: Tensor,
    targets: Tensor,
    temperature: float = 1.0,
    *,
    entropy_grad: bool = False,
    max_chunk_elements: int = 2**26,
) -> tuple[Tensor, Tensor]:
    """Log-prob of each target token and the entropy, under ``softmax(logits / temperature)``.

    ``logits`` [B, T, V] (position t scores ``targets[:, t]``), ``targets`` [B, T] long.
    Returns float32 ``(logprobs [B, T], entropy [B, T])`` with
    ``log p(y_t) = z[y_t] - logsumexp(z)`` and ``H_t = logsumexp(z) - sum_v p_v z_v``,
    ``z = logits / temperature``. Use the sampler's temperature so that the ratio compares
    the same distributions. Work is done in float32 over row chunks of at most
    ``max_chunk_elements`` logits, so no float64 or full-batch temporaries are made; under
    autograd, one float32 copy of the logits is kept for backward (none when they are
    already float32 and temperature is 1). The entropy is detached unless
    ``entropy_grad=True`` (it is a metric; its graph would keep another [B, T, V]).

    >>> lp, h = token_logprobs(torch.zeros(1, 2, 4), torch.tensor([[0, 3]]))
    >>> [round(v, 4) for v in lp[0].tolist()], round(h[0, 0].item(), 4)  # uniform over 4
    ([-1.3863, -1.3863], 1.3863)
    """
    if logits.dim() != 3 or tuple(targets.shape) != tuple(logits.shape[:2]):
        raise ValueError(
            f"logits must be [B, T, V] and targets [B, T]; got {tuple(logits.shape)} "
            f"and {tuple(targets.shape)}"
        )
    if not temperature > 0:
        raise ValueError(f"temperature={temperature} must be > 0")
    bsz, seq, vocab = logits.shape
    if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= vocab):
        raise ValueError(
            f"targets must be token ids in [0, {vocab}); got range "
            f"[{int(targets.min())}, {int(targets.max())}] (replace padding/ignore ids by 0 and mask them)"
        )
    if bsz == 0:
        empty = logits.new_zeros((0, seq), dtype=torch.float32)
        return empty, empty.clone()
    rows = max(1, max_chunk_elements // max(1, seq * vocab))
    lps, ents = [], []
    for s in range(0, bsz, rows):
        z = logits[s : s + rows].float()
        if temperature != 1.0:
            z = z / temperature
        lse = torch.logsumexp(z, dim=-1)
        lps.append(z.gather(-1, targets[s : s + rows, :, None].long()).squeeze(-1) - lse)
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            p = torch.softmax(z, dim=-1)
            # 0 * -inf is NaN; a token with p == 0 (e.g. a -inf logit) adds nothing.
            pz = torch.where(p > 0, p * z, torch.zeros_like(z)).sum(-1)
            ents.append(lse - pz)
    return torch.cat(lps), torch.cat(ents)


# ---------------------------------------------------------------- KL and IS


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from tokens sampled from pi_theta.

    With ``d = log pi_ref - log pi_theta`` (Schulman, "Approximating KL divergence"):
    ``k1 = -d`` (unbiased, can be negative), ``k2 = d^2 / 2`` (biased, >= 0),
    ``k3 = exp(d) - d - 1`` (unbiased, >= 0; ``d`` is clamped to +-20 so it stays finite).

    >>> round(kl_penalty(torch.tensor([-1.0]), torch.tensor([-2.0]), "k3").item(), 4)  # e^-1 - (-1) - 1
    0.3679
    """
    _check_choice("estimator", estimator, KL_ESTIMATORS)
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(f"shape mismatch: {tuple(logprobs.shape)} vs {tuple(ref_logprobs.shape)}")
    d = ref_logprobs - logprobs
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d * d
    d = d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.exp(d) - d - 1.0


@torch.no_grad()
def truncated_is_weights(
    old_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor, *, cap: float, level: str = "token"
) -> Tensor:
    """Truncated importance weights pi_old / mu for a stale or different sampler mu.

    ``level="token"``: ``w_t = min(exp(log pi_old_t - log mu_t), C)``.
    ``level="sequence"``: ``w_i = min(exp(sum_t m_t (log pi_old_t - log mu_t)), C)``, the same
    value on every masked token of the row. Returned [B, T], detached (a weight, not a
    path for gradients), 0 where ``mask`` is 0 so it can multiply any per-token tensor.
    Computed as ``exp(min(log w, log C))``: never inf or NaN.

    >>> old, mu, m = torch.tensor([[0.0, -1.0]]), torch.tensor([[-1.0, -1.0]]), torch.ones(1, 2)
    >>> [round(v, 4) for v in truncated_is_weights(old, mu, m, cap=2.0)[0].tolist()]  # min(e, 2), 1
    [2.0, 1.0]
    """
    _check_choice("level", level, IS_LEVELS)
    if not (cap > 0 and math.isfinite(cap)):
        raise ValueError(f"cap={cap} must be a positive finite number (AReaL uses ~2)")
    _check_same_2d(old_logprobs=old_logprobs, sampler_logprobs=sampler_logprobs, mask=mask)
    m = mask.bool()
    d = torch.where(m, old_logprobs - sampler_logprobs, torch.zeros_like(old_logprobs))
    log_cap = math.log(cap)
    if level == "token":
        w = torch.exp(d.clamp(max=log_cap))
    else:
        w = torch.exp(d.sum(dim=1, keepdim=True).clamp(max=log_cap)).expand_as(d)
    return torch.where(m, w, torch.zeros_like(w))


# ---------------------------------------------------------------- aggregation


def _denominator(name: str, given: int | None, local: int) -> int:
    if given is None:
        return max(local, 1)  # an empty micro-batch sums to 0; avoid 0/0
    if given < max(local, 1):
        raise ValueError(
            f"{name}={given} is smaller than the {local} counted in this micro-batch; pass "
            "the count over the whole batch (all micro-batches and ranks), or None"
        )
    return given


def aggregate(
    per_token: Tensor,
    mask: Tensor,
    mode: str = "seq-mean-token-mean",
    *,
    total_seqs: int | None = None,
    total_tokens: int | None = None,
    norm_len: int | None = None,
) -> Tensor:
    """Reduce a per-token loss [B, T] to a scalar over the masked tokens.

    With m the mask and |y_i| = sum_t m_it:

    - ``"seq-mean-token-mean"`` (GRPO): ``1/G sum_i 1/|y_i| sum_t m_it x_it``
    - ``"token-mean"`` (DAPO): ``sum_it m_it x_it / N_tok``
    - ``"seq-mean-token-sum-norm"`` (Dr. GRPO): ``sum_it m_it x_it / (G * norm_len)``,
      ``norm_len`` = the generation budget in tokens (required)

    ``G = total_seqs`` and ``N_tok = total_tokens`` are global counts: summing the results
    of micro-batches (and ranks) then gives exactly the full-batch value. By default they
    are counted in this call (rows with >= 1 masked token; masked tokens). Rows with no
    masked token contribute 0.

    >>> x, m = torch.tensor([[1.0, 3.0], [5.0, 0.0]]), torch.tensor([[1, 1], [1, 0]])
    >>> aggregate(x, m).item(), aggregate(x, m, "token-mean").item()  # (2+5)/2, 9/3
    (3.5, 3.0)
    """
    _check_choice("agg", mode, AGG_MODES)
    _check_same_2d(per_token=per_token, mask=mask)
    m = mask.bool()
    x = torch.where(m, per_token, torch.zeros_like(per_token))
    lens = m.sum(dim=1)
    if mode == "token-mean":
        return x.sum() / _denominator("total_tokens", total_tokens, int(lens.sum()))
    g = _denominator("total_seqs", total_seqs, int((lens > 0).sum()))
    if mode == "seq-mean-token-mean":
        return (x.sum(dim=1) / lens.clamp(min=1).to(x.dtype)).sum() / g
    if norm_len is None or norm_len <= 0:
        raise ValueError(
            "agg='seq-mean-token-sum-norm' needs norm_len = the generation budget in tokens "
            "(e.g. max new tokens per attempt)"
        )
    return x.sum() / (g * norm_len)


# ---------------------------------------------------------------- policy loss


@dataclass
class PolicyLossOutput:
    """The loss to backpropagate and detached metrics over this call's masked tokens.

    Metrics are 0 when no token is masked; ``num_tokens`` lets a trainer weight them
    when combining micro-batches.
    """

    loss: Tensor  # scalar; loss.backward() is the update direction
    pg_loss: Tensor  # the clipped-surrogate part alone, aggregated like loss
    kl: Tensor  # mean per-token KL estimate (0 without ref_logprobs)
    clip_frac: Tensor  # fraction of tokens where the clipped branch was active
    dual_clip_frac: Tensor  # fraction of tokens capped by the dual clip
    ratio_mean: Tensor
    ratio_max: Tensor
    num_tokens: Tensor


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
    agg: str = "seq-mean-token-mean",
    total_seqs: int | None = None,
    total_tokens: int | None = None,
    norm_len: int | None = None,
    is_weights: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
) -> PolicyLossOutput:
    """Clipped surrogate loss with optional dual clip, IS correction and KL penalty: the
    ``clip`` surrogate (:func:`agentrl.algo.surrogates.clip.clip_loss`) through
    :func:`surrogate_policy_loss`, as ``Objective.policy_loss`` computes it with ``algo.loss: clip``.

    Per masked token of attempt i, with ``rho = exp(log pi_theta - log pi_old)`` and
    ``A = advantages[i]``::

        L_t = -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)
        dual clip (Ye et al. 2020), A < 0 only, c = dual_clip > 1:
            L_t = min(L_t, -c A)     i.e. objective max(min(rho A, clip(rho) A), c A)
        L_t = w_t L_t + kl_coef * KL_t          (w = is_weights, KL = kl_penalty(..., kl_estimator))
        loss = aggregate(L, mask, agg)

    ``logprobs`` carries the gradient; old/ref log-probs, advantages and weights are
    treated as constants (detached). Shapes: [B, T] except ``advantages`` [B].

    >>> lp = torch.zeros(1, 2, requires_grad=True)
    >>> out = policy_loss(lp, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2))
    >>> out.loss.item(), out.clip_frac.item()  # rho = 1: loss = -A
    (-1.0, 0.0)
    """
    return surrogate_policy_loss(
        lambda lp, old, adv, m: clip_loss(lp, old, adv, m, eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip),
        logprobs, old_logprobs, advantages, mask, agg=agg, total_seqs=total_seqs, total_tokens=total_tokens,
        norm_len=norm_len, is_weights=is_weights, ref_logprobs=ref_logprobs, kl_coef=kl_coef, kl_estimator=kl_estimator)


def surrogate_policy_loss(
    token_loss: Callable[[Tensor, Tensor, Tensor, Tensor], TokenLoss],
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    agg: str = "seq-mean-token-mean",
    total_seqs: int | None = None,
    total_tokens: int | None = None,
    norm_len: int | None = None,
    is_weights: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
) -> PolicyLossOutput:
    """Any surrogate's loss, with what all of them share::

        L_t = token_loss(logprobs, old_logprobs, advantages, mask).per_token    (agentrl.algo.surrogates)
        L_t = w_t L_t + kl_coef * KL_t          (w = is_weights, KL = kl_penalty(..., kl_estimator))
        loss = aggregate(L, mask, agg)

    and the metrics over this call's masked tokens. ``logprobs`` carries the gradient;
    old/ref log-probs, advantages and weights are treated as constants (detached). Shapes:
    [B, T] except ``advantages``: [B], one A_i per attempt, or [B, T], one A_t per token
    (on-policy distillation, :func:`agentrl.algo.distill.distill_advantages`).
    """
    _check_same_2d(logprobs=logprobs, old_logprobs=old_logprobs, mask=mask,
                   is_weights=is_weights, ref_logprobs=ref_logprobs)
    _check_choice("agg", agg, AGG_MODES)
    _check_choice("kl_estimator", kl_estimator, KL_ESTIMATORS)
    if tuple(advantages.shape) not in ((logprobs.shape[0],), tuple(logprobs.shape)):
        raise ValueError(f"advantages must be [B]={logprobs.shape[0]} or [B, T]={tuple(logprobs.shape)}, "
                         f"got {tuple(advantages.shape)}")
    tl = token_loss(logprobs, old_logprobs, advantages, mask)
    if kl_coef < 0:
        raise ValueError(f"kl_coef={kl_coef} must be >= 0")
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs (log-probs of the reference model)")

    m = mask.bool()
    zero = torch.zeros_like(logprobs)
    pg = tl.per_token
    if is_weights is not None:
        pg = pg * torch.where(m, is_weights.detach().to(pg.dtype), zero)
    per_token = pg
    kl_tok = None
    if ref_logprobs is not None:
        kl_tok = kl_penalty(torch.where(m, logprobs, zero),
                            torch.where(m, ref_logprobs.detach().to(logprobs.dtype), zero), kl_estimator)
        if kl_coef > 0:
            per_token = pg + kl_coef * kl_tok
    counts = dict(total_seqs=total_seqs, total_tokens=total_tokens, norm_len=norm_len)
    loss = aggregate(per_token, mask, agg, **counts)

    with torch.no_grad():
        n = m.sum()
        denom = n.clamp(min=1).to(logprobs.dtype)
        masked_ratio = torch.where(m, tl.ratio, zero)
        return PolicyLossOutput(
            loss=loss,
            pg_loss=aggregate(pg.detach(), mask, agg, **counts),
            kl=(torch.where(m, kl_tok, zero).sum() / denom) if kl_tok is not None else zero.sum(),
            clip_frac=tl.clipped.sum() / denom,
            dual_clip_frac=tl.dual.sum() / denom if tl.dual is not None else zero.sum(),
            ratio_mean=masked_ratio.sum() / denom,
            ratio_max=masked_ratio.max() if n > 0 else zero.sum(),
            num_tokens=n,
        )
