"""The G attempts of a task share their prompt: run it once per micro-batch, not G times.

A micro-batch whose rows all start with the same P tokens is scored in two forwards: the
prefix alone (batch 1, keeping its keys and values), then every row's remainder attending to
those keys and values repeated B times. Attention sees the same keys at the same positions
as in one full forward, so the log-probs are the same up to float summation order; the
gradient reaches the prefix's computation through the repeat (it sums the B rows'
contributions, as the full forward's B copies would). With a one-shot system prompt of
~150 tokens and G = 8 continuations of ~100, the forward and backward handle
150 + 8 x 100 token positions instead of 8 x 250.

Under FSDP every rank must run the same number of forwards, so the trainer uses this only
in a single process (``train.share_prefix``).
"""

from __future__ import annotations

import torch

MIN_SHARED = 16  # below this the second forward costs more than it saves


def shared_prefix_len(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> int:
    """Leading positions on which every row has the same real token (at most the shortest
    row's length minus 1, so that every row keeps a remainder).

    >>> ids = torch.tensor([[5, 6, 7, 8, 0], [5, 6, 7, 9, 4]])
    >>> shared_prefix_len(ids, (ids != 0).long())
    3
    """
    if input_ids.shape[0] < 2:
        return 0
    same = (input_ids == input_ids[:1]).all(0) & (attention_mask > 0).all(0)
    differ = torch.nonzero(~same)
    first = int(differ[0]) if differ.numel() else input_ids.shape[1]
    shortest = int(attention_mask.sum(1).min())
    return max(0, min(first, shortest - 1))


def shared_forward_logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, keep: torch.Tensor,
                          prefix: int) -> torch.Tensor:
    """Logits [B, len(keep), V] at positions ``keep`` (sorted), from the prefix forward for
    positions < ``prefix`` and from the remainder forward for the rest."""
    B = input_ids.shape[0]
    keep_pre, keep_rest = keep[keep < prefix], keep[keep >= prefix] - prefix
    pre = model(input_ids=input_ids[:1, :prefix], attention_mask=attention_mask[:1, :prefix], use_cache=True,
                logits_to_keep=keep_pre if keep_pre.numel() else 1)
    cache = pre.past_key_values
    cache.batch_repeat_interleave(B)
    parts = []
    if keep_pre.numel():
        parts.append(pre.logits.expand(B, -1, -1))
    if keep_rest.numel():
        rest = model(input_ids=input_ids[:, prefix:], attention_mask=attention_mask, past_key_values=cache,
                     use_cache=True, logits_to_keep=keep_rest)
        parts.append(rest.logits)
    return torch.cat(parts, dim=1)


def shared_forward_hidden(body, input_ids: torch.Tensor, attention_mask: torch.Tensor, prefix: int) -> torch.Tensor:
    """The decoder body's last hidden states [B, T, H] (no LM head), the prefix run once."""
    B = input_ids.shape[0]
    pre = body(input_ids=input_ids[:1, :prefix], attention_mask=attention_mask[:1, :prefix], use_cache=True)
    cache = pre.past_key_values
    cache.batch_repeat_interleave(B)
    rest = body(input_ids=input_ids[:, prefix:], attention_mask=attention_mask, past_key_values=cache,
                use_cache=True)
    return torch.cat([pre.last_hidden_state.expand(B, -1, -1), rest.last_hidden_state], dim=1)
