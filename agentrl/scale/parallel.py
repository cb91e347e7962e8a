"""How the policy is laid out for training: LoRA, gradient checkpointing, FSDP2 sharding, precision.

One resolved ``ParallelPlan`` says what a run does; ``prepare_policy`` applies it to a freshly
loaded Hugging Face causal LM, in this order:

1. LoRA adapters through ``peft`` (only adapter weights train; the base stays frozen),
2. gradient checkpointing (non-reentrant: recompute each decoder layer in backward),
3. FSDP2 ``fully_shard`` on every decoder layer and then on the root (embeddings, final norm
   and a tied LM head share the root's group), with ``MixedPrecisionPolicy`` (bf16 compute,
   fp32 gradient reduction, fp32 master weights) and optionally ``CPUOffloadPolicy``.

Gradients are *summed* over ranks, not averaged (FSDP's default): each rank's loss is its share
of the global loss, normalised by the global sequence/token counts, so the sum of the ranks'
gradients is the full-batch gradient whatever the number of ranks.

Example (a single CPU process: nothing to shard, LoRA on)::

    from agentrl.scale.config import LoRAConfig, ParallelConfig
    plan = resolve_plan(ParallelConfig(), LoRAConfig(enabled=True, r=4), world_size=1, device="cpu")
    assert not plan.fsdp and plan.lora and plan.mixed_precision == "fp32"
    policy = prepare_policy(model, plan, LoRAConfig(enabled=True, r=4), device="cpu")
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from agentrl.scale.config import LoRAConfig, ParallelConfig
from agentrl.types import ConfigError

LORA_HINT = "LoRA needs peft: pip install 'agentrl[lora]' (or pip install 'peft>=0.12' torch==<your torch version>)"


@dataclass(frozen=True)
class ParallelPlan:
    """The resolved layout of one rank's policy (see ``resolve_plan``)."""

    fsdp: bool  # shard parameters, gradients and optimizer state with FSDP2
    mixed_precision: str  # "bf16" (compute in bf16, fp32 master weights) or "fp32"
    cpu_offload: bool  # FSDP2 CPUOffloadPolicy: sharded params/grads/optimizer on the host
    grad_checkpointing: bool
    lora: bool

    @property
    def plain(self) -> bool:
        """Today's single-process layout: the engine can share the trainer's tensors."""
        return not (self.fsdp or self.lora or self.grad_checkpointing)

    @property
    def compute_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.mixed_precision == "bf16" else torch.float32


def resolve_plan(pcfg: ParallelConfig, lcfg: LoRAConfig, world_size: int, device: str) -> ParallelPlan:
    """Turn ``parallel.*`` / ``lora.*`` and the launch (ranks, device) into one plan.

    ``mixed_precision=auto`` is bf16 on CUDA and fp32 on CPU. ``fsdp=auto`` shards whenever
    there is more than one rank, or bf16 / CPU offload is asked for (both are FSDP2 policies;
    a single GPU then runs FSDP over a one-rank group).
    """
    on_cuda = device.startswith("cuda")
    mp = pcfg.mixed_precision if pcfg.mixed_precision != "auto" else ("bf16" if on_cuda else "fp32")
    fsdp = pcfg.fsdp if isinstance(pcfg.fsdp, bool) else (world_size > 1 or mp == "bf16" or pcfg.cpu_offload)
    if world_size > 1 and not fsdp:
        raise ConfigError(f"{world_size} ranks but parallel.fsdp=false: multi-rank training shards the policy "
                          "with FSDP2. Fix: parallel.fsdp=auto (or true)")
    if not fsdp and (mp == "bf16" or pcfg.cpu_offload):
        raise ConfigError("parallel.mixed_precision=bf16 and parallel.cpu_offload are FSDP2 policies. "
                          "Fix: parallel.fsdp=auto (or true)")
    return ParallelPlan(fsdp=fsdp, mixed_precision=mp, cpu_offload=pcfg.cpu_offload,
                        grad_checkpointing=pcfg.grad_checkpointing, lora=lcfg.enabled)


def describe_plan(plan: ParallelPlan, world_size: int) -> str:
    """One line for the run's start: ranks, sharding, precision, memory savers, LoRA."""
    parts = [f"{world_size} rank{'s' if world_size > 1 else ''}",
             "FSDP2 (full shard, grads summed over ranks)" if plan.fsdp else "no sharding",
             f"{plan.mixed_precision} compute" + (" / fp32 master weights" if plan.mixed_precision == "bf16" else "")]
    if plan.cpu_offload:
        parts.append("CPU offload")
    if plan.grad_checkpointing:
        parts.append("gradient checkpointing")
    parts.append("LoRA" if plan.lora else "full fine-tuning")
    return ", ".join(parts)


def apply_lora(model: nn.Module, lcfg: LoRAConfig) -> nn.Module:
    """Wrap ``model`` with LoRA adapters (``W x + (alpha / r) B A x``, B = 0 at start)."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as e:
        raise ImportError(LORA_HINT) from e
    targets = lcfg.target_modules if isinstance(lcfg.target_modules, str) else list(lcfg.target_modules)
    pcfg = LoraConfig(r=lcfg.r, lora_alpha=lcfg.alpha, lora_dropout=lcfg.dropout, target_modules=targets,
                      bias="none", task_type="CAUSAL_LM")
    return get_peft_model(model, pcfg)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated transformer blocks (the classes the model lists in ``_no_split_modules``)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"{type(base).__name__} names no decoder layer class in _no_split_modules; "
                         "FSDP needs one unit per block (parallel.fsdp=false for a single process)")
    return layers


def shard(model: nn.Module, plan: ParallelPlan, device: str) -> nn.Module:
    """``fully_shard`` each decoder layer, then the root; gradients summed over ranks."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    if not dist.is_initialized():
        raise RuntimeError("FSDP needs a process group: call agentrl.scale.distributed.init_distributed first")
    if not hasattr(FSDPModule, "set_force_sum_reduction_for_comms"):
        raise RuntimeError(f"torch {torch.__version__} lacks FSDP2's sum-reduction switch that agentrl's "
                           "sharded training relies on; install a newer torch (2.13 is the tested version)")
    mesh = init_device_mesh("cuda" if device.startswith("cuda") else "cpu", (dist.get_world_size(),))
    mp = MixedPrecisionPolicy(param_dtype=plan.compute_dtype, reduce_dtype=torch.float32)
    kw = dict(mesh=mesh, mp_policy=mp, offload_policy=CPUOffloadPolicy() if plan.cpu_offload else OffloadPolicy())
    for layer in decoder_layers(model):
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            # Sum, not mean: each rank's loss is already its share of the global loss. gloo has
            # no PREMUL_SUM, hence plain SUM collectives with a (trivial) post-division.
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
    return model


def prepare_policy(model: nn.Module, plan: ParallelPlan, lcfg: LoRAConfig, device: str) -> nn.Module:
    """LoRA, then gradient checkpointing, then FSDP2, as ``plan`` says. Returns the module to train."""
    if plan.lora:
        model = apply_lora(model, lcfg)
    if plan.grad_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()  # transformers only checkpoints in training mode
    if plan.fsdp:
        model = shard(model, plan, device)
    elif next(model.parameters()).device != torch.device(device):
        model = model.to(device)
    return model


def prepare_reference(model: nn.Module, plan: ParallelPlan, device: str) -> nn.Module:
    """A frozen reference policy, sharded like the policy so its memory is split too."""
    model.requires_grad_(False).eval()
    if plan.fsdp:
        return shard(model, plan, device)
    return model.to(device)


class AdapterDisabledReference:
    """The LoRA policy's base model as the KL reference: same module, adapter switched off.

    Calling it runs the policy's forward inside ``peft``'s ``disable_adapter()``, so the
    reference costs no second copy of the weights (and works when the policy is sharded).

    >>> from transformers import AutoModelForCausalLM
    >>> from agentrl.models.tiny import ensure_tiny_model
    >>> model = AutoModelForCausalLM.from_pretrained(ensure_tiny_model())
    >>> peft_model = apply_lora(model, LoRAConfig(enabled=True))
    >>> ids = torch.tensor([[1, 2, 3]]); att = torch.ones_like(ids)
    >>> ref = AdapterDisabledReference(peft_model)
    >>> ref(input_ids=ids, attention_mask=att).logits.shape   # base-model logits
    torch.Size([1, 3, 1024])
    """

    def __init__(self, peft_model: nn.Module):
        if not hasattr(peft_model, "disable_adapter"):
            raise TypeError("AdapterDisabledReference needs a peft model (lora.enabled=true)")
        self.model = peft_model

    def __call__(self, **kwargs):
        with self.model.disable_adapter():
            return self.model(**kwargs)

