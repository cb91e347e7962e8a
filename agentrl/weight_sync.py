"""Trainer -> sampler weight sync when the sampler cannot read the trainer's tensors directly.

A single-process run shares one model between trainer and HF engine (a sync is a version bump).
Under FSDP each rank holds only a shard of every parameter, and the HF engine's decoder reads
full tensors, so each rank's engine samples from its own full-weight copy of the model; after
every optimizer step ``WeightSync`` streams the full parameters into that copy, one tensor at a
time (an all-gather per tensor, so the peak extra memory is one parameter). With LoRA the
adapters are merged on the fly (``W + (alpha / r) B A``) and the names are the base model's, so
the same stream feeds a plain HF copy or vLLM (which knows nothing about peft).

Example (one process, LoRA policy, plain sampler copy)::

    sync = WeightSync(engine, sampler=plain_copy, shared=False)
    sync(peft_policy)            # plain_copy now computes what peft_policy computes
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor, nn


def _full(t: Tensor) -> Tensor:
    from torch.distributed.tensor import DTensor

    t = t.detach()
    return t.full_tensor() if isinstance(t, DTensor) else t


def _lora_linear_cls():
    try:
        from peft.tuners.lora import Linear
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:
        return None, None
    return Linear, BaseTunerLayer


def _merged_lora(module, prefix: str) -> Iterator[tuple[str, Tensor]]:
    base = module.base_layer
    w = _full(base.weight)
    for name in module.active_adapters:
        if name not in module.lora_A:
            continue
        if module.use_dora.get(name, False):
            raise NotImplementedError("weight export of DoRA adapters is not supported; use plain LoRA")
        a = _full(module.lora_A[name].weight).to(torch.float32)
        b = _full(module.lora_B[name].weight).to(torch.float32)
        delta = (b @ a) * module.scaling[name]
        w = w + (delta.T if module.fan_in_fan_out else delta).to(w.dtype)
    yield prefix + "weight", w
    if getattr(base, "bias", None) is not None:
        yield prefix + "bias", _full(base.bias)


def export_weights(model: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """Full, LoRA-merged parameters of ``model`` under the base model's names, one at a time.

    Under FSDP every rank must consume the whole stream (each tensor is an all-gather). Tied
    parameters appear once (under their first name, as ``named_parameters`` gives them).

    >>> lin = nn.Linear(2, 1)
    >>> [n for n, _ in export_weights(lin)]
    ['weight', 'bias']
    """
    root = model.get_base_model() if hasattr(model, "get_base_model") else model
    lora_linear, tuner_layer = _lora_linear_cls()
    seen: set[int] = set()

    def walk(module: nn.Module, prefix: str) -> Iterator[tuple[str, Tensor]]:
        if tuner_layer is not None and isinstance(module, tuner_layer):
            if not isinstance(module, lora_linear):
                raise NotImplementedError(f"cannot merge adapter layer {type(module).__name__} at '{prefix}': "
                                          "only LoRA on Linear layers is exported (check lora.target_modules)")
            yield from _merged_lora(module, prefix)
            return
        for name, p in module.named_parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                yield prefix + name, _full(p)
        for name, child in module.named_children():
            yield from walk(child, f"{prefix}{name}.")

    yield from walk(root, "")


class NamedWeights:
    """A stream of ``(name, tensor)`` dressed as a module for engines whose ``sync_weights``
    reads ``model.named_parameters()`` (e.g. vLLM). Consumable once."""

    def __init__(self, weights: Iterator[tuple[str, Tensor]]):
        self._weights = weights

    def named_parameters(self, *args, **kwargs) -> Iterator[tuple[str, Tensor]]:
        return self._weights


class WeightSync:
    """After each optimizer step: make the engine sample from the trainer's current weights.

    ``shared``: the engine reads the trainer's own tensors (single process, HF engine), so
    ``engine.sync_weights(model)`` is all. Otherwise with ``sampler`` (the HF engine's private
    full copy) the weights are copied into it; without one (vLLM) they are streamed into
    ``engine.sync_weights``. Under FSDP every rank must call this at the same point.
    """

    def __init__(self, engine, sampler: nn.Module | None = None, *, shared: bool = True):
        if not shared and sampler is None and not hasattr(engine, "sync_weights"):
            raise TypeError("the engine has no sync_weights(model)")
        self.engine = engine
        self.sampler = sampler
        self.shared = shared

    @torch.no_grad()
    def __call__(self, model: nn.Module) -> None:
        if self.shared:
            self.engine.sync_weights(model)
            return
        if self.sampler is None:
            self.engine.sync_weights(NamedWeights(export_weights(model)))
            return
        params = dict(self.sampler.named_parameters())
        copied = 0
        for name, t in export_weights(model):
            if name not in params:
                raise KeyError(f"the sampler copy has no parameter '{name}' (did the policy's structure change?)")
            params[name].copy_(t)
            copied += 1
        if copied != len(params):
            raise RuntimeError(f"weight sync copied {copied} of the sampler's {len(params)} parameters")
        self.engine.sync_weights(self.sampler)
