"""The optimizer of a run and the learning-rate schedule of the GRPO run and of the SFT warm
start (one definition).

    >>> [round(lr_factor(s, warmup=2, total=6, schedule="cosine"), 3) for s in range(6)]
    [0.5, 1.0, 1.0, 0.854, 0.5, 0.146]
    >>> round(lr_factor(6, warmup=2, total=6, schedule="cosine", floor=0.1), 3)  # decays to 10%
    0.1
"""

from __future__ import annotations

import math

import torch

SCHEDULES: tuple[str, ...] = ("cosine", "linear", "constant")


def lr_factor(step: int, *, warmup: int, total: int, schedule: str = "cosine", floor: float = 0.0) -> float:
    """Multiplier of the peak learning rate after ``step`` optimizer steps.

    Linear warmup over ``warmup`` steps: (step + 1) / warmup. Then, with
    f = (step - warmup) / (total - warmup) capped at 1:
    cosine: floor + (1 - floor) · (1 + cos(π f)) / 2;  linear: floor + (1 - floor) · (1 - f);
    constant: 1.
    """
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "cosine":
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * frac))
    if schedule == "linear":
        return floor + (1 - floor) * (1.0 - frac)
    raise ValueError(f"schedule={schedule!r}; use one of {', '.join(SCHEDULES)}")


def build_optimizer(cfg, model: torch.nn.Module):  # cfg: agentrl.run.config.Config
    """AdamW over the trainable parameters (LoRA: the adapters) and its LR schedule."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.optim.lr, betas=tuple(cfg.optim.betas),
                                  weight_decay=cfg.optim.weight_decay)
    o = cfg.optim
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, warmup=o.warmup_steps, total=cfg.train.steps, schedule=o.schedule))
    return optimizer, scheduler
