"""One GRPO update on a batch of scored trajectories.

rewards -> group advantages -> filters -> π_old (once) -> ``num_iterations`` passes of
micro-batched clipped-surrogate updates. The loss of each micro-batch uses the batch's
global normalizers (number of sequences, number of tokens), so summing micro-batch
gradients gives exactly the full-batch gradient whatever the micro-batch size.

Under torchrun each rank passes its own trajectories (whole groups); the normalizers are
all-reduced (SUM) so they count every rank's rows, FSDP sums the ranks' gradients, and the
metrics are reduced before they are returned: the update and its statistics do not depend on
the number of ranks. Ranks with fewer micro-batches run empty ones (zero loss) so that every
rank issues the same FSDP collectives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentrl.algo.batching import MicroBatch, collate, plan_micro_batches, score_tokens
from agentrl.run.config import AlgoConfig
from agentrl.scale.distributed import max_floats, sum_floats
from agentrl.algo.filters import FilterResult, filter_attempts
from agentrl.algo.grpo import (
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
    is_weight_max: float = 1.0
    is_trunc_frac: float = 0.0
    trained_attempts: int = 0
    trained_tokens: int = 0


def compute_advantages(trajs: list[Trajectory], algo: AlgoConfig) -> tuple[GroupAdvantages, FilterResult]:
    """Advantages from rewards (written into each trajectory) and the attempt filters."""
    if not trajs:  # a rank with no prompt this step (fewer prompts than ranks)
        empty = torch.zeros(0, dtype=torch.bool)
        return (GroupAdvantages(torch.zeros(0, dtype=torch.float64), empty, torch.zeros(0, dtype=torch.long), []),
                FilterResult(keep=empty, zero_variance_groups=0, dropped_zero_variance=0, masked_truncated=0,
                             dropped_void=0))
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


def empty_micro_batch(pad_id: int, device: str) -> MicroBatch:
    """Two pad tokens, nothing masked in: a zero-loss forward/backward that keeps a rank with
    fewer rows in step with the others' FSDP collectives."""
    z = torch.zeros((1, 2), dtype=torch.float32)
    return MicroBatch([], torch.full((1, 2), pad_id, dtype=torch.long).to(device),
                      torch.ones((1, 2), dtype=torch.long).to(device), z.to(device), z.clone().to(device))


def _full_norm(gn) -> float:
    from torch.distributed.tensor import DTensor

    return float(gn.full_tensor() if isinstance(gn, DTensor) else gn)


def grpo_update(model, optimizer, scheduler, trajs: list[Trajectory], keep: list[bool], algo: AlgoConfig,
                *, temperature: float, micro_batch_tokens: int, num_iterations: int, max_grad_norm: float,
                pad_id: int, norm_len: int, ref_model=None, device: str = "cpu") -> UpdateStats:
    """Apply ``num_iterations`` optimizer steps on the kept trajectories; fill ``old_logprobs``.

    Under torchrun, ``trajs`` are this rank's; every rank must call this (collectively).
    """
    stats = UpdateStats()
    idx = [i for i, k in enumerate(keep) if k and sum(trajs[i].loss_mask) > 0]
    rows = [trajs[i] for i in idx]
    plan = plan_micro_batches([len(t.token_ids) for t in rows], micro_batch_tokens) if rows else []
    seqs_f, tokens_f = sum_floats([len(rows), sum(sum(t.loss_mask) for t in rows)])
    total_seqs, total_tokens = int(seqs_f), int(tokens_f)
    if total_seqs == 0:
        return stats
    stats.trained_attempts, stats.trained_tokens = total_seqs, total_tokens
    batches = [collate(rows, p, pad_id, device) for p in plan]
    n_batches = int(max_floats([len(batches)])[0])
    batches += [empty_micro_batch(pad_id, device) for _ in range(n_batches - len(batches))]
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
    isw_max = 0.0
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
                lp, old[b], adv_all[mb.indices] if mb.indices else torch.zeros(lp.shape[0]), mb.loss_mask,
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
                    isw_max = max(isw_max, float((isw * m).max()))
        gn = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], max_grad_norm)
        optimizer.step()
        scheduler.step()
        loss_sum, pg_sum, rsum = sum_floats([loss_sum, pg_sum, rsum])
        stats.loss, stats.pg_loss, stats.grad_norm = loss_sum, pg_sum, _full_norm(gn)
        stats.ratio_mean, stats.ratio_max = rsum / total_tokens, max_floats([rmax])[0]
    optimizer.zero_grad(set_to_none=True)

    isw_sum = stats.is_weight_mean - 1.0  # UpdateStats starts it at 1.0, the value without IS
    ent_sum, clip_sum, kl_sum, mis_sum, isw_sum, trunc_sum = sum_floats(
        [ent_sum, clip_sum, kl_sum, stats.mismatch_mean, isw_sum, stats.is_trunc_frac])
    stats.mismatch_max = max_floats([stats.mismatch_max])[0]
    stats.entropy = ent_sum / total_tokens
    stats.clip_frac = clip_sum / total_tokens
    stats.kl = kl_sum / total_tokens
    stats.mismatch_mean = mis_sum / total_tokens
    if algo.is_level != "none":
        stats.is_weight_mean = isw_sum / total_tokens
        stats.is_trunc_frac = trunc_sum / total_tokens
        stats.is_weight_max = max_floats([isw_max])[0]
    for b, mb in enumerate(batches):
        o = (old[b] * mb.loss_mask).tolist()
        for r, i in enumerate(mb.indices):
            rows[i].old_logprobs = [float(x) for x in o[r][: len(rows[i].token_ids)]]
    return stats
