"""Process groups, ranks and the few collectives the trainer needs (PyTorch's own stack).

``torchrun`` sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``;
``init_distributed`` reads them and joins the group: NCCL when the run is on CUDA, gloo on CPU.
Without torchrun (``WORLD_SIZE`` unset or 1) nothing is initialised and every helper below is
the identity, so single-process code paths call them unconditionally.

Prompts are sharded by whole groups: every rank draws the same global prompt list for a step
(seeded by step) and takes a contiguous slice of it, so the G attempts of a prompt are
generated, scored and given advantages on one rank, and a group never straddles ranks.

Example (one process: the identity)::

    >>> info = init_distributed("cpu")
    >>> info.world_size, info.is_main, sum_floats([1.5, 2.0])
    (1, True, [1.5, 2.0])
    >>> shard_whole_groups(["a", "b", "c", "d", "e"], rank=1, world_size=2)
    ['c', 'd', 'e']
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job. ``device`` is the torch device it trains on."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None  # None: no process group (a single process)
    device: str = "cpu"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    try:
        return int(raw) if raw else default
    except ValueError as e:
        raise ValueError(f"environment variable {name}={raw!r} must be an integer (torchrun sets it)") from e


def init_distributed(device: str = "cpu", *, single_rank_group: bool = False,
                     timeout_s: float = 1800.0) -> DistInfo:
    """Join the torchrun job (idempotent), or describe the lone process when there is none.

    ``device="cuda"`` selects NCCL and pins this process to ``cuda:LOCAL_RANK``; anything else
    selects gloo. The returned ``device`` is the one this rank should put its model on.
    ``single_rank_group``: a process launched without torchrun still gets a one-rank group
    (FSDP2 needs one, e.g. for bf16 mixed precision or CPU offload on a single GPU).
    """
    world = _env_int("WORLD_SIZE", 1)
    local = _env_int("LOCAL_RANK", 0)
    on_cuda = device.startswith("cuda")
    if on_cuda and torch.cuda.is_available():
        torch.cuda.set_device(local if world > 1 else torch.device(device).index or 0)
        device = f"cuda:{torch.cuda.current_device()}"
    backend = "nccl" if on_cuda else "gloo"
    if world <= 1 and not dist.is_initialized():
        if not single_rank_group:
            return DistInfo(device=device)
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=timedelta(seconds=timeout_s))
    if not dist.is_initialized():
        if "MASTER_ADDR" not in os.environ:
            raise ValueError(
                f"WORLD_SIZE={world} but MASTER_ADDR is unset: launch with torchrun "
                "(torchrun --nproc_per_node=N -m agentrl train CONFIG), which sets the rendezvous variables"
            )
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
    return DistInfo(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local,
                    backend=dist.get_backend(), device=device)


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_rank() -> int:
    return dist.get_rank() if is_initialized() else 0


def get_world_size() -> int:
    return dist.get_world_size() if is_initialized() else 1


def _reduce_device() -> torch.device:
    # NCCL reduces only CUDA tensors; gloo only CPU ones.
    if is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_reduce(values: list[float], op) -> list[float]:
    if not is_initialized() or get_world_size() == 1 or not values:
        return [float(v) for v in values]
    t = torch.tensor(values, dtype=torch.float64, device=_reduce_device())
    dist.all_reduce(t, op=op)
    return t.cpu().tolist()


def sum_floats(values: list[float]) -> list[float]:
    """Element-wise sum over ranks (float64, so integer counts below 2**53 stay exact)."""
    return _all_reduce(values, dist.ReduceOp.SUM)


def max_floats(values: list[float]) -> list[float]:
    """Element-wise maximum over ranks."""
    return _all_reduce(values, dist.ReduceOp.MAX)


def gather_to_main(obj: T) -> list[T] | None:
    """Every rank's ``obj`` (picklable), in rank order, on rank 0; None on the other ranks."""
    if not is_initialized() or get_world_size() == 1:
        return [obj]
    out: list[Any] | None = [None] * get_world_size() if get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


def broadcast_from_main(obj: T) -> T:
    """Rank 0's ``obj`` on every rank (e.g. a decision only rank 0 can make)."""
    if not is_initialized() or get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if is_initialized() and get_world_size() > 1:
        if dist.get_backend() == "nccl":
            dist.barrier(device_ids=[torch.cuda.current_device()])
        else:
            dist.barrier()


def shard_whole_groups(items: list[T], rank: int, world_size: int) -> list[T]:
    """Rank ``rank``'s contiguous slice of ``items`` (one item = one prompt = one whole group).

    Slice r is ``items[floor(r n / w) : floor((r + 1) n / w)]``: the slices partition the list
    in order and differ in size by at most one; a rank may get none when n < w.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of {world_size}")
    n = len(items)
    return items[rank * n // world_size:(rank + 1) * n // world_size]


def shutdown() -> None:
    """Leave the process group (end of a run); a no-op without one."""
    if is_initialized():
        dist.destroy_process_group()
