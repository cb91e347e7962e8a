"""Drawing tokens from next-token logits, and detecting stop strings: the per-step work the
embedded engine's batch ``generate`` and its continuous batcher share."""

from __future__ import annotations

import math
import os

import torch
from torch import Tensor


def sample_tokens(logits: Tensor, *, temperature: float, top_p: float, uniforms: Tensor) -> tuple[Tensor, Tensor]:
    """Draw one token per row by inverse-CDF sampling and return (tokens, log-probs).

    p = softmax(logits / T); with top_p < 1 only the smallest prefix of tokens sorted by p whose
    mass reaches top_p stays (renormalised); token = first index whose cumulative mass exceeds
    u * total, u = ``uniforms[row]`` in [0, 1). T = 0 is greedy (argmax). The log-prob returned
    is log_softmax(logits / T)[token] (T = 1 when greedy), untruncated by top_p.

    ``logits`` (B, V) float32 is overwritten: with a 150k vocabulary every vocab-sized
    temporary costs a fresh allocation per step, so the work happens in place.

    >>> lg = torch.tensor([[0.0, 2.0, 1.0]])
    >>> sample_tokens(lg.clone(), temperature=0.0, top_p=1.0, uniforms=torch.zeros(1))[0].tolist()
    [1]
    >>> sample_tokens(lg.clone(), temperature=1.0, top_p=1.0, uniforms=torch.tensor([0.01]))[0].tolist()
    [0]
    """
    if temperature == 0:
        tokens = _argmax(logits)
        mass = logits.sub_(logits.amax(dim=-1, keepdim=True)).exp_().sum(-1)
        return tokens, -mass.log()  # log p(argmax) = -log sum exp(x - max)
    # e = exp((x - max) / T) is p times a per-row constant; log p(t) = log e_t - log sum(e).
    e = logits.sub_(logits.amax(dim=-1, keepdim=True))
    if temperature != 1.0:
        e.mul_(1.0 / temperature)
    e.exp_()
    total = e.sum(-1)
    if top_p < 1.0:
        tokens = _sample_nucleus(e, total, top_p, uniforms)
    else:
        tokens = _sample_full(e, total, uniforms)
    return tokens, e.gather(-1, tokens[:, None])[:, 0].log() - total.log()


def _block_size(vocab: int) -> int:
    return 1 << max(5, round(math.log2(math.sqrt(vocab))))


def _per_block(x: Tensor, block: int, reduce: str) -> Tensor:
    """Reduce (B, V) over consecutive blocks of columns (the last one may be short): (B, ceil(V/block))."""
    n, vocab = x.shape
    full = vocab // block
    parts = [getattr(x[:, : full * block].reshape(n, full, block), reduce)(-1)] if full else []
    if vocab % block:
        parts.append(getattr(x[:, full * block:], reduce)(-1, keepdim=True))
    return torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]


def _argmax(x: Tensor) -> Tensor:
    """First index of each row's maximum, via block maxima (torch's argmax over a 150k-wide row
    is an order of magnitude slower than a max reduction on CPU)."""
    block = _block_size(x.shape[1])
    b = _per_block(x, block, "amax").argmax(-1, keepdim=True)
    cols = (b * block + torch.arange(block, device=x.device)).clamp_(max=x.shape[1] - 1)
    return cols.gather(1, x.gather(1, cols).argmax(-1, keepdim=True))[:, 0]


def _sample_full(e: Tensor, total: Tensor, uniforms: Tensor) -> Tensor:
    """Inverse CDF over unnormalised weights e (B, V) in two levels (blocks of ~sqrt(V)), so no
    vocab-sized cumulative sum is needed."""
    vocab = e.shape[1]
    block = _block_size(vocab)
    sums = _per_block(e, block, "sum")
    cdf = sums.cumsum(-1)
    target = uniforms * cdf[:, -1]
    b = torch.searchsorted(cdf, target[:, None], right=True).clamp_(max=cdf.shape[1] - 1)
    offset = target - (cdf.gather(1, b) - sums.gather(1, b))[:, 0]
    cols = b * block + torch.arange(block, device=e.device)
    inside = cols < vocab
    weights = e.gather(1, cols.clamp(max=vocab - 1)) * inside
    j = torch.searchsorted(weights.cumsum(-1), offset[:, None], right=True).clamp_(max=block - 1)
    tokens = (b * block + j)[:, 0]
    # u * total can round past the last positive weight: never return an excluded token.
    bad = (tokens >= vocab) | (e.gather(1, tokens.clamp(max=vocab - 1)[:, None])[:, 0] <= 0)
    if bool(bad.any()):
        tokens = torch.where(bad, _argmax(e), tokens)
    return tokens


def _sample_nucleus(e: Tensor, total: Tensor, top_p: float, uniforms: Tensor) -> Tensor:
    """Top-p sampling; looks at the 1024 heaviest tokens first and sorts the whole row only
    when they hold less than top_p of the mass."""
    vals, order = e.topk(min(e.shape[1], 1024), dim=-1)
    cum = vals.cumsum(-1)
    if not bool((cum[:, -1] >= top_p * total).all()):
        vals, order = e.sort(dim=-1, descending=True)
        cum = vals.cumsum(-1)
    # Keep a token while the mass strictly before it is below top_p (the first always stays).
    keep = (cum - vals) < top_p * total[:, None]
    vals = vals * keep
    cdf = vals.cumsum(-1)
    idx = torch.searchsorted(cdf, uniforms[:, None] * cdf[:, -1:], right=True)
    idx = torch.minimum(idx, keep.sum(-1, keepdim=True) - 1)
    return order.gather(-1, idx)[:, 0]


class StopStrings:
    """Detects a stop string that ends inside the text of a row's newest token.

    Only a tail window of ids is decoded (enough tokens to hold the longest stop string even
    at one byte per token), in one batched call to the Rust tokenizer when available.
    """

    def __init__(self, tokenizer, stop_strings: list[str]):
        self.tokenizer = tokenizer
        self.stops = [s for s in stop_strings if s]
        self.window = 4 * max((len(s) for s in self.stops), default=0) + 4
        self._batch = getattr(getattr(tokenizer, "backend_tokenizer", None), "decode_batch", None)

    def _decode(self, seqs: list[list[int]]) -> list[str]:
        if self._batch is not None:
            return self._batch(seqs, skip_special_tokens=False)
        return [self.tokenizer.decode(s, skip_special_tokens=False) for s in seqs]

    def hits(self, seqs: list[list[int]]) -> list[bool]:
        """For each token list: does a stop string end within its last token's text?"""
        if not self.stops or not seqs:
            return [False] * len(seqs)
        tails = [s[-self.window:] for s in seqs]
        texts = self._decode(tails + [t[:-1] for t in tails])
        out = []
        for text, before in zip(texts[: len(seqs)], texts[len(seqs):]):
            new_from = len(os.path.commonprefix([text, before]))
            out.append(any(text.find(s, max(0, new_from - len(s) + 1)) >= 0 for s in self.stops))
        return out
