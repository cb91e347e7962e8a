"""Per-sequence KV caches kept between generate calls, found again by longest common prefix,
and the plan of what a prefill then still has to compute.

A multi-turn rollout calls the engine once per turn with each row's whole conversation so
far: the previous prompt, the ids it sampled, then template/tool ids. Keys and values at
position ``i`` of a causal LM depend only on tokens ``0..i`` (and the weights), so the KV
computed for an earlier sequence is exact for every prompt sharing a prefix with it; only the
rest of the prompt needs a forward pass.

Entries are found through chained hashes of fixed-size token blocks (the lookup walks the
prompt's blocks while some entry shares them, then extends token by token inside the next
block), verified by comparing the tokens themselves, so a hash collision can cost a hit but
never exactness. Memory is bounded by the total number of cached tokens, least recently used
first out. Cached KV is only valid for the weights that computed it: the owner clears the
cache whenever the weights may have changed.

>>> import torch
>>> cache = PrefixCache(max_tokens=1000, block=4)
>>> kv = torch.zeros(2, 1, 10, 8)          # (layers, kv heads, tokens, head dim)
>>> cache.insert(list(range(10)), kv, kv)
>>> hit = cache.lookup(list(range(7)) + [99, 98])
>>> hit.length, hit.entry.keys.shape[2]
(7, 10)
>>> cache.lookup(list(range(10))).length   # the last prompt token is always recomputed
9
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import islice
from typing import Sequence

import torch
from torch import Tensor

DEFAULT_BLOCK = 16
# Candidates compared token by token past the last shared block; more only find a few extra
# tokens of an already long match.
_MAX_CANDIDATES = 8


@dataclass
class CachedPrefix:
    """The KV of one token sequence: ``keys[..., i, :]`` belongs to ``tokens[i]``."""

    tokens: tuple[int, ...]
    keys: Tensor  # (layers, kv_heads, len(tokens), head_dim)
    values: Tensor
    block_hashes: list[int] = field(default_factory=list)


@dataclass
class PrefixHit:
    """A prompt's first ``length`` tokens equal ``entry.tokens[:length]``."""

    entry: CachedPrefix
    length: int


def block_hashes(tokens: Sequence[int], block: int) -> list[int]:
    """Chained hashes h_k = hash((h_{k-1}, tokens[(k-1)B : kB])), h_0 = 0, for every full block.

    >>> block_hashes([1, 2, 3, 4, 5], 2) == block_hashes([1, 2, 3, 4, 9], 2)
    True
    >>> len(block_hashes([1, 2, 3], 2))
    1
    """
    out, h = [], 0
    for start in range(0, len(tokens) - block + 1, block):
        h = hash((h, tuple(tokens[start:start + block])))
        out.append(h)
    return out


def _common_length(a: tuple[int, ...], b: tuple[int, ...], start: int) -> int:
    """Length of the common prefix of a and b, given that the first ``start`` tokens agree."""
    limit = min(len(a), len(b))
    n = start
    while n < limit and a[n] == b[n]:
        n += 1
    return n


class PrefixCache:
    """An LRU of ``CachedPrefix`` entries holding at most ``max_tokens`` tokens in all.

    Sequences shorter than one block are not kept (too little to save). Inserting a sequence
    drops the entry it extends (a turn's KV supersedes the previous turn's).
    """

    def __init__(self, max_tokens: int, *, block: int = DEFAULT_BLOCK):
        if max_tokens < 0 or block < 1:
            raise ValueError(f"PrefixCache(max_tokens={max_tokens}, block={block}): need max_tokens >= 0, block >= 1")
        self.max_tokens = max_tokens
        self.block = block
        self.tokens = 0  # cached tokens, all entries together
        self._entries: OrderedDict[tuple[int, ...], CachedPrefix] = OrderedDict()
        self._index: dict[int, dict[tuple[int, ...], None]] = {}  # block hash -> entries holding it

    def __len__(self) -> int:
        return len(self._entries)

    def nbytes(self) -> int:
        """Bytes the cached keys and values hold, all entries together (an entry that is a view
        into a larger tensor holds all of that tensor; a storage shared by entries counts once)."""
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                    for e in self._entries.values() for t in (e.keys, e.values)}
        return sum(storages.values())

    def clear(self) -> None:
        self._entries.clear()
        self._index.clear()
        self.tokens = 0

    def _longest(self, seq: tuple[int, ...], hashes: list[int] | None = None) -> tuple[tuple[int, ...] | None, int]:
        """(key of the entry sharing the longest prefix with seq, that length); (None, 0) if none
        shares a whole block. ``hashes``: seq's block hashes, when already known."""
        matched, shared = 0, 0
        for h in block_hashes(seq, self.block) if hashes is None else hashes:
            if h not in self._index:
                break
            matched, shared = h, shared + self.block
        if not shared:
            return None, 0
        best, best_len = None, 0
        for key in islice(reversed(self._index[matched]), _MAX_CANDIDATES):
            if key[:shared] != seq[:shared]:  # a hash collision: never trust it
                continue
            n = _common_length(key, seq, shared)
            if n > best_len:
                best, best_len = key, n
        return best, best_len

    def lookup(self, prompt: Sequence[int]) -> PrefixHit | None:
        """The entry sharing the longest prefix with ``prompt``, capped at ``len(prompt) - 1``
        tokens (the last prompt token must run to give the next-token logits)."""
        key, n = self._longest(tuple(prompt))
        n = min(n, len(prompt) - 1)
        if key is None or n <= 0:
            return None
        self._entries.move_to_end(key)
        return PrefixHit(self._entries[key], n)

    def insert(self, tokens: Sequence[int], keys: Tensor, values: Tensor) -> None:
        """Keep a copy of ``keys``/``values`` (layers, kv_heads, len(tokens), head_dim) for ``tokens``."""
        seq = tuple(tokens)
        if keys.shape[2] != len(seq) or values.shape[2] != len(seq):
            raise ValueError(f"KV for {keys.shape[2]} tokens given with {len(seq)} token ids")
        if len(seq) < self.block or len(seq) > self.max_tokens:
            return
        if seq in self._entries:
            self._entries.move_to_end(seq)
            return
        hashes = block_hashes(seq, self.block)
        covered, n = self._longest(seq, hashes)
        if covered is not None and n == len(covered):  # the new entry holds all of its KV
            self._remove(covered)
        own = torch.contiguous_format  # a copy, compact even when given a strided view of a batch cache
        entry = CachedPrefix(seq, keys.clone(memory_format=own), values.clone(memory_format=own), hashes)
        self._entries[seq] = entry
        for h in entry.block_hashes:
            self._index.setdefault(h, {})[seq] = None
        self.tokens += len(seq)
        while self.tokens > self.max_tokens:
            self._remove(next(iter(self._entries)))

    def _remove(self, key: tuple[int, ...]) -> None:
        entry = self._entries.pop(key)
        self.tokens -= len(key)
        for h in entry.block_hashes:
            holders = self._index.get(h)
            if holders is not None:
                holders.pop(key, None)
                if not holders:
                    del self._index[h]


@dataclass
class PrefillPlan:
    """Which prompt tokens a prefill runs once cached prefixes are reused.

    Identical prompts are computed once: ``texts`` are the distinct prompts, ``row_src[r]`` is
    the one of row r. They are right-aligned in a cache of ``width`` slots (prompt u starts at
    slot ``width - lengths[u]``); prompt u takes its first ``reused[u]`` tokens' KV from
    ``hits[u]`` and computes the rest, all of which lie in the last ``window`` slots. The
    computed tokens are packed, prompt after prompt: token t is ``ids[t]``, of prompt
    ``row_of[t]``, in slot ``slot[t]``, at rotary position ``pos[t]``; ``ends[u]`` is one past
    prompt u's last one.

    >>> plan = PrefillPlan.build([[5, 6, 7], [5, 6, 7], [8, 9]], None, torch.device("cpu"))
    >>> plan.row_src, plan.width, plan.window, plan.slot.tolist(), plan.pos.tolist()
    ([0, 0, 1], 3, 3, [0, 1, 2, 1, 2], [0, 1, 2, 0, 1])
    """

    texts: list[tuple[int, ...]]
    row_src: list[int]
    hits: list[PrefixHit | None]
    reused: list[int]
    lengths: Tensor  # (U,) prompt lengths
    width: int
    window: int
    ids: Tensor  # (N,) the computed tokens
    row_of: Tensor  # (N,)
    slot: Tensor  # (N,)
    pos: Tensor  # (N,)
    ends: Tensor  # (U,)

    @classmethod
    def build(cls, prompts: list[list[int]], cache: PrefixCache | None, device: torch.device) -> "PrefillPlan":
        unique: dict[tuple[int, ...], int] = {}
        row_src = [unique.setdefault(tuple(p), len(unique)) for p in prompts]
        texts = list(unique)
        hits = [cache.lookup(p) for p in texts] if cache is not None else [None] * len(texts)
        reused = [h.length if h is not None else 0 for h in hits]
        lengths = torch.tensor([len(p) for p in texts], device=device)
        fresh = torch.tensor([len(p) - c for p, c in zip(texts, reused)], device=device)
        width = int(lengths.max())
        row_of = torch.arange(len(texts), device=device).repeat_interleave(fresh)
        ends = fresh.cumsum(0)
        j = torch.arange(int(ends[-1]), device=device) - (ends - fresh)[row_of]  # index among the computed
        ids = torch.tensor([t for p, c in zip(texts, reused) for t in p[c:]], dtype=torch.long, device=device)
        return cls(texts, row_src, hits, reused, lengths, width, int(fresh.max()), ids, row_of,
                   width - fresh[row_of] + j, (lengths - fresh)[row_of] + j, ends)
