"""Atomic, resumable checkpoints: ``checkpoints/step_XXXXXX/``.

A checkpoint is written into a temporary directory and renamed into place, so a run
killed at any moment (even SIGKILL) leaves either the complete previous checkpoints or
the complete new one, never a half-written directory that resume would pick up.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from agentrl.models.cache import save_hf

_STEP_RE = re.compile(r"^step_(\d{6,})$")


@dataclass
class TrainState:
    """What a resumed run needs besides the weights."""

    step: int  # last completed optimizer step
    policy_version: int


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step_{step:06d}"


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_RE.match(p.name)
        if m and (p / "state.pt").exists():
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def save_checkpoint(run_dir: Path, state: TrainState, model, tokenizer, optimizer, scheduler,
                    config_yaml: str, keep: int = 2) -> Path:
    """Write model, tokenizer, optimizer, scheduler, RNG states, step and config atomically."""
    final = checkpoint_dir(run_dir, state.step)
    tmp = final.parent / f".tmp_{final.name}_{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_hf(model, tokenizer, tmp / "model")
    torch.save(
        {
            "step": state.step,
            "policy_version": state.policy_version,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": {
                "python": random.getstate(),
                "numpy": np.random.get_state(),
                "torch": torch.get_rng_state(),
            },
        },
        tmp / "state.pt",
    )
    (tmp / "config.yaml").write_text(config_yaml)
    publish_checkpoint(run_dir, tmp, final, keep)
    return final


def publish_checkpoint(run_dir: Path, tmp: Path, final: Path, keep: int) -> None:
    """Rename a complete checkpoint directory into place, then prune all but the last ``keep``."""
    fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    for _, old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)


def load_checkpoint_state(ckpt: Path, optimizer, scheduler) -> TrainState:
    """Restore optimizer, scheduler and RNG states; the weights load from ``ckpt/model``."""
    blob = torch.load(ckpt / "state.pt", map_location="cpu", weights_only=False)
    optimizer.load_state_dict(blob["optimizer"])
    scheduler.load_state_dict(blob["scheduler"])
    rng = blob["rng"]
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    return TrainState(step=int(blob["step"]), policy_version=int(blob["policy_version"]))


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
