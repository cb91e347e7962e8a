"""Log-probs of the trained tokens straight from the last hidden states, never holding
[rows, V] logits: the LM head runs in chunks of positions, forward and again in backward.

Materialized, a micro-batch of B rows keeps [B, K, V] logits, K the positions that any row
trains on: with SmolLM2's 49,152-word vocabulary, 4 rows and K = 150 that is 118 MB of
float32 logits saved for backward, about as much again for their gradient, and LM-head work
on the (B - 1)/B of those rows that are some other row's prompt or tool output. Here only the
N trained positions go through the head, c at a time (c x V x 4 bytes, 64 MB by default).
With ``h`` [N, H] the hidden states, ``W`` [V, H] the head, ``y`` [N] the targets and
``z = h W^T / T``:

    log p(y_n) = z_n[y_n] - logsumexp(z_n)                     (the forward)
    dL/dz_n    = g_n (onehot(y_n) - softmax(z_n)) / T          (g_n = dL/d log p(y_n))
    dL/dh_n    = dL/dz_n W,    dL/dW = sum_n dL/dz_n^T h_n     (the backward, z recomputed)

The entropy ``H_n = logsumexp(z_n) - sum_v p_v z_v`` comes with it, without a gradient (a
metric). ``compute_dtype`` is the dtype of the two matmuls (bfloat16 under the update's
autocast, as ``nn.Linear`` would run them); softmax and sums are float32. Same values as
``token_logprobs`` over materialized logits up to float summation order.
"""

from __future__ import annotations

import torch
from torch import Tensor

CHUNK_ELEMENTS = 2**24  # logits per chunk: 64 MB of float32


class _HeadLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float,
                compute_dtype: torch.dtype, chunk: int):
        w = weight.to(compute_dtype)
        lp = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        ent = torch.empty_like(lp)
        lse = torch.empty_like(lp)
        for s in range(0, hidden.shape[0], chunk):
            z = _logits(hidden[s:s + chunk], w, temperature)
            lse_c = torch.logsumexp(z, dim=-1)
            lp[s:s + chunk] = z.gather(1, targets[s:s + chunk, None]).squeeze(1) - lse_c
            ent[s:s + chunk] = lse_c - (torch.softmax(z, dim=-1) * z).sum(-1)
            lse[s:s + chunk] = lse_c
        ctx.save_for_backward(hidden, weight, w, targets, lse)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.mark_non_differentiable(ent)
        return lp, ent

    @staticmethod
    def backward(ctx, grad_lp: Tensor, _grad_ent: Tensor):
        hidden, weight, w, targets, lse = ctx.saved_tensors
        T, chunk = ctx.temperature, ctx.chunk
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if need_w else None
        for s in range(0, hidden.shape[0], chunk):
            h = hidden[s:s + chunk]
            g = grad_lp[s:s + chunk].float()
            dz = torch.exp(_logits(h, w, T) - lse[s:s + chunk, None]).mul_(-g[:, None])
            dz.scatter_add_(1, targets[s:s + chunk, None], g[:, None])
            dz = dz.div_(T).to(w.dtype)
            if need_h:
                grad_h[s:s + chunk] = (dz @ w).to(hidden.dtype)
            if need_w:
                grad_w += (dz.T @ h.to(w.dtype)).float()
        return grad_h, grad_w.to(weight.dtype) if need_w else None, None, None, None, None


def _logits(h: Tensor, w: Tensor, temperature: float) -> Tensor:
    """float32 ``h W^T / T`` for one chunk, the matmul in ``w``'s dtype."""
    with torch.autocast(device_type=h.device.type, enabled=False):
        z = (h.to(w.dtype) @ w.T).float()
    return z.div_(temperature) if temperature != 1.0 else z


def head_logprobs(hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float = 1.0,
                  compute_dtype: torch.dtype | None = None,
                  chunk_elements: int = CHUNK_ELEMENTS) -> tuple[Tensor, Tensor]:
    """``(log p(targets), entropy)``, float32 [N] each, under ``softmax(hidden @ weight.T / T)``.

    ``hidden`` [N, H] (one row per trained position), ``weight`` [V, H] (the LM head,
    possibly tied to the input embeddings), ``targets`` [N] long. Gradients reach ``hidden``
    and ``weight``; the entropy has none.

    >>> h, w = torch.zeros(2, 3), torch.randn(4, 3)
    >>> lp, ent = head_logprobs(h, w, torch.tensor([0, 3]))  # zero states: uniform over 4
    >>> [round(v, 4) for v in lp.tolist()], round(ent[0].item(), 4)
    ([-1.3863, -1.3863], 1.3863)
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden must be [N, H] and weight [V, H]; got {tuple(hidden.shape)} "
                         f"and {tuple(weight.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature={temperature} must be > 0")
    chunk = max(1, chunk_elements // weight.shape[0])
    return _HeadLogprobs.apply(hidden, weight, targets, float(temperature), compute_dtype or weight.dtype, chunk)
