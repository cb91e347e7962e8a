"""The model's own forward with a ``DynamicCache``: the sampling forward of every architecture
the fast decoder does not reproduce (and the reference it is probed against)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from agentrl.engines.prefix_cache import PrefixCache


@dataclass
class PaddedPrompts:
    """Prompts left-padded to one length: ``ids[b, L - lengths[b]:]`` is prompt ``b``."""

    ids: Tensor  # (B, L) long, pad positions hold 0
    valid: Tensor  # (B, L) bool, False on left padding
    positions: Tensor  # (B, L) long, 0 at each prompt's first real token (pads clamp to 0)

    @classmethod
    def build(cls, prompts: list[list[int]], device: torch.device) -> "PaddedPrompts":
        width = max(len(p) for p in prompts)
        ids = torch.zeros(len(prompts), width, dtype=torch.long)
        valid = torch.zeros(len(prompts), width, dtype=torch.bool)
        for b, p in enumerate(prompts):
            ids[b, width - len(p):] = torch.tensor(p, dtype=torch.long)
            valid[b, width - len(p):] = True
        positions = (valid.long().cumsum(-1) - 1).clamp_(min=0)
        return cls(ids.to(device), valid.to(device), positions.to(device))


class StockDecoder:
    """The model's own forward with a ``DynamicCache``; works for any causal LM (no prefix reuse)."""

    prefix_cache: PrefixCache | None = None  # never used: every prompt is prefilled whole

    def __init__(self, model):
        self.model = model
        self.computed_tokens = 0

    @torch.no_grad()
    def prefill(self, prompts: list[list[int]], max_new_tokens: int) -> Tensor:
        dev = self.model.get_input_embeddings().weight.device
        batch = PaddedPrompts.build(prompts, dev)
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        self.computed_tokens = int(batch.valid.sum())
        self.mask = batch.valid.long()
        self.next_pos = batch.positions[:, -1] + 1
        out = self.model(input_ids=batch.ids, attention_mask=self.mask, position_ids=batch.positions,
                         past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1].float()

    @torch.no_grad()
    def step(self, tokens: Tensor) -> Tensor:
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.mask.shape[0], 1)], dim=1)
        out = self.model(input_ids=tokens[:, None], attention_mask=self.mask, position_ids=self.next_pos[:, None],
                         past_key_values=self.cache, use_cache=True)
        self.next_pos = self.next_pos + 1
        return out.logits[:, -1].float()

    @torch.no_grad()
    def keep(self, rows: Tensor) -> None:
        self.cache.reorder_cache(rows)
        self.mask = self.mask[rows]
        self.next_pos = self.next_pos[rows]

    def remember(self, rows: list[int], sequences: list[list[int]]) -> None:
        """No-op: the stock path keeps nothing between calls."""

    def release(self) -> None:
        self.cache = self.mask = self.next_pos = None
