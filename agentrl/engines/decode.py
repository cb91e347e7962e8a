"""KV-cached forward passes for batched sampling: a fast hand-written one and the stock one.

Both take left-padded prompts of different lengths, return next-token logits for every row,
and let the caller drop finished rows. ``FastDecoder`` re-implements the Qwen2/Llama block
(RMSNorm, rotary embedding, grouped-query attention, SwiGLU MLP) over the model's *own*
parameter tensors (no copies: an optimizer step on the shared model is seen by the next call)
with a preallocated KV cache; on CPU it avoids most of transformers' per-step overhead (mask
building, cache bookkeeping, output dataclasses). ``StockDecoder`` calls the model's forward
with a ``DynamicCache`` and serves every other architecture. ``make_decoder`` picks the fast
one only when it reproduces the stock logits on a probe input.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

FAST_MODEL_TYPES = ("qwen2", "qwen3", "llama")


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
    """The model's own forward with a ``DynamicCache``; works for any causal LM."""

    def __init__(self, model):
        self.model = model

    @torch.no_grad()
    def prefill(self, prompts: list[list[int]], max_new_tokens: int) -> Tensor:
        dev = self.model.get_input_embeddings().weight.device
        batch = PaddedPrompts.build(prompts, dev)
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
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

    def release(self) -> None:
        self.cache = self.mask = self.next_pos = None


@dataclass
class _Layer:
    """Views of one decoder layer's parameters (the model's tensors themselves)."""

    ln1: Tensor
    q_w: Tensor
    q_b: Tensor | None
    k_w: Tensor
    k_b: Tensor | None
    v_w: Tensor
    v_b: Tensor | None
    o_w: Tensor
    o_b: Tensor | None
    ln2: Tensor
    gate_w: Tensor
    up_w: Tensor
    down_w: Tensor
    q_norm: Tensor | None  # Qwen3: RMSNorm over each head's query/key before the rotation
    k_norm: Tensor | None


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """y = w * x / sqrt(mean(x^2) + eps), computed in float32 like transformers."""
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding, half-split layout: x*cos + [-x2, x1]*sin."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class FastDecoder:
    """Hand-written KV-cached forward for Qwen2/Llama-style models (see module docstring).

    The decode step lays the ``n_rep`` query heads that share a KV head along the query-length
    axis, so grouped-query attention is one SDPA call over the cache with no K/V repeat.
    """

    def __init__(self, model):
        self.model = model
        cfg = model.config
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads or cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = cfg.rms_norm_eps

    @staticmethod
    def supports(model) -> bool:
        """Architectures whose block this class reproduces (the probe in make_decoder confirms it)."""
        cfg = getattr(model, "config", None)
        if cfg is None or getattr(cfg, "model_type", None) not in FAST_MODEL_TYPES:
            return False
        rope = (getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {})
        inner = getattr(model, "model", None)
        try:  # plain Linear projections only: an adapter (LoRA) wrapping one changes the math
            linears = [getattr(layer.self_attn, n) for layer in inner.layers for n in ("q_proj", "k_proj", "v_proj",
                       "o_proj")] + [getattr(layer.mlp, n) for layer in inner.layers
                                     for n in ("gate_proj", "up_proj", "down_proj")] + [model.lm_head]
        except AttributeError:
            return False
        return (all(type(m) is torch.nn.Linear for m in linears)
                and getattr(cfg, "hidden_act", None) == "silu"
                and all(t == "full_attention" for t in (getattr(cfg, "layer_types", None) or ["full_attention"]))
                and rope.get("rope_type", "default") not in ("dynamic", "longrope")
                and not getattr(cfg, "mlp_bias", False)
                and hasattr(inner, "rotary_emb"))

    def _layers(self) -> list[_Layer]:
        out = []
        for layer in self.model.model.layers:
            a, m = layer.self_attn, layer.mlp
            out.append(_Layer(layer.input_layernorm.weight, a.q_proj.weight, a.q_proj.bias, a.k_proj.weight,
                              a.k_proj.bias, a.v_proj.weight, a.v_proj.bias, a.o_proj.weight, a.o_proj.bias,
                              layer.post_attention_layernorm.weight, m.gate_proj.weight, m.up_proj.weight,
                              m.down_proj.weight, getattr(getattr(a, "q_norm", None), "weight", None),
                              getattr(getattr(a, "k_norm", None), "weight", None)))
        return out

    def _rope_tables(self, length: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        rot = self.model.model.rotary_emb
        pos = torch.arange(length, device=device, dtype=torch.float32)
        freqs = pos[:, None] * rot.inv_freq.to(device=device, dtype=torch.float32)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return ((emb.cos() * rot.attention_scaling).to(dtype), (emb.sin() * rot.attention_scaling).to(dtype))

    def _head_norm(self, x: Tensor, weight: Tensor | None) -> Tensor:
        return x if weight is None else _rms_norm(x, weight, self.eps)

    def _mlp(self, x: Tensor, p: _Layer) -> Tensor:
        h = _rms_norm(x, p.ln2, self.eps)
        return x + F.linear(F.silu(F.linear(h, p.gate_w)) * F.linear(h, p.up_w), p.down_w)

    @torch.inference_mode()
    def prefill(self, prompts: list[list[int]], max_new_tokens: int) -> Tensor:
        """Run the prompts, fill the cache, return (B, V) float32 logits for the next token.

        Identical prompts (a GRPO group shares one) are computed once and their cache copied.
        """
        embed = self.model.model.embed_tokens.weight
        dev, dtype = embed.device, embed.dtype
        self.layers = self._layers()
        unique: dict[tuple[int, ...], int] = {}
        row_src = [unique.setdefault(tuple(p), len(unique)) for p in prompts]
        batch = PaddedPrompts.build([list(p) for p in unique], dev)
        src = torch.tensor(row_src, device=dev)
        n_rows, width = len(prompts), batch.ids.shape[1]
        self.cos, self.sin = self._rope_tables(width + max_new_tokens, dev, dtype)
        self.k_cache = [torch.empty(n_rows, self.n_kv, width + max_new_tokens, self.head_dim, device=dev,
                                    dtype=dtype) for _ in self.layers]
        self.v_cache = [torch.empty_like(k) for k in self.k_cache]
        self.key_ok = torch.ones(n_rows, width + max_new_tokens, dtype=torch.bool, device=dev)
        self.key_ok[:, :width] = batch.valid[src]
        self.next_pos = batch.positions[src, -1] + 1
        self.t = width

        # Pad queries may attend to themselves so that no softmax row is fully masked (NaN);
        # their outputs are never read, and real queries never see pad keys.
        causal = torch.ones(width, width, dtype=torch.bool, device=dev).tril_()
        mask = (causal[None] & batch.valid[:, None, :]) | torch.eye(width, dtype=torch.bool, device=dev)[None]
        cos, sin = self.cos[batch.positions][:, None], self.sin[batch.positions][:, None]
        x = F.embedding(batch.ids, embed)
        u = x.shape[0]
        for i, p in enumerate(self.layers):
            h = _rms_norm(x, p.ln1, self.eps)
            q = self._head_norm(F.linear(h, p.q_w, p.q_b).view(u, width, self.n_heads, self.head_dim), p.q_norm)
            k = self._head_norm(F.linear(h, p.k_w, p.k_b).view(u, width, self.n_kv, self.head_dim), p.k_norm)
            v = F.linear(h, p.v_w, p.v_b).view(u, width, self.n_kv, self.head_dim).transpose(1, 2)
            q, k = _rotate(q.transpose(1, 2), cos, sin), _rotate(k.transpose(1, 2), cos, sin)
            self.k_cache[i][:, :, :width] = k[src]
            self.v_cache[i][:, :, :width] = v[src]
            rep = self.n_heads // self.n_kv
            attn = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                                  attn_mask=mask[:, None])
            x = x + F.linear(attn.transpose(1, 2).reshape(u, width, -1), p.o_w, p.o_b)
            x = self._mlp(x, p)
        return self._logits(x[:, -1])[src]

    def _logits(self, x: Tensor) -> Tensor:
        h = _rms_norm(x, self.model.model.norm.weight, self.eps)
        head = self.model.lm_head
        return F.linear(h, head.weight, head.bias).float()

    @torch.inference_mode()
    def step(self, tokens: Tensor) -> Tensor:
        """Feed one token per row (B,), return (B, V) float32 next-token logits."""
        b, t = tokens.shape[0], self.t
        rep = self.n_heads // self.n_kv
        cos, sin = self.cos[self.next_pos][:, None, None], self.sin[self.next_pos][:, None, None]
        mask = self.key_ok[:, None, None, : t + 1]
        x = F.embedding(tokens, self.model.model.embed_tokens.weight)
        for i, p in enumerate(self.layers):
            h = _rms_norm(x, p.ln1, self.eps)
            q = self._head_norm(F.linear(h, p.q_w, p.q_b).view(b, self.n_kv, rep, self.head_dim), p.q_norm)
            k = self._head_norm(F.linear(h, p.k_w, p.k_b).view(b, self.n_kv, 1, self.head_dim), p.k_norm)
            v = F.linear(h, p.v_w, p.v_b).view(b, self.n_kv, 1, self.head_dim)
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
            self.k_cache[i][:, :, t: t + 1] = k
            self.v_cache[i][:, :, t: t + 1] = v
            attn = F.scaled_dot_product_attention(q, self.k_cache[i][:, :, : t + 1], self.v_cache[i][:, :, : t + 1],
                                                  attn_mask=mask)
            x = x + F.linear(attn.reshape(b, -1), p.o_w, p.o_b)
            x = self._mlp(x, p)
        self.t += 1
        self.next_pos = self.next_pos + 1
        return self._logits(x)

    @torch.inference_mode()
    def keep(self, rows: Tensor) -> None:
        """Drop finished rows: keep only ``rows`` (indices into the current batch)."""
        self.k_cache = [k[rows] for k in self.k_cache]
        self.v_cache = [v[rows] for v in self.v_cache]
        self.key_ok = self.key_ok[rows]
        self.next_pos = self.next_pos[rows]

    def release(self) -> None:
        """Free the cache (and drop the parameter views) until the next prefill."""
        self.k_cache = self.v_cache = []
        self.layers = []
        self.key_ok = self.next_pos = self.cos = self.sin = None


def max_logit_gap(model, decoder) -> float:
    """Largest |fast - stock| logit over a small ragged probe batch (prefill and two steps)."""
    vocab = model.get_input_embeddings().weight.shape[0]
    prompts = [[(7 * i + 3) % vocab for i in range(n)] for n in (5, 2)]
    follow = [[11 % vocab, 13 % vocab], [17 % vocab, 19 % vocab]]
    stock = StockDecoder(model)
    gap = 0.0
    with torch.no_grad():
        a, b = decoder.prefill(prompts, 2), stock.prefill(prompts, 2)
        gap = max(gap, (a - b).abs().max().item())
        for s in range(2):
            tok = torch.tensor([f[s] for f in follow], device=a.device)
            gap = max(gap, (decoder.step(tok) - stock.step(tok)).abs().max().item())
    decoder.release()
    stock.release()
    return gap


def make_decoder(model, *, tolerance: float = 1e-3):
    """The fast decoder when the model's architecture is supported and its logits match the
    stock forward to ``tolerance`` on a probe; otherwise the stock decoder."""
    if FastDecoder.supports(model):
        fast = FastDecoder(model)
        try:
            if max_logit_gap(model, fast) <= tolerance:
                return fast
        except (AttributeError, RuntimeError, TypeError):  # an unexpected variant of the block
            pass
    return StockDecoder(model)
