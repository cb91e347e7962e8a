"""Scale-out: one process per GPU under torchrun.

Owns: the process group and rank helpers (``distributed``), FSDP2 / LoRA / gradient
checkpointing of the policy (``parallel``), merging per-rank results (``rank_merge``),
moving the trainer's weights to the sampler (``weight_sync``) and sharded checkpoints
(``checkpoint_dcp``).

May import torch, peft, ``agentrl.types``, ``agentrl.engines.base``, the config dataclasses
(``agentrl.run.config``), the result types it merges (``agentrl.run.evaluate``) and the
checkpoint format its sharded one extends (``agentrl.run.checkpoint``); never the trainer.
"""
