"""The config sections scale-out reads: the parallel layout and LoRA (``parallel:`` and
``lora:`` of a run config; :mod:`agentrl.run.config` puts them in ``Config``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class ParallelConfig:
    """Multi-process training (torchrun + FSDP2), precision and memory savers (docs/scaling.md)."""

    fsdp: bool | Literal["auto"] = "auto"  # auto: shard when >1 rank, or when bf16/cpu_offload is on
    mixed_precision: Literal["auto", "bf16", "fp32"] = "auto"  # auto: bf16 on CUDA, fp32 on CPU
    grad_checkpointing: bool = False  # recompute each decoder layer in backward
    cpu_offload: bool = False  # FSDP2 CPUOffloadPolicy: sharded params, grads, optimizer in host RAM


@dataclass
class LoRAConfig:
    """LoRA adapters through peft; with kl_coef > 0 the reference is the base (adapter off)."""

    enabled: bool = False  # train LoRA adapters instead of every weight
    r: int = 16  # adapter rank
    alpha: float = 32.0  # adapter scale alpha / r
    dropout: float = 0.0  # dropout on the adapters' input
    target_modules: list[str] | str = "all-linear"  # peft names, e.g. [q_proj, v_proj]
