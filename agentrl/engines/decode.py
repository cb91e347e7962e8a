"""KV-cached forward passes for batched sampling: a fast hand-written one and the stock one.

Both take left-padded prompts of different lengths, return next-token logits for every row,
and let the caller drop finished rows. ``FastDecoder`` re-implements the Qwen2/Llama block
(RMSNorm, rotary embedding, grouped-query attention, SwiGLU MLP) over the model's *own*
parameter tensors (no copies: an optimizer step on the shared model is seen by the next call;
with ``model.sampler_dtype: bfloat16``, over bfloat16 copies made once per weight version,
``agentrl/engines/sampler_dtype.py``) with a preallocated KV cache; on CPU it avoids most of
transformers' per-step overhead (mask building, cache bookkeeping, output dataclasses).
``StockDecoder`` calls the model's forward with a ``DynamicCache`` and serves every other
architecture. ``make_decoder`` picks the fast
one only when it reproduces the stock logits on a probe input.

``FastDecoder`` can also keep each row's KV after a call (``remember``) in a ``PrefixCache`` and,
at the next prefill, start a prompt that shares a prefix with a kept sequence from that KV: only
the rest of the prompt runs through the model (multi-turn rollouts re-send the whole
conversation every turn). ``StockDecoder`` does not cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from agentrl.engines.prefix_cache import PrefillPlan, PrefixCache
from agentrl.engines.projection import Projection
from agentrl.engines.sampler_dtype import CastWeights
from agentrl.engines.stock_decoder import StockDecoder

FAST_MODEL_TYPES = ("qwen2", "qwen3", "llama")
# Largest prefill attention mask, in elements: 64 MiB in float32. Prefill attention runs on as
# many rows at a time as fit (the mask grows as rows * heads per KV head * window * width).
_MASK_ELEMENTS = 1 << 24


@dataclass
class _Layer:
    """One decoder layer's parameters: the model's own tensors, or the sampler's copies."""

    ln1: Tensor
    qkv: Projection  # -> q (n, n_heads * head_dim), k and v (n, n_kv * head_dim)
    o: Projection
    ln2: Tensor
    gate_up: Projection  # -> gate, up (n, intermediate)
    down: Projection
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

    With a ``prefix_cache``, ``prefill`` starts each prompt from the longest cached prefix and
    ``remember`` stores rows' KV for later calls. The cache holds KV of the weights it was
    computed with: its owner must clear it when they change.
    """

    def __init__(self, model, prefix_cache: PrefixCache | None = None, cast: CastWeights | None = None):
        self.model = model
        self.prefix_cache = prefix_cache
        # the tensors it reads: the model's own, or copies in the sampler's dtype (sampler_dtype.py)
        self.cast = cast if cast is not None else CastWeights(None)
        cfg = model.config
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads or cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = cfg.rms_norm_eps
        self.computed_tokens = 0  # prompt tokens the last prefill ran through the model
        self.copy_s = 0.0  # seconds spent copying the running cache (join, keep)
        self.release()

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
        c = self.cast
        for layer in self.model.model.layers:
            a, m = layer.self_attn, layer.mlp
            qkv = (a.q_proj, a.k_proj, a.v_proj)
            out.append(_Layer(
                c(layer.input_layernorm.weight),
                c.projection([x.weight for x in qkv], [x.bias for x in qkv]),
                c.projection([a.o_proj.weight], [a.o_proj.bias]),
                c(layer.post_attention_layernorm.weight),
                c.projection([m.gate_proj.weight, m.up_proj.weight], [None, None]),
                c.projection([m.down_proj.weight], [None]),
                c(getattr(getattr(a, "q_norm", None), "weight", None)),
                c(getattr(getattr(a, "k_norm", None), "weight", None))))
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
        gate, up = p.gate_up(h)
        return x + p.down(F.silu(gate) * up)[0]

    @torch.inference_mode()
    def prefill(self, prompts: list[list[int]], max_new_tokens: int, *, every_position: bool = False) -> Tensor:
        """Run the prompts, fill the cache, return (B, V) float32 logits for the next token.

        ``every_position`` (one prompt, no prefix cache): the (len, V) logits of every position
        instead, teacher-forced on the weights the decoder samples with (``HFEngine.score``).

        Identical prompts (a GRPO group shares one) are computed once and their cache copied.
        A prompt whose first c tokens match a ``prefix_cache`` entry takes their KV from it and
        runs only the rest. Only real tokens go through the projections and the MLP (packed,
        no padding); attention runs on the padded ``window`` of the last ``max(len - c)``
        slots (prompts are right-aligned in the cache, so every computed token lies there).
        """
        if every_position and (len(prompts) != 1 or self.prefix_cache is not None):
            raise ValueError("every_position scores one prompt, without a prefix cache")
        embed = self.cast(self.model.model.embed_tokens.weight)
        dev, dtype = embed.device, embed.dtype
        self.layers = self._layers()
        self.head = self.cast.projection([self.model.lm_head.weight], [self.model.lm_head.bias])
        plan = PrefillPlan.build(prompts, self.prefix_cache, dev)
        u, n_rows, width, window = len(plan.texts), len(prompts), plan.width, plan.window
        lo = width - window  # first slot that runs through the model
        src = torch.tensor(plan.row_src, device=dev)
        in_window = plan.row_of * window + (plan.slot - lo)  # index into the flattened (u, window) queries
        self.computed_tokens = plan.ids.numel()

        self.cos, self.sin = self._rope_tables(width + max_new_tokens, dev, dtype)
        shape = (len(self.layers), n_rows, self.n_kv, width + max_new_tokens, self.head_dim)
        self.k_all = torch.empty(shape, device=dev, dtype=dtype)
        self.v_all = torch.empty_like(self.k_all)
        self.k_cache, self.v_cache = list(self.k_all.unbind(0)), list(self.v_all.unbind(0))
        valid = torch.arange(width, device=dev)[None, :] >= (width - plan.lengths)[:, None]  # (u, width)
        self.key_ok = torch.ones(n_rows, width + max_new_tokens, dtype=torch.bool, device=dev)
        self.key_ok[:, :width] = valid[src]
        self.next_pos = plan.lengths[src]
        self.start = [width - len(plan.texts[i]) for i in plan.row_src]  # slot of each row's first token
        self.t = width

        # The prompt part of the cache for the unique prompts: restored prefixes, then computed
        # tokens; the rows' own cache when no prompt repeats, else copied to the rows at the end.
        in_place = plan.row_src == list(range(n_rows))
        if in_place:
            uk, uv = self.k_all[:, :, :, :width], self.v_all[:, :, :, :width]
        else:
            uk = torch.empty(len(self.layers), u, self.n_kv, width, self.head_dim, device=dev, dtype=dtype)
            uv = torch.empty_like(uk)
        # Left padding is zeroed: a masked key still meets its value in the product with the
        # (zero) attention weight, and 0 * NaN from stale memory would poison the row.
        pad = width - int(plan.lengths.min())
        uk[:, :, :, :pad].zero_()
        uv[:, :, :, :pad].zero_()
        for b, (p, hit) in enumerate(zip(plan.texts, plan.hits)):
            if hit is not None:
                s = width - len(p)
                uk[:, b, :, s: s + hit.length] = hit.entry.keys[:, :, : hit.length]
                uv[:, b, :, s: s + hit.length] = hit.entry.values[:, :, : hit.length]

        rep = self.n_heads // self.n_kv
        # Attention runs on chunks of rows, so that its mask stays under _MASK_ELEMENTS.
        chunk = max(1, _MASK_ELEMENTS // (rep * window * width))
        row_valid = valid if pad else None
        mask = self._window_mask(row_valid, lo, window, rep, dtype, dev) if chunk >= u else None
        cos, sin = self.cos[plan.pos][:, None], self.sin[plan.pos][:, None]
        x = F.embedding(plan.ids, embed)
        n = plan.ids.numel()
        for i, p in enumerate(self.layers):
            q, k, v = p.qkv(_rms_norm(x, p.ln1, self.eps))
            q = self._head_norm(q.view(n, self.n_heads, self.head_dim), p.q_norm)
            k = self._head_norm(k.view(n, self.n_kv, self.head_dim), p.k_norm)
            v = v.view(n, self.n_kv, self.head_dim)
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
            uk[i].transpose(1, 2)[plan.row_of, plan.slot] = k
            uv[i].transpose(1, 2)[plan.row_of, plan.slot] = v
            # The rep query heads sharing a KV head go along the query axis: no K/V repeat.
            qp = q.new_zeros(u * window, self.n_heads, self.head_dim)
            qp[in_window] = q
            qp = qp.view(u, window, self.n_kv, rep, self.head_dim).permute(0, 2, 3, 1, 4)
            qp = qp.reshape(u, self.n_kv, rep * window, self.head_dim)
            attn = torch.empty_like(qp)
            for a in range(0, u, chunk):
                part = mask if mask is not None else self._window_mask(
                    None if row_valid is None else row_valid[a: a + chunk], lo, window, rep, dtype, dev)
                attn[a: a + chunk] = F.scaled_dot_product_attention(qp[a: a + chunk], uk[i, a: a + chunk],
                                                                    uv[i, a: a + chunk], attn_mask=part)
            attn = attn.view(u, self.n_kv, rep, window, self.head_dim).permute(0, 3, 1, 2, 4)
            x = x + p.o(attn.reshape(u * window, -1)[in_window])[0]
            x = self._mlp(x, p)
        if not in_place:
            self.k_all[:, :, :, :width] = uk[:, src]
            self.v_all[:, :, :, :width] = uv[:, src]
        if every_position:
            return self._logits(x)
        return self._logits(x[plan.ends - 1])[src]

    @staticmethod
    def _window_mask(valid: Tensor | None, lo: int, window: int, rep: int, dtype: torch.dtype,
                     dev: torch.device) -> Tensor:
        """Additive prefill mask (rows or 1, 1, rep * window, width) for queries laid out
        (rep, window slot), window slot ``w`` being cache slot ``lo + w``; ``valid`` (rows, width)
        marks real keys (None: all are). A query sees real keys up to its own slot; a pad query
        may see itself so that no softmax row is fully masked (NaN; pad outputs are never read).
        Additive, since the CPU kernel is faster with one than with a boolean mask."""
        width = lo + window
        q_slot = (torch.arange(rep * window, device=dev) % window + lo)[:, None]
        k_slot = torch.arange(width, device=dev)[None, :]
        allowed = k_slot <= q_slot
        if valid is not None:
            allowed = allowed & valid[:, None, None, :]
        allowed = allowed | (k_slot == q_slot)
        if allowed.dim() == 2:
            allowed = allowed[None, None]
        return torch.zeros(allowed.shape, device=dev, dtype=dtype).masked_fill_(~allowed, float("-inf"))

    def remember(self, rows: list[int], sequences: list[list[int]]) -> None:
        """Keep the KV of batch rows ``rows`` (indices into the current batch) in the prefix
        cache, under ``sequences[j]``: the tokens row ``rows[j]`` has fed so far (its prompt and
        the sampled ids except a last one that was never fed back). No-op without a cache."""
        if self.prefix_cache is None:
            return
        for j, seq in zip(rows, sequences):
            s = self.start[j]
            if s + len(seq) > self.t:
                raise ValueError(f"row {j} has fed {self.t - s} tokens, fewer than the {len(seq)} to remember")
            self.prefix_cache.insert(seq, self.k_all[:, j, :, s: s + len(seq)], self.v_all[:, j, :, s: s + len(seq)])

    def _logits(self, x: Tensor) -> Tensor:
        h = _rms_norm(x, self.cast(self.model.model.norm.weight), self.eps)
        return self.head(h)[0].float()

    @torch.inference_mode()
    def step(self, tokens: Tensor) -> Tensor:
        """Feed one token per row (B,), return (B, V) float32 next-token logits."""
        b, t = tokens.shape[0], self.t
        rep = self.n_heads // self.n_kv
        cos, sin = self.cos[self.next_pos][:, None, None], self.sin[self.next_pos][:, None, None]
        # additive, made once a step: SDPA would convert a boolean mask in every layer (the same
        # -inf entries; the outputs are bit-identical)
        mask = torch.zeros(b, 1, 1, t + 1, dtype=self.k_all.dtype, device=tokens.device).masked_fill_(
            ~self.key_ok[:, None, None, : t + 1], float("-inf"))
        x = F.embedding(tokens, self.cast(self.model.model.embed_tokens.weight))
        for i, p in enumerate(self.layers):
            q, k, v = p.qkv(_rms_norm(x, p.ln1, self.eps))
            q = self._head_norm(q.view(b, self.n_kv, rep, self.head_dim), p.q_norm)
            k = self._head_norm(k.view(b, self.n_kv, 1, self.head_dim), p.k_norm)
            v = v.view(b, self.n_kv, 1, self.head_dim)
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
            self.k_cache[i][:, :, t: t + 1] = k
            self.v_cache[i][:, :, t: t + 1] = v
            attn = F.scaled_dot_product_attention(q, self.k_cache[i][:, :, : t + 1], self.v_cache[i][:, :, : t + 1],
                                                  attn_mask=mask)
            x = x + p.o(attn.reshape(b, -1))[0]
            x = self._mlp(x, p)
        self.t += 1
        self.next_pos = self.next_pos + 1
        return self._logits(x)

    @torch.inference_mode()
    def keep(self, rows: Tensor) -> None:
        """Drop finished rows: keep only ``rows`` (indices into the current batch). Slots left
        of every kept row's first token go too (rows that joined late sit right of them)."""
        began = time.perf_counter()
        starts = [self.start[j] for j in rows.tolist()]
        lo = min(starts, default=0)
        self.k_all, self.v_all = self.k_all[:, rows, :, lo:], self.v_all[:, rows, :, lo:]
        self.copy_s += time.perf_counter() - began
        self.k_cache, self.v_cache = list(self.k_all.unbind(0)), list(self.v_all.unbind(0))
        self.key_ok = self.key_ok[rows, lo:]
        self.next_pos = self.next_pos[rows]
        self.start = [s - lo for s in starts]
        self.t -= lo  # positions are per row (next_pos), so the rope tables stay valid

    @torch.inference_mode()
    def join(self, prompts: list[list[int]], max_new_tokens: int) -> Tensor:
        """Add rows to the running batch (continuous batching): prefill ``prompts`` (prefix
        cache and de-duplication as in ``prefill``), then lay the two batches side by side,
        both right-aligned at the later of their current slots. The running rows keep their
        indices, the new ones follow; returns the new rows' (len(prompts), V) logits.

        Every row keeps its own positions, and a slot it never wrote is masked (and zeroed,
        since 0 x stale NaN would poison the row), so a row's logits do not depend on which
        rows share its batch beyond float summation order."""
        if self.k_all is None:
            return self.prefill(prompts, max_new_tokens)
        old = (self.k_all, self.v_all, self.key_ok, self.next_pos, self.start, self.t)
        logits = self.prefill(prompts, max_new_tokens)
        new = (self.k_all, self.v_all, self.key_ok, self.next_pos, self.start, self.t)
        began = time.perf_counter()
        t = max(old[5], new[5])
        room = max(old[0].shape[3] - old[5], new[0].shape[3] - new[5])  # slots the rows may still write
        n_old, n_new = old[0].shape[1], new[0].shape[1]
        shape = list(old[0].shape)
        shape[1], shape[3] = n_old + n_new, t + room
        self.k_all = torch.empty(shape, device=old[0].device, dtype=old[0].dtype)
        self.v_all = torch.empty_like(self.k_all)
        self.key_ok = torch.ones(shape[1], t + room, dtype=torch.bool, device=old[0].device)
        starts = []
        for (k, v, ok, _, start, t_part), rows in ((old, slice(0, n_old)), (new, slice(n_old, None))):
            shift = t - t_part
            self.k_all[:, rows, :, :shift] = 0
            self.v_all[:, rows, :, :shift] = 0
            self.key_ok[rows, :shift] = False
            self.k_all[:, rows, :, shift:t] = k[:, :, :, :t_part]
            self.v_all[:, rows, :, shift:t] = v[:, :, :, :t_part]
            self.key_ok[rows, shift:t] = ok[:, :t_part]
            starts += [s + shift for s in start]
        self.k_cache, self.v_cache = list(self.k_all.unbind(0)), list(self.v_all.unbind(0))
        self.next_pos = torch.cat([old[3], new[3]])
        self.start, self.t = starts, t
        self.cos, self.sin = self._rope_tables(t + room, self.k_all.device, self.k_all.dtype)
        self.copy_s += time.perf_counter() - began
        return logits

    def release(self) -> None:
        """Free this call's cache (and drop the parameter views) until the next prefill; the
        prefix cache keeps what ``remember`` stored."""
        self.k_cache = self.v_cache = []
        self.layers = []
        self.head = None
        self.start = []
        self.k_all = self.v_all = self.key_ok = self.next_pos = self.cos = self.sin = None


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


def make_decoder(model, *, tolerance: float = 1e-3, prefix_cache: PrefixCache | None = None,
                 cast: CastWeights | None = None):
    """The fast decoder when the model's architecture is supported and its logits match the
    stock forward to ``tolerance`` on a probe; otherwise the stock decoder. ``prefix_cache``
    and ``cast`` (the sampler's dtype) go to the fast decoder after the probe, which runs on
    the model's own tensors and must not read or fill the cache."""
    if FastDecoder.supports(model):
        fast = FastDecoder(model)
        try:
            if max_logit_gap(model, fast) <= tolerance:
                fast.prefix_cache = prefix_cache
                if cast is not None:
                    fast.cast = cast
                return fast
        except (AttributeError, RuntimeError, TypeError):  # an unexpected variant of the block
            pass
    return StockDecoder(model)
