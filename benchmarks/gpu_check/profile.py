"""The sizes and time budgets of a run: ``GPU`` (one H200, ≤ 8 minutes) and ``SMOKE`` (CPU, CI).

Both profiles run the same code; the smoke one shrinks the Qwen2.5-1.5B-shaped model to two
narrow layers (keeping its 151,936-token vocabulary and the real Qwen2.5 tokenizer), the
batches and the step counts. Both train in bf16 through FSDP2 over a one-rank group, which is
what ``parallel.mixed_precision=auto`` resolves to on one GPU, so the CPU smoke run exercises
the same sharded, mixed-precision path (gloo instead of NCCL).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Profile:
    name: str
    device: str
    dtype: str  # sampling dtype and the trainer's compute dtype
    qwen_overrides: dict[str, int]  # applied to the Qwen2.5-1.5B config; {} = the real shape
    # sampling: HFEngine against transformers' generate
    sampling_batches: tuple[int, ...]
    sampling_new_tokens: int
    sampling_warmup_tokens: int
    sampling_group: int  # rows sharing one prompt, as in a GRPO group
    # Trainer.train_step on the Qwen-shaped model
    policy_prompts: int
    policy_samples: int
    free_new_tokens: int  # per turn, the model's own text
    scripted_turn_tokens: int  # per forced turn (a tool call or the answer, after sampled text)
    scripted_tool_turns: int
    # update timing: a train_step whose attempts all sample free_new_tokens tokens at no cost
    update_micro_batch_tokens: int  # train.micro_batch_tokens of the policy trainer
    # the arithmetic example
    arith_steps: int
    arith_overrides: tuple[str, ...]
    # seconds per section (the group of a child process gets the sum, plus start-up)
    budgets: dict[str, float] = field(default_factory=dict)
    child_startup_s: float = 20.0
    total_budget_s: float = 470.0

    @property
    def logprob_tolerance(self) -> tuple[float, float]:
        """(mean, max) |log μ - log π_old| in nats allowed on sampled tokens.

        bf16: the sampler (KV-cached decoder) and the trainer (full-sequence forward under
        FSDP2 mixed precision) round differently; bf16 keeps 8 significant bits, so logits of
        size ~1 differ by ~1e-2 at worst. fp32 agrees to float rounding.
        """
        return (0.02, 0.15) if self.dtype == "bfloat16" else (1e-4, 1e-3)


GPU = Profile(
    name="gpu", device="cuda", dtype="bfloat16", qwen_overrides={},
    sampling_batches=(64, 256), sampling_new_tokens=256, sampling_warmup_tokens=8, sampling_group=8,
    policy_prompts=8, policy_samples=8, free_new_tokens=256, scripted_turn_tokens=64, scripted_tool_turns=2,
    update_micro_batch_tokens=8192,
    arith_steps=20, arith_overrides=(),
    budgets={"setup": 40, "sampling_tiny": 30, "sampling_qwen": 100, "train_step": 70, "logprob_match": 10,
             "masks_spans": 10, "update": 60, "arithmetic": 170},
    total_budget_s=470.0,
)

SMOKE = Profile(
    name="smoke", device="cpu", dtype="bfloat16",
    qwen_overrides={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "max_window_layers": 2},
    sampling_batches=(4, 8), sampling_new_tokens=16, sampling_warmup_tokens=2, sampling_group=2,
    policy_prompts=2, policy_samples=2, free_new_tokens=16, scripted_turn_tokens=48, scripted_tool_turns=1,
    update_micro_batch_tokens=1024,
    arith_steps=2,
    arith_overrides=("warmstart.num_demos=32", "warmstart.steps=8", "warmstart.batch_size=4",
                     "warmstart.warmup_steps=1", "train.prompts_per_step=2", "algo.num_samples=2",
                     "rollout.max_new_tokens=24", "rollout.max_turns=2", "env.args.num_test=4", "eval.num_tasks=4"),
    budgets={"setup": 90, "sampling_tiny": 60, "sampling_qwen": 60, "train_step": 120, "logprob_match": 20,
             "masks_spans": 20, "update": 60, "arithmetic": 180},
    child_startup_s=60.0, total_budget_s=900.0,
)

PROFILES = {p.name: p for p in (GPU, SMOKE)}
