"""Seconds per update token of the GRPO update, with and without gradient checkpointing.

A fixed synthetic batch (``update_rows`` attempts in groups of 8, a prompt of
``update_prompt_tokens`` and a sampled response of ``update_response_tokens``, rewards
alternating inside each group so every attempt has an advantage) goes through the same
``compute_advantages`` + ``grpo_update`` calls as ``Trainer.train_step``, on the policy
group's trainer (FSDP2 bf16). Gradient checkpointing is switched with the transformers call
``prepare_policy`` uses; the model's own ``is_gradient_checkpointing`` is recorded to show the
switch took. One small warm-up update runs first; peak GPU memory is reset before each timing.
"""

from __future__ import annotations

import random
import time

from gpu_check.bootstrap import first_module
from gpu_check.profile import Profile
from gpu_check.results import UpdateData, UpdateRow


def synthetic_batch(rows: int, prompt: int, response: int, vocab: int, seed: int = 0) -> list:
    """Trajectories with random ids: the cost of an update depends on shapes, not on content."""
    from agentrl import Span, Trajectory

    rng = random.Random(seed)
    out = []
    for i in range(rows):
        n = prompt + response
        out.append(Trajectory(
            token_ids=[rng.randrange(vocab) for _ in range(n)], prompt_len=prompt,
            loss_mask=[0] * prompt + [1] * response, logprobs=[0.0] * prompt + [-12.0] * response,
            spans=[Span(0, prompt, "prompt"), Span(prompt, n, "model")], messages=[],
            reward=float(i % 2), group_id=f"g{i // 8}", sample_index=i % 8, finish_reason="length"))
    return out


def one_update(trainer, trajs: list, micro_batch_tokens: int) -> float:
    """Seconds of one ``grpo_update`` exactly as ``Trainer.train_step`` calls it."""
    import torch

    update = first_module("agentrl.algo.update", "agentrl.update")
    cfg = trainer.cfg
    _, filt = update.compute_advantages(trajs, cfg.algo)
    device = trainer.dist.device
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    update.grpo_update(
        trainer.model, trainer.optimizer, trainer.scheduler, trajs, filt.keep.tolist(), cfg.algo,
        temperature=cfg.rollout.temperature, micro_batch_tokens=micro_batch_tokens,
        num_iterations=cfg.train.num_iterations, max_grad_norm=cfg.optim.max_grad_norm,
        pad_id=trainer.tokenizer.pad_token_id, norm_len=cfg.algo.norm_len or cfg.rollout.max_total_tokens,
        ref_model=trainer.ref_model, device=device)
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def set_checkpointing(model, on: bool) -> bool | None:
    """Switch transformers' gradient checkpointing; returns what the model then reports."""
    if on:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_disable()
    model.train()
    return getattr(model, "is_gradient_checkpointing", None)


def run_update(profile: Profile, trainer) -> UpdateData:
    """Warm-up, then the timed update with checkpointing on and off."""
    import torch

    batching = first_module("agentrl.algo.batching", "agentrl.batching")
    on_cuda = str(trainer.dist.device).startswith("cuda")
    vocab = len(trainer.tokenizer)
    mbt = profile.update_micro_batch_tokens
    plan = trainer.plan
    data = UpdateData(layout=f"fsdp={plan.fsdp} {plan.mixed_precision}", micro_batch_tokens=mbt)
    one_update(trainer, synthetic_batch(8, profile.update_prompt_tokens, 16, vocab, seed=1), mbt)  # warm-up
    for on in (True, False):
        active = set_checkpointing(trainer.model, on)
        trajs = synthetic_batch(profile.update_rows, profile.update_prompt_tokens, profile.update_response_tokens,
                                vocab)
        if on_cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        seconds = one_update(trainer, trajs, mbt)
        trained = sum(sum(t.loss_mask) for t in trajs)
        seq = sum(len(t.token_ids) for t in trajs)
        data.rows.append(UpdateRow(
            grad_checkpointing=on, checkpointing_active=active, seconds=seconds, trained_tokens=trained,
            sequence_tokens=seq, micro_batches=len(batching.plan_micro_batches([len(t.token_ids) for t in trajs], mbt)),
            us_per_trained_token=1e6 * seconds / trained, us_per_sequence_token=1e6 * seconds / seq,
            peak_gpu_gb=torch.cuda.max_memory_allocated() / 2**30 if on_cuda else None))
    set_checkpointing(trainer.model, plan.grad_checkpointing)  # as the run's config says
    return data
