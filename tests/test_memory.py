"""The run's memory figures (agentrl/run/memory.py): phase peaks that reset between phases, and
the bytes of what a run holds, against hand-counted tensors."""

from __future__ import annotations

import pytest
import torch

from agentrl.engines.prefix_cache import PrefixCache
from agentrl.run.memory import Holdings, MemoryMeter, resident_bytes, return_free_memory, tensor_bytes
from agentrl.run.report import summarize

MB = 1 << 20


def test_a_phase_peak_sees_its_own_allocation_and_not_an_earlier_one():
    meter = MemoryMeter()
    base = resident_bytes()
    with meter.phase("update"):
        big = torch.ones(320 * MB // 4)  # 320 MiB, touched
        del big
    trimmed = meter.trim_s
    with meter.phase("rollout"):
        small = torch.ones(8 * MB // 4)
        del small
    assert meter.peaks["update"] >= base + 200 * MB
    # the phase that grew by more than TRIM_ABOVE was followed by a trim, the small one not
    assert trimmed > 0 and meter.trim_s == trimmed
    if meter.exact:  # the high-water mark was reset at the phase's start
        assert meter.peaks["rollout"] < meter.peaks["update"] - 150 * MB
    else:  # where /proc/self/clear_refs is refused, peaks never go down (and the summary says so)
        assert meter.peaks["rollout"] >= meter.peaks["update"]
        assert "clear_refs" in meter.summary(Holdings(0, 0, 0, 0, 0))
    m = meter.step_metrics(Holdings(0, 0, 0, 0, 0))
    assert m["memory/peak_gb"] == max(m["memory/peak_update_gb"], m["memory/rss_gb"])
    assert meter.peaks == {} and meter.run_peak >= base + 200 * MB


def test_holdings_count_each_storage_once():
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight  # tied, as LM heads often are: one storage
    frozen = torch.nn.Linear(3, 5)  # 15 + 5 floats
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.tensor([1, 2])).sum().backward()
    opt.step()
    class AdaptersOff:  # a LoRA run's reference (agentrl.scale.parallel.AdapterDisabledReference): no tensors
        def __call__(self, **kwargs):
            return model(**kwargs)

    h = Holdings.of(model, opt, [frozen, model, AdaptersOff()], engine=None)  # the policy is not "frozen"
    assert h.weights == 40 * 4 and h.grads == 40 * 4
    assert h.optimizer == 2 * 40 * 4 + 4  # exp_avg, exp_avg_sq, and the float32 step count
    assert h.frozen == 20 * 4 and h.prefix_cache == 0
    assert tensor_bytes([torch.zeros(6)[:2], torch.zeros(3, dtype=torch.float64)]) == 6 * 4 + 3 * 8


def test_the_prefix_cache_reports_the_bytes_it_holds():
    cache = PrefixCache(max_tokens=1000, block=4)
    kv = torch.zeros(2, 1, 10, 8)  # 160 floats
    cache.insert(list(range(10)), kv, kv.clone())
    assert cache.nbytes() == 2 * 160 * 4

    class Engine:
        prefix_cache = cache

    assert Holdings.of(torch.nn.Linear(1, 1), None, [], Engine()).prefix_cache == 2 * 160 * 4


def test_the_run_summary_names_the_peak_and_its_phases():
    rows = [{"step": 1, "reward/mean": 0.0, "memory/peak_gb": 2.5, "memory/peak_rollout_gb": 2.5,
             "memory/peak_update_gb": 2.0, "memory/weights_gb": 0.5, "memory/optimizer_gb": 1.0},
            {"step": 2, "reward/mean": 0.0, "memory/peak_gb": 3.25, "memory/peak_rollout_gb": 2.0,
             "memory/peak_update_gb": 3.25, "memory/weights_gb": 0.5, "memory/optimizer_gb": 1.0}]
    line = next(x for x in summarize(rows, "runs/x").splitlines() if "peak memory" in x)
    assert "3.25 GB (rollout 2.50, update 3.25)" in line and "optimizer 1.00" in line
    assert "peak memory" not in summarize([{"step": 1, "reward/mean": 0.0}], "runs/x")


def test_freed_memory_goes_back_to_the_system():
    """Freed blocks between live ones stay resident in glibc's arenas until trimmed."""
    import ctypes.util

    if not ctypes.util.find_library("c") or not return_free_memory():
        pytest.skip("no glibc malloc_trim here")
    live, dead = [], []
    for _ in range(4000):
        dead.append(torch.ones(16_000))  # 64 kB each, under glibc's mmap threshold: heap memory
        live.append(torch.ones(8))  # pins the heap between them, so no automatic trim at its top
    del dead
    before = resident_bytes()
    assert return_free_memory()
    assert before - resident_bytes() > 150 * MB
    del live
