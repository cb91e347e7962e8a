"""Scale-out: one process per GPU under torchrun.

Owns: the process group and rank helpers (``distributed``), FSDP2 / LoRA / gradient
checkpointing of the policy (``parallel``, configured by the sections in ``config``) and
moving the trainer's weights to the sampler (``weight_sync``). The run builds on these: the
sharded checkpoints (``agentrl.run.checkpoint_dcp``) and the merging of per-rank results
(``agentrl.run.rank_merge``) live there.

May import torch, peft, ``agentrl.types`` and ``agentrl.engines``; never ``agentrl.run``,
``agentrl.serve`` or ``agentrl.inspect`` (``tests/test_import_graph.py``).
"""
