"""Trajectories -> padded micro-batches -> per-token log-probs under the trainer's model.

Scoring is teacher-forced over the exact token ids the sampler produced (tokens are the
source of truth); position t of the returned tensors scores ``token_ids[t]`` given
``token_ids[:t]``; position 0 (never sampled) is 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentrl.algo.grpo import token_logprobs
from agentrl.algo.head_logprobs import head_logprobs
from agentrl.algo.shared_prefix import MIN_SHARED, shared_forward_hidden, shared_forward_logits, shared_prefix_len
from agentrl.types import Trajectory


@dataclass
class MicroBatch:
    """Right-padded rows of whole trajectories. Shapes are [B, T]."""

    indices: list[int]  # positions of these rows in the step's trajectory list
    input_ids: torch.Tensor  # long
    attention_mask: torch.Tensor  # long, 1 on real tokens
    loss_mask: torch.Tensor  # float, 1 on tokens the policy generated
    sampler_logprobs: torch.Tensor  # float, μ per token (0 where mask 0)


def plan_micro_batches(lengths: list[int], max_tokens: int, groups: list[str] | None = None) -> list[list[int]]:
    """Group row indices so that ``rows * longest_row <= max_tokens`` (padding counted).

    Rows are sorted by length first, so rows of similar length share a batch and little
    compute goes to padding. A row longer than ``max_tokens`` gets a batch of its own. With
    ``groups`` (each row's group id) rows are sorted by group, then length, so the attempts
    of a task sit together and share their prompt (``score_tokens(share_prefix=True)``).

    >>> plan_micro_batches([5, 3, 4, 6], 12), plan_micro_batches([5, 3, 4, 6], 12, ["a", "b", "a", "b"])
    ([[1, 2], [0, 3]], [[2, 0], [1, 3]])
    """
    order = sorted(range(len(lengths)), key=lambda i: (groups[i], lengths[i]) if groups else lengths[i])
    batches: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in order:
        new_longest = max(longest, lengths[i])
        if cur and new_longest * (len(cur) + 1) > max_tokens:
            batches.append(cur)
            cur, new_longest = [], lengths[i]
        cur.append(i)
        longest = new_longest
    if cur:
        batches.append(cur)
    return batches


def collate(trajs: list[Trajectory], indices: list[int], pad_id: int, device: str = "cpu") -> MicroBatch:
    rows = [trajs[i] for i in indices]
    T = max(len(t.token_ids) for t in rows)
    B = len(rows)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    att = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.float32)
    mu = torch.zeros((B, T), dtype=torch.float32)
    for r, t in enumerate(rows):
        n = len(t.token_ids)
        ids[r, :n] = torch.tensor(t.token_ids)
        att[r, :n] = 1
        mask[r, :n] = torch.tensor(t.loss_mask, dtype=torch.float32)
        mu[r, :n] = torch.tensor(t.logprobs, dtype=torch.float32)
    return MicroBatch(list(indices), ids.to(device), att.to(device), mask.to(device), mu.to(device))


# Architectures whose logits are exactly ``lm_head(last hidden state)``: no soft-capping,
# scaling or bias, so the fused head (head_logprobs.py) computes what their forward does.
FUSED_HEAD_TYPES = ("llama", "mistral", "qwen2", "qwen3")
FUSED_HEAD_MIN_VOCAB = 32768  # train.fused_head=auto: below this the logits cost little


def fused_head_parts(model) -> tuple[torch.nn.Module, torch.Tensor] | None:
    """(decoder body, LM-head weight [V, H]) of a plain Hugging Face causal LM of
    ``FUSED_HEAD_TYPES`` in one process; None for anything else (a LoRA wrapper, a sharded
    model, another architecture), which is scored with materialized logits."""
    from torch.distributed.tensor import DTensor
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel) or model.config.model_type not in FUSED_HEAD_TYPES:
        return None
    head = model.get_output_embeddings()
    if type(head) is not torch.nn.Linear or head.bias is not None or isinstance(head.weight, DTensor):
        return None
    return model.get_decoder(), head.weight


def score_tokens(model: torch.nn.Module, mb: MicroBatch, temperature: float,
                 autocast: str = "none", share_prefix: bool = False,
                 fused_head: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs and entropies [B, T] of ``mb.input_ids`` under ``model``.

    Logits are divided by the sampling temperature so that π_θ is the distribution the
    sampler drew from (a greedy sampler, T=0, is scored at T=1). Only positions whose next
    token is trained (``loss_mask == 1`` in some row) go through the LM head: prompt, tool
    and template positions never need a vocabulary-sized row. Other positions are 0.

    ``autocast="bf16"`` runs the model's matmuls in bfloat16 (float32 weights, gradients and
    optimizer state stay as they are); the log-softmax is taken in float32 either way. On a
    CPU with AVX-512 BF16 or AMX this about halves the update of a 100M-class model.

    ``share_prefix``: rows that start with the same tokens (the G attempts of a task) run
    that prefix once (:mod:`agentrl.algo.shared_prefix`); same values up to float order.

    ``fused_head``: each row's trained positions alone go through the LM head, in chunks,
    without [B, K, V] logits (:mod:`agentrl.algo.head_logprobs`; where
    :func:`fused_head_parts` finds the head, else materialized). Same values up to float
    order at trained positions; the others are 0.
    """
    parts = fused_head_parts(model) if fused_head else None
    if parts is not None:
        return _score_fused(*parts, mb, temperature, autocast, share_prefix)
    T = mb.input_ids.shape[1]
    # position p predicts token p+1; keep p where any row trains on token p+1
    keep = torch.nonzero(mb.loss_mask[:, 1:].sum(0) > 0).flatten()
    if keep.numel() == 0:
        # still run the model: under FSDP every rank must join the same collectives
        keep = torch.zeros(1, dtype=torch.long, device=mb.input_ids.device)
    prefix = shared_prefix_len(mb.input_ids, mb.attention_mask) if share_prefix else 0
    with torch.autocast(device_type=mb.input_ids.device.type, dtype=torch.bfloat16, enabled=autocast == "bf16"):
        if prefix >= MIN_SHARED:
            logits = shared_forward_logits(model, mb.input_ids, mb.attention_mask, keep, prefix)
        else:
            try:
                out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False,
                            logits_to_keep=keep)
                logits = out.logits
            except TypeError:  # an architecture without logits_to_keep: full head, then select
                out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False)
                logits = out.logits[:, keep, :]
    logits = logits.float()
    lp_k, ent_k = token_logprobs(logits, mb.input_ids[:, keep + 1], temperature if temperature > 0 else 1.0)
    B = mb.input_ids.shape[0]
    lp = torch.zeros((B, T), dtype=lp_k.dtype, device=lp_k.device)
    ent = torch.zeros((B, T), dtype=ent_k.dtype, device=ent_k.device)
    lp = lp.index_copy(1, keep + 1, lp_k)
    ent = ent.index_copy(1, keep + 1, ent_k)
    return lp, ent


def _score_fused(body, weight: torch.Tensor, mb: MicroBatch, temperature: float, autocast: str,
                 share_prefix: bool) -> tuple[torch.Tensor, torch.Tensor]:
    ids, att = mb.input_ids, mb.attention_mask
    prefix = shared_prefix_len(ids, att) if share_prefix else 0
    with torch.autocast(device_type=ids.device.type, dtype=torch.bfloat16, enabled=autocast == "bf16"):
        if prefix >= MIN_SHARED:
            hidden = shared_forward_hidden(body, ids, att, prefix)
        else:
            hidden = body(input_ids=ids, attention_mask=att, use_cache=False).last_hidden_state
    rows, pos = torch.nonzero(mb.loss_mask[:, 1:] > 0, as_tuple=True)  # position pos predicts pos + 1
    lp_n, ent_n = head_logprobs(hidden[rows, pos], weight, ids[rows, pos + 1],
                                temperature if temperature > 0 else 1.0,
                                torch.bfloat16 if autocast == "bf16" else None)
    lp = torch.zeros(ids.shape, dtype=torch.float32, device=ids.device).index_put((rows, pos + 1), lp_n)
    ent = torch.zeros(ids.shape, dtype=torch.float32, device=ids.device).index_put((rows, pos + 1), ent_n)
    return lp, ent
