"""The algorithm: GRPO as pure, tested functions, and the update that applies them.

Owns: advantages, the clipped surrogate, KL, truncated importance weights, aggregation
(``grpo``), the attempt filters (``filters``), the objective of a run resolved once from its
config (``objective``), padding trajectories into micro-batches and scoring their tokens
(``batching``), and one optimizer step over a batch (``update``).

May import: torch, ``agentrl.types``, ``agentrl.scale.distributed`` (for the all-reduces of
the batch normalizers). Never the run (trainer, config loading), engines, tools or envs.
"""
