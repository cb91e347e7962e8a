"""The weights the fast decoder samples with, in a narrower dtype than the trainer's.

``model.sampler_dtype: bfloat16`` makes the HF engine's fast decoder read a bfloat16 copy of
the policy's float32 parameters, and keep its KV cache (and the prefix cache) in bfloat16: on a
CPU with AVX-512 BF16 the decode step's matrix products run 3.3-3.9x faster at the batch sizes
of a rollout (the whole SmolLM2 step 1.9-2.5x, benchmarks/README.md), and each decode step
reads half the bytes. The trainer keeps float32 weights and its own π_old, so the sampler's
log-probs μ differ from π_old by the rounding (a GPU run with bf16 vLLM and a float32 trainer
has the same gap); the truncated importance weight (``algo.is_level``) and the mismatch alarm
see it. The copy is made once per weight version: a
parameter's storage and version counter say when it changed (an optimizer step moves it), and
the next prefill re-casts.

>>> import torch
>>> w = torch.nn.Linear(2, 2).weight
>>> cast = CastWeights(torch.bfloat16)
>>> cast(w).dtype, cast(w) is cast(w)
(torch.bfloat16, True)
>>> with torch.no_grad():
...     _ = w.add_(1.0)  # an optimizer step: the next lookup re-casts
>>> bool(torch.equal(cast(w).float(), w.detach().bfloat16().float()))
True
"""

from __future__ import annotations

import torch
from torch import Tensor

from agentrl.engines.projection import Projection

SAMPLER_DTYPES = {"float32": None, "bfloat16": torch.bfloat16}  # None: the model's own tensors


class CastWeights:
    """``cast(t)``: ``t`` itself when no dtype is set (or it has it), else a cached copy in
    ``dtype`` that is made again when ``t`` was modified in place or replaced."""

    def __init__(self, dtype: torch.dtype | None):
        self.dtype = dtype
        # storage pointer -> (version counter when cast, the copy)
        self._copies: dict[int, tuple[int, Tensor]] = {}
        # the parts' storage pointers -> (their versions and shapes when cast, the projection)
        self._projections: dict[tuple[int, ...], tuple[tuple, Projection]] = {}

    def __call__(self, t: Tensor | None) -> Tensor | None:
        if t is None or self.dtype is None or t.dtype == self.dtype or not t.is_floating_point():
            return t
        key = t.data_ptr()
        hit = self._copies.get(key)
        if hit is not None and hit[0] == t._version and hit[1].shape == t.shape:
            return hit[1]
        with torch.no_grad():
            copy = t.detach().to(self.dtype)
        self._copies[key] = (t._version, copy)
        return copy

    def projection(self, weights: list[Tensor], biases: list[Tensor | None]) -> Projection:
        """The parts of one projection as the decoder applies them (``projection.py``): the
        tensors themselves when no dtype is set; else one matrix in ``dtype`` (packed for
        oneDNN where it runs), made again when any part was modified in place or replaced."""
        if self.dtype is None:
            return Projection.of(weights, biases, None)
        parts = [t for t in list(weights) + list(biases) if t is not None]
        key = tuple(t.data_ptr() for t in parts)
        versions = tuple((t._version, tuple(t.shape)) for t in parts)
        hit = self._projections.get(key)
        if hit is not None and hit[0] == versions:
            return hit[1]
        proj = Projection.of(weights, biases, self.dtype)
        self._projections[key] = (versions, proj)
        return proj

    def nbytes(self) -> int:
        """Bytes of the copies held (the run's memory accounting)."""
        return (sum(c.untyped_storage().nbytes() for _, c in self._copies.values())
                + sum(p.nbytes() for _, p in self._projections.values()))

    def clear(self) -> None:
        self._copies.clear()
        self._projections.clear()


def sampler_dtype(name: str) -> torch.dtype | None:
    """The dtype of ``model.sampler_dtype`` (None: sample with the model's own tensors)."""
    if name not in SAMPLER_DTYPES:
        from agentrl.types import ConfigError

        raise ConfigError(f"model.sampler_dtype: {name!r} is not one of {list(SAMPLER_DTYPES)}")
    return SAMPLER_DTYPES[name]
