"""One GRPO update on a batch of scored trajectories.

rewards -> group advantages -> filters -> π_old (once) -> ``num_iterations`` passes of
micro-batched clipped-surrogate updates. The loss of each micro-batch uses the batch's
global normalizers (number of sequences, number of tokens), so summing micro-batch
gradients gives exactly the full-batch gradient whatever the micro-batch size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentrl.batching import collate, plan_micro_batches, score_tokens
from agentrl.config import AlgoConfig
from agentrl.filters import FilterResult, filter_attempts
from agentrl.grpo import (
    GroupAdvantages,
    group_advantages,
    policy_loss,
    truncated_is_weights,
)
from agentrl.types import Trajectory


@dataclass
class UpdateStats:
    loss: float = 0.0
    pg_loss: float = 0.0
    clip_frac: float = 0.0
    kl: float = 0.0
    entropy: float = 0.0
    grad_norm: float = 0.0
    ratio_mean: float = 1.0
    ratio_max: float = 1.0
    mismatch_mean: float = 0.0  # mean |log π_old - log μ| over masked tokens
    mismatch_max: float = 0.0
    is_weight_mean: float = 1.0
    is_trunc_frac: float = 0.0
    trained_attempts: int = 0
    trained_tokens: int = 0


def compute_advantages(trajs: list[Trajectory], algo: AlgoConfig) -> tuple[GroupAdvantages, FilterResult]:
    """Advantages from rewards (written into each trajectory) and the attempt filters."""
    rewards = torch.tensor([float(t.reward or 0.0) for t in trajs], dtype=torch.float64)
    adv = group_advantages(rewards, [t.group_id for t in trajs], std=algo.std, scale=algo.scale,
                           std_floor=algo.std_floor)
    for t, a in zip(trajs, adv.advantages.tolist()):
        t.advantage = float(a)
    filt = filter_attempts(
        adv,
        [t.finish_reason for t in trajs],
        [t.metadata.get("void_turns", 0) > 0 for t in trajs],
        drop_zero_variance=algo.drop_zero_variance,
        mask_truncated=algo.mask_truncated,
        drop_void_turns=algo.drop_void_turns,
    )
    return adv, filt


def grpo_update(model, optimizer, scheduler, trajs: list[Trajectory], keep: list[bool], algo: AlgoConfig,
                *, temperature: float, micro_batch_tokens: int, num_iterations: int, max_grad_norm: float,
                pad_id: int, norm_len: int, ref_model=None, device: str = "cpu") -> UpdateStats:
    """Apply ``num_iterations`` optimizer steps on the kept trajectories; fill ``old_logprobs``."""
    stats = UpdateStats()
    idx = [i for i, k in enumerate(keep) if k and sum(trajs[i].loss_mask) > 0]
    if not idx:
        return stats
    rows = [trajs[i] for i in idx]
    total_seqs = len(rows)
    total_tokens = sum(sum(t.loss_mask) for t in rows)
    stats.trained_attempts, stats.trained_tokens = total_seqs, total_tokens
    plan = plan_micro_batches([len(t.token_ids) for t in rows], micro_batch_tokens)
    batches = [collate(rows, p, pad_id, device) for p in plan]
    adv_all = torch.tensor([float(t.advantage or 0.0) for t in rows])

    # π_old: computed once per step. With a single iteration the first pass's own
    # (detached) log-probs are π_old exactly, so the extra forward is skipped.
    old: list[torch.Tensor | None] = [None] * len(batches)
    ref: list[torch.Tensor | None] = [None] * len(batches)
    with torch.no_grad():
        for b, mb in enumerate(batches):
            if num_iterations > 1:
                old[b] = score_tokens(model, mb, temperature)[0]
            if ref_model is not None and algo.kl_coef > 0:
                ref[b] = score_tokens(ref_model, mb, temperature)[0]

    ent_sum = clip_sum = kl_sum = 0.0
    for it in range(num_iterations):
        optimizer.zero_grad(set_to_none=True)
        loss_sum = pg_sum = 0.0
        rmax, rsum = 0.0, 0.0
        for b, mb in enumerate(batches):
            lp, ent = score_tokens(model, mb, temperature)
            if old[b] is None:
                old[b] = lp.detach()
            isw = None
            if algo.is_level != "none":
                isw = truncated_is_weights(old[b], mb.sampler_logprobs, mb.loss_mask, cap=algo.is_cap,
                                           level=algo.is_level)
            out = policy_loss(
                lp, old[b], adv_all[mb.indices], mb.loss_mask,
                eps_low=algo.eps_low, eps_high=algo.eps_high, dual_clip=algo.dual_clip, agg=algo.agg,
                total_seqs=total_seqs, total_tokens=total_tokens, norm_len=norm_len, is_weights=isw,
                ref_logprobs=ref[b], kl_coef=algo.kl_coef, kl_estimator=algo.kl_estimator,
            )
            out.loss.backward()
            ntok = float(mb.loss_mask.sum())
            loss_sum += float(out.loss.detach())
            pg_sum += float(out.pg_loss)
            rmax = max(rmax, float(out.ratio_max))
            rsum += float(out.ratio_mean) * ntok
            if it == 0:
                m = mb.loss_mask
                ent_sum += float((ent.detach() * m).sum())
                clip_sum += float(out.clip_frac) * ntok
                kl_sum += float(out.kl) * ntok
                diff = (old[b] - mb.sampler_logprobs).abs() * m
                stats.mismatch_mean += float(diff.sum())
                stats.mismatch_max = max(stats.mismatch_max, float(diff.max()))
                if isw is not None:
                    stats.is_weight_mean += float((isw * m).sum())
                    stats.is_trunc_frac += float(((isw >= algo.is_cap - 1e-6).float() * m).sum())
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        scheduler.step()
        stats.loss, stats.pg_loss, stats.grad_norm = loss_sum, pg_sum, float(gn)
        stats.ratio_mean, stats.ratio_max = rsum / total_tokens, rmax
    optimizer.zero_grad(set_to_none=True)

    stats.entropy = ent_sum / total_tokens
    stats.clip_frac = clip_sum / total_tokens
    stats.kl = kl_sum / total_tokens
    stats.mismatch_mean /= total_tokens
    if algo.is_level != "none":
        stats.is_weight_mean = (stats.is_weight_mean - 1.0) / total_tokens
        stats.is_trunc_frac /= total_tokens
    for b, mb in enumerate(batches):
        o = (old[b] * mb.loss_mask).tolist()
        for r, i in enumerate(mb.indices):
            rows[i].old_logprobs = [float(x) for x in o[r][: len(rows[i].token_ids)]]
    return stats
