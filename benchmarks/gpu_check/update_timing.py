"""Seconds per update token of the GRPO update, with and without gradient checkpointing.

Measured through ``Trainer.train_step`` (the public path, whatever the update's internals
become) on the policy group's trainer (FSDP2 bf16): for one step the runner samples with
``FixedTokensEngine``, which answers every attempt with ``rollout.max_new_tokens``
(``free_new_tokens``) random ordinary ids at once, so the rollout costs next to nothing and the
batch has a known shape (``policy_prompts x policy_samples`` attempts of the arithmetic prompt
plus that response), micro-batched by ``train.micro_batch_tokens`` as in a real step.
The step's ``time/update`` is the figure: the π_old forward, forward/backward of every
micro-batch, the optimizer step, and the weight sync into the sampler that follows (part of
every real update).

Gradient checkpointing is switched with the transformers call ``prepare_policy`` makes
(``gradient_checkpointing_enable(use_reentrant=False)`` / ``gradient_checkpointing_disable``);
the model's own ``is_gradient_checkpointing`` is recorded to show that the switch took. One
step at the measured shape runs first as a warm-up (allocator, kernels); peak GPU memory is
reset before each timed step.
"""

from __future__ import annotations

from gpu_check.engines import FixedTokensEngine, runner_engine
from gpu_check.profile import Profile
from gpu_check.results import UpdateData, UpdateRow


def set_checkpointing(model, on: bool) -> bool | None:
    """Switch transformers' gradient checkpointing; returns what the model then reports."""
    if on:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_disable()
    model.train()
    return getattr(model, "is_gradient_checkpointing", None)


def fixed_step(trainer, step: int) -> tuple[dict[str, float], int]:
    """One ``train_step`` whose attempts all sample ``rollout.max_new_tokens`` tokens;
    (metrics, tokens scored)."""
    from agentrl import read_jsonl

    plain = getattr(trainer.tokenizer, "vocab_size", None) or len(trainer.tokenizer)
    with runner_engine(trainer, FixedTokensEngine(trainer.runner.engine, plain, seed=step)):
        m = trainer.train_step(step)
    trajs = read_jsonl(str(trainer.run_dir / "rollouts" / f"step_{step:06d}.jsonl"))
    return m, sum(len(t.token_ids) for t in trajs)


def run_update(profile: Profile, trainer, first_step: int) -> UpdateData:
    """Warm-up, then one timed step with checkpointing on and one with it off."""
    import torch

    on_cuda = str(trainer.dist.device).startswith("cuda")
    plan = trainer.plan
    data = UpdateData(layout=f"fsdp={plan.fsdp} {plan.mixed_precision}",
                      micro_batch_tokens=trainer.cfg.train.micro_batch_tokens)
    fixed_step(trainer, first_step)  # warm-up at the measured shape
    for k, on in enumerate((True, False), start=1):
        active = set_checkpointing(trainer.model, on)
        if on_cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        m, seq = fixed_step(trainer, first_step + k)
        seconds, trained = m["time/update"], int(m["train/tokens"])
        data.rows.append(UpdateRow(
            grad_checkpointing=on, checkpointing_active=active, seconds=seconds, trained_tokens=trained,
            sequence_tokens=seq, us_per_trained_token=1e6 * seconds / max(1, trained),
            us_per_sequence_token=1e6 * seconds / max(1, seq),
            peak_gpu_gb=torch.cuda.max_memory_allocated() / 2**30 if on_cuda else None))
    set_checkpointing(trainer.model, plan.grad_checkpointing)  # back to what the run's config says
    return data
