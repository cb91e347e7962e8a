"""The trainer process's resident memory: its peak per phase, and what holds it.

Each step's metrics carry ``memory/peak_gb`` (the step's peak resident set), the peak of each
phase (``memory/peak_rollout_gb``, ``memory/peak_update_gb``, ``memory/peak_eval_gb``) and the
bytes of what the run holds between phases, from the tensors themselves:

- ``memory/weights_gb``: the policy's parameters (the sampler shares them on one process);
- ``memory/grads_gb``: their ``.grad`` tensors that are kept between steps;
- ``memory/optimizer_gb``: the optimizer's state (AdamW: two float32 moments per parameter);
- ``memory/frozen_gb``: a reference or teacher model, a sampler's own copy of the weights;
- ``memory/prefix_cache_gb``: the engine's cached KV between turns (``PrefixCache``);
- ``memory/rest_gb``: the resident set minus all of these: activations and logits not yet
  returned, the allocator's free lists, Python, and the libraries' code.

After a phase that grew the resident set by more than ``TRIM_ABOVE``, the allocator's free
pages go back to the system (glibc ``malloc_trim``, :func:`return_free_memory`;
``time/memory_trim`` is what it cost), so ``rest`` is what is really in use, and one phase's
peak does not stay resident through the next.

A phase's peak comes from Linux's high-water mark of the resident set (``VmHWM`` in
``/proc/self/status``), reset when the phase starts by writing ``5`` to
``/proc/self/clear_refs``. Where that is not allowed (another OS, a locked-down container),
the peaks are the process's peak so far (``getrusage``), which never goes down; the run
summary says which it measured.

>>> meter = MemoryMeter()
>>> with meter.phase("update"):
...     block = bytearray(64 << 20)  # 64 MiB, touched
>>> meter.peaks["update"] >= 64 << 20
True
"""

from __future__ import annotations

import resource
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import torch

GB = 1e9
_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def resident_bytes() -> int:
    """The resident set now (``VmRSS``), or the peak so far where /proc is absent."""
    return _status_field("VmRSS") or _peak_so_far()


def _status_field(name: str) -> int:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(name + ":"):
                return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return 0


def _peak_so_far() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


def _reset_peak() -> bool:
    try:
        _CLEAR_REFS.write_text("5")  # resets VmHWM only; nothing else changes
        return True
    except OSError:
        return False


def _storage(t) -> tuple[int, int] | None:
    """(data pointer, bytes) of a CPU tensor's storage; None for anything else (a GPU or meta
    tensor, a freed or swapped-out storage)."""
    if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
        return None
    try:
        storage = t.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except RuntimeError:  # "invalid python storage": a parameter whose storage was replaced
        return None


def return_free_memory() -> bool:
    """Hand the allocator's free memory back to the system (glibc's ``malloc_trim(0)``).

    The update's activations and logits are freed at its end, but glibc keeps the freed
    pages in its arenas: measured on SmolLM2, the resident set stayed at 9.1 GB after an update
    that peaked at 12.3 GB, 7.5 GB of it held by nothing. Freed memory is reused by the next
    phase either way; returning it keeps the machine's memory for the tools, the sandboxes and
    the other processes of the run. False where there is no glibc (macOS, musl)."""
    global _TRIM
    if _TRIM is None:
        try:
            import ctypes

            _TRIM = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _TRIM = False
    if _TRIM is False:
        return False
    _TRIM(0)
    return True


_TRIM = None  # glibc's malloc_trim, looked up once (False: not available)
TRIM_ABOVE = 256 << 20  # bytes a phase must have grown by for a trim after it


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views and tied weights count once)."""
    storages = dict(s for s in map(_storage, tensors) if s is not None)
    return sum(storages.values())


def _optimizer_tensors(optimizer) -> Iterator[torch.Tensor]:
    for state in getattr(optimizer, "state", {}).values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                yield value


@dataclass
class Holdings:
    """Bytes the run holds between phases, from the tensors (CPU tensors only: on a GPU the
    resident set holds none of them)."""

    weights: int  # the policy's parameters
    grads: int  # their .grad tensors, when kept between steps
    optimizer: int  # the optimizer's state
    frozen: int  # reference / teacher models, a sampler's own weights
    prefix_cache: int  # the engine's KV kept between turns

    @classmethod
    def of(cls, model, optimizer=None, frozen_models: Iterable = (), engine=None) -> "Holdings":
        params = list(model.parameters())
        policy = dict(s for s in map(_storage, params) if s is not None)  # storage pointer -> bytes
        frozen = []
        for m in frozen_models:  # a LoRA run's reference is the policy with its adapters off: no tensors of its own
            if callable(getattr(m, "parameters", None)):
                frozen += [s for s in map(_storage, m.parameters()) if s is not None and s[0] not in policy]
        cache = getattr(engine, "prefix_cache", None)  # HFEngine's; vLLM's lives in its own memory
        cast = getattr(engine, "cast", None)  # HFEngine's bfloat16 sampling copies (model.sampler_dtype)
        return cls(weights=sum(policy.values()), grads=tensor_bytes(p.grad for p in params),
                   optimizer=tensor_bytes(_optimizer_tensors(optimizer)),
                   frozen=sum(dict(frozen).values()) + (cast.nbytes() if cast is not None else 0),
                   prefix_cache=cache.nbytes() if cache is not None else 0)

    @property
    def total(self) -> int:
        return self.weights + self.grads + self.optimizer + self.frozen + self.prefix_cache


@dataclass
class MemoryMeter:
    """Peak resident memory per phase of a step, and of the whole run."""

    peaks: dict[str, int] = field(default_factory=dict)  # phase name -> bytes, this step
    run_peak: int = 0  # the highest phase peak seen (bytes)
    exact: bool = True  # False: /proc/self/clear_refs refused, peaks are the process's so far
    trim_s: float = 0.0  # seconds the trims took, this step (return_free_memory)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Record the peak resident set while the body runs, as ``peaks[name]``; then, after a
        phase that grew by more than ``TRIM_ABOVE``, hand what it freed back to the system."""
        self.exact = _reset_peak() and self.exact
        start = resident_bytes()
        try:
            yield
        finally:
            peak = (_status_field("VmHWM") if self.exact else 0) or _peak_so_far()
            self.peaks[name] = max(self.peaks.get(name, 0), peak)
            self.run_peak = max(self.run_peak, peak)
            # a trim walks the whole heap (0.6 s after a SmolLM2 update): only after a phase
            # that grew by more than TRIM_ABOVE, the case it is for
            if peak - start > TRIM_ABOVE:
                t0 = time.perf_counter()
                return_free_memory()
                self.trim_s += time.perf_counter() - t0

    def step_metrics(self, holdings: Holdings) -> dict[str, float]:
        """This step's figures in GB (then forgets the step's phase peaks)."""
        rss = resident_bytes()
        self.run_peak = max(self.run_peak, rss)
        m = {f"memory/peak_{name}_gb": b / GB for name, b in self.peaks.items()}
        m.update({"memory/peak_gb": max([rss, *self.peaks.values()]) / GB, "memory/rss_gb": rss / GB,
                  "memory/weights_gb": holdings.weights / GB, "memory/grads_gb": holdings.grads / GB,
                  "memory/optimizer_gb": holdings.optimizer / GB, "memory/frozen_gb": holdings.frozen / GB,
                  "memory/prefix_cache_gb": holdings.prefix_cache / GB,
                  "memory/rest_gb": max(0, rss - holdings.total) / GB, "time/memory_trim": self.trim_s})
        self.peaks, self.trim_s = {}, 0.0
        return m

    def summary(self, holdings: Holdings) -> str:
        """One line for the end of a run, e.g. ``peak resident memory 2.41 GB; held between
        phases: weights 538 MB, grads 0 B, ...``."""
        how = "" if self.exact else " (the process's peak: /proc/self/clear_refs is not writable here)"
        held = ", ".join(f"{name} {size(b)}" for name, b in (
            ("weights", holdings.weights), ("grads", holdings.grads), ("optimizer", holdings.optimizer),
            ("frozen models", holdings.frozen), ("prefix cache", holdings.prefix_cache)))
        return f"peak resident memory {size(self.run_peak)}{how}; held between phases: {held}"


def size(b: int) -> str:
    """``size(2_410_000_000) == '2.41 GB'``, ``size(538_000_000) == '538 MB'``."""
    if b >= GB:
        return f"{b / GB:.2f} GB"
    return f"{b / 1e6:.0f} MB" if b >= 1e6 else f"{b / 1e3:.0f} kB" if b >= 1e3 else f"{b} B"
