"""Sharded checkpoints (FSDP and/or LoRA runs) with ``torch.distributed.checkpoint``.

Layout of ``checkpoints/step_XXXXXX/`` (written into ``.tmp_step_XXXXXX`` by all ranks, then
renamed by rank 0, so a kill at any moment leaves no half checkpoint that resume would take)::

    dcp/        model + optimizer state, one file per writing rank, keyed by parameter name
    model/      the full policy as a Hugging Face directory (LoRA merged): for eval, vLLM, serving
    state.pt    step, policy version, scheduler, every rank's RNG states, the layout it was written with
    config.yaml

``dcp/`` is resharded on load: a checkpoint written by N ranks resumes in M ranks, M = 1
included (a single process without FSDP loads it into a plain model). The single-process
format of ``agentrl.run.checkpoint`` (``model/`` + ``state.pt`` with the optimizer) is still what a
plain single-process run writes; ``load_unsharded_into_sharded`` resumes it in a sharded run.

Example::

    save_sharded_checkpoint(run_dir, state, model, tokenizer, optimizer, scheduler, cfg_yaml, lora=False)
    state = load_sharded_checkpoint(latest_checkpoint(run_dir), model, optimizer, scheduler)
"""

from __future__ import annotations

import random
import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from agentrl.run.checkpoint import TrainState, fsync_dir, checkpoint_dir, publish_checkpoint
from agentrl.scale.distributed import barrier, gather_to_main, get_rank, get_world_size, is_initialized
from agentrl.scale.weight_sync import export_weights

FORMAT = "dcp-v1"


def is_sharded(ckpt: Path) -> bool:
    return (ckpt / "dcp").is_dir()


@contextmanager
def _quiet_single_process():
    """DCP warns that it 'assumes' a single process when there is no group: that is the intent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _rng_state() -> dict:
    out = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state()
    return out


def _set_rng_state(rng: dict) -> None:
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])


def export_hf(model, tokenizer, out_dir: Path, dtype: torch.dtype | None = None) -> None:
    """Write the full (LoRA-merged) policy as a Hugging Face model directory, from rank 0.

    Collective under FSDP: every rank streams the parameters, only rank 0 keeps them (on CPU).
    """
    from safetensors.torch import save_file

    root = model.get_base_model() if hasattr(model, "get_base_model") else model
    main = get_rank() == 0
    tensors: dict[str, torch.Tensor] = {}
    for name, t in export_weights(model):
        if main:
            tensors[name] = t.to("cpu", dtype or t.dtype).contiguous()
    if not main:
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    root.config.save_pretrained(out_dir)
    gen = getattr(root, "generation_config", None)
    if gen is not None:
        gen.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})


def save_sharded_checkpoint(run_dir: Path, state: TrainState, model, tokenizer, optimizer, scheduler,
                            config_yaml: str, *, lora: bool, keep: int = 2,
                            export_dtype: torch.dtype | None = None) -> Path:
    """Collective: every rank writes its shards; rank 0 writes the rest and renames into place."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    final = checkpoint_dir(run_dir, state.step)
    tmp = final.parent / f".tmp_{final.name}"  # one name for all ranks (no pid in it)
    main = get_rank() == 0
    if main:
        if tmp.exists():
            shutil.rmtree(tmp)  # left by a run killed mid-save
        tmp.mkdir(parents=True)
    barrier()
    msd, osd = get_state_dict(model, optimizer)
    with _quiet_single_process():
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp / "dcp"), no_dist=not is_initialized())
    export_hf(model, tokenizer, tmp / "model", export_dtype)
    rngs = gather_to_main(_rng_state())
    if main:
        torch.save({"format": FORMAT, "step": state.step, "policy_version": state.policy_version,
                    "scheduler": scheduler.state_dict(), "rng": rngs, "world_size": get_world_size(),
                    "lora": lora}, tmp / "state.pt")
        (tmp / "config.yaml").write_text(config_yaml)
        for d in (tmp / "dcp", tmp / "model"):
            fsync_dir(d)
        publish_checkpoint(run_dir, tmp, final, keep)
    barrier()
    return final


def load_sharded_checkpoint(ckpt: Path, model, optimizer, scheduler, *, lora: bool) -> TrainState:
    """Collective: load model and optimizer shards (resharded to this job), scheduler and RNG."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    blob = torch.load(ckpt / "state.pt", map_location="cpu", weights_only=False)
    if blob.get("format") != FORMAT:
        raise ValueError(f"{ckpt} is not a sharded checkpoint ({FORMAT}); its state.pt says {blob.get('format')!r}")
    if bool(blob.get("lora")) != lora:
        on = "on" if blob.get("lora") else "off"
        raise ValueError(f"{ckpt} was written with LoRA {on}; resume it with lora.enabled={str(bool(blob['lora'])).lower()}")
    msd, osd = get_state_dict(model, optimizer)  # also creates the optimizer's state tensors to load into
    sd = {"model": msd, "optim": osd}
    with _quiet_single_process():
        dcp.load(sd, checkpoint_id=str(ckpt / "dcp"), no_dist=not is_initialized())
    set_state_dict(model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    scheduler.load_state_dict(blob["scheduler"])
    rngs = blob["rng"]
    _set_rng_state(rngs[get_rank()] if get_rank() < len(rngs) else rngs[0])
    return TrainState(step=int(blob["step"]), policy_version=int(blob["policy_version"]))


def load_unsharded_into_sharded(ckpt: Path, model, optimizer, scheduler) -> TrainState:
    """Resume a single-process checkpoint (weights already loaded from ``ckpt/model``) in a
    sharded run: its optimizer state is keyed by parameter position, which is turned into
    parameter names (the order of ``model.named_parameters()``) and sharded."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    blob = torch.load(ckpt / "state.pt", map_location="cpu", weights_only=False)
    osd = blob["optimizer"]
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    n_saved = sum(len(g["params"]) for g in osd["param_groups"])
    if n_saved != len(names):
        raise ValueError(f"{ckpt}: its optimizer covers {n_saved} parameters, this policy trains {len(names)} "
                         "(was it written with another model, or with LoRA toggled?)")
    by_name = {"state": {names[i]: st for i, st in osd["state"].items()},
               "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in osd["param_groups"]]}
    set_optimizer_state_dict(model, optimizer, by_name, options=StateDictOptions(full_state_dict=True))
    scheduler.load_state_dict(blob["scheduler"])
    _set_rng_state(blob["rng"])
    return TrainState(step=int(blob["step"]), policy_version=int(blob["policy_version"]))
