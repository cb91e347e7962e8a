"""The decoder's linear layers: y_i = x W_i^T + b_i for the parts i of one projection.

With the model's own float32 tensors (``model.sampler_dtype: float32``), each part is its own
``F.linear`` over the parameter itself, so an optimizer step is seen with nothing copied. With
sampler copies (``bfloat16``), the parts that read the same input (a layer's q, k and v; gate
and up) are one matrix ``W = [W_1; W_2; ...]``, so a layer runs 4 matrix products instead of
7, on larger shapes. On a CPU where oneDNN runs bfloat16, that matrix is also packed once per
weight version into oneDNN's blocked layout (``torch.ops.mkldnn._reorder_linear_weight``):
``F.linear`` on a plain bfloat16 matrix reorders it into that layout at every call, which on a
decode step costs more than the product. The packed product is bit-identical to ``F.linear``
on the same matrix (checked by ``packing_works`` before it is used, and in the tests); on
SmolLM2's decode shapes it is 1.2-2.4x faster (benchmarks/README.md, the roofline on Intel AMX).

>>> import torch
>>> w = torch.randn(4, 3)
>>> proj = Projection.of([w[:1], w[1:]], [None, None], None)  # float32: the tensors themselves
>>> [tuple(y.shape) for y in proj(torch.randn(2, 3))]
[(2, 1), (2, 3)]
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

# the batch size oneDNN picks the packed layout for: a decode step's rows (it serves any M; hints
# of 64 to 4096 timed the same on SmolLM2's gate/up matrix at 48 and at 1,600 rows)
PACK_ROWS_HINT = 64


@functools.lru_cache(maxsize=None)
def packing_works(dtype: torch.dtype) -> bool:
    """Whether this build and CPU run oneDNN's packed ``dtype`` linear, and it gives exactly
    what ``F.linear`` gives on a probe (else the plain product is used)."""
    if dtype != torch.bfloat16 or not torch.backends.mkldnn.is_available():
        return False
    try:
        if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return False
        gen = torch.Generator().manual_seed(0)
        w = torch.randn(40, 24, generator=gen).to(dtype)
        b = torch.randn(40, generator=gen).to(dtype)
        x = torch.randn(5, 24, generator=gen).to(dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS_HINT)
        got = torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], "")
        return bool(torch.equal(got, F.linear(x, w, b)))
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


@dataclass
class Projection:
    """``proj(x)``: the list of each part's output for ``x`` (n, in).

    ``weights`` is either the parts themselves (out_i, in), applied one by one, or a single
    matrix (sum out_i, in) holding them all, plain or packed (``packed``), whose output is
    split into ``sizes``."""

    weights: list[Tensor]
    biases: list[Tensor | None]  # one per entry of ``weights``
    sizes: list[int]  # out_i of each part
    packed: bool = False

    @classmethod
    def of(cls, weights: list[Tensor], biases: list[Tensor | None], dtype: torch.dtype | None) -> "Projection":
        """The parts as they are (``dtype`` None), else one matrix in ``dtype``, packed where
        ``packing_works``; a part without a bias among parts with one gets zeros (adding 0 is exact)."""
        sizes = [w.shape[0] for w in weights]
        if dtype is None:
            return cls(list(weights), list(biases), sizes)
        with torch.no_grad():
            w = torch.cat([w.detach().to(dtype) for w in weights])
            b = None if all(b is None for b in biases) else torch.cat(
                [w_.new_zeros(w_.shape[0], dtype=dtype) if b is None else b.detach().to(dtype)
                 for w_, b in zip(weights, biases)])
        if w.device.type == "cpu" and packing_works(dtype):
            return cls([torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS_HINT)], [b], sizes, packed=True)
        return cls([w], [b], sizes)

    def __call__(self, x: Tensor) -> list[Tensor]:
        if len(self.weights) > 1:
            return [F.linear(x, w, b) for w, b in zip(self.weights, self.biases)]
        w, b = self.weights[0], self.biases[0]
        if self.packed:
            y = torch.ops.mkldnn._linear_pointwise(x.contiguous(), w, b, "none", [], "")
        else:
            y = F.linear(x, w, b)
        return list(y.split(self.sizes, dim=-1)) if len(self.sizes) > 1 else [y]

    def nbytes(self) -> int:
        """Bytes held (a packed matrix is opaque: counted as its elements)."""
        tensors = [t for t in self.weights + self.biases if t is not None]
        return sum(t.numel() * t.element_size() if t.is_mkldnn else t.untyped_storage().nbytes() for t in tensors)
