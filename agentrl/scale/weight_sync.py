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

With asynchronous rollouts (``train.max_staleness > 0``, docs/async.md) the sampler generates
while the trainer updates, so it reads neither the trainer's tensors nor a copy the trainer
writes to: ``WeightSlots`` keeps two copies and hands the sampler the newest complete one.
"""

from __future__ import annotations

import threading
import time
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


@torch.no_grad()
def copy_weights(model: nn.Module, dst: nn.Module) -> int:
    """Copy the full (LoRA-merged, FSDP-gathered) parameters of ``model`` into the plain ``dst``.

    Every parameter of ``dst`` must be written once; returns how many were.

    >>> src, dst = nn.Linear(2, 1), nn.Linear(2, 1)
    >>> copy_weights(src, dst), torch.equal(src.weight, dst.weight)
    (2, True)
    """
    params = dict(dst.named_parameters())
    copied = 0
    for name, t in export_weights(model):
        if name not in params:
            raise KeyError(f"the sampler copy has no parameter '{name}' (did the policy's structure change?)")
        params[name].copy_(t)
        copied += 1
    if copied != len(params):
        raise RuntimeError(f"weight sync copied {copied} of the sampler's {len(params)} parameters")
    return copied


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

    ``engine`` is an :class:`agentrl.engines.base.Engine` (not imported here: scale/ and
    engines/ are one layer).
    """

    def __init__(self, engine, sampler: nn.Module | None = None, *, shared: bool = True):
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
        copy_weights(model, self.sampler)
        self.engine.sync_weights(self.sampler)


class WeightSlots:
    """Two full-weight copies of the policy, for a sampler that runs while the trainer updates.

    The sampler generates from one slot (the one it ``acquire``-d last) while ``publish`` writes
    the trainer's new weights into the other, so the tensors a generation reads never change
    under it. A lock is held only for the copy (``publish``) and for the swap (``acquire``): the
    sampler waits at most one copy for new weights, the trainer at most one swap. Neither slot
    shares storage with the trainer's parameters.

    >>> policy = nn.Linear(2, 1)
    >>> slots = WeightSlots(nn.Linear(2, 1), nn.Linear(2, 1), policy, version=0)
    >>> sampler, v = slots.acquire()            # the sampler takes version 0
    >>> with torch.no_grad():
    ...     _ = policy.weight.add_(1.0)         # an optimizer step
    >>> _ = slots.publish(policy, version=1)    # written into the other slot
    >>> new, v = slots.acquire()
    >>> v, new is not sampler, torch.equal(new.weight, policy.weight)
    (1, True, True)
    """

    def __init__(self, first: nn.Module, second: nn.Module, model: nn.Module, *, version: int):
        if first is second:
            raise ValueError("WeightSlots needs two distinct modules: the sampler reads one while the other is "
                             "written")
        self._slots = [first.requires_grad_(False).eval(), second.requires_grad_(False).eval()]
        self._lock = threading.Lock()
        for slot in self._slots:
            copy_weights(model, slot)
        self._versions = [version, version]
        self._latest = 0  # the newest complete copy
        self._in_use = 0  # the slot the sampler reads; publish never writes it

    @property
    def version(self) -> int:
        """The policy version of the newest published weights."""
        return self._versions[self._latest]

    @property
    def slots(self) -> tuple[nn.Module, nn.Module]:
        return self._slots[0], self._slots[1]

    def publish(self, model: nn.Module, version: int) -> float:
        """Copy ``model``'s weights into the slot the sampler is not reading; returns seconds taken."""
        t0 = time.perf_counter()
        with self._lock:
            target = 1 - self._in_use
            copy_weights(model, self._slots[target])
            self._versions[target] = version
            self._latest = target
        return time.perf_counter() - t0

    def acquire(self) -> tuple[nn.Module, int]:
        """The newest weights and their version; that slot is the sampler's until the next call."""
        with self._lock:
            self._in_use = self._latest
            return self._slots[self._in_use], self._versions[self._in_use]
