"""One GRPO update on a batch of scored trajectories.

rewards -> group advantages -> filters -> π_old (once) -> ``num_iterations`` passes of
micro-batched clipped-surrogate updates. With on-policy distillation (``algo.distill``) a
teacher scores the same micro-batches once, next to the reference, and its per-token advantages
A_t replace A_i in every pass (agentrl.algo.distill). The loss of each micro-batch uses the batch's
global normalizers (number of sequences, number of tokens), so summing micro-batch
gradients gives exactly the full-batch gradient whatever the micro-batch size.

Under torchrun each rank passes its own trajectories (whole groups); the normalizers are
all-reduced (SUM) so they count every rank's rows, FSDP sums the ranks' gradients, and the
metrics are reduced before they are returned: the update and its statistics do not depend on
the number of ranks. Ranks with fewer micro-batches run empty ones (zero loss) so that every
rank issues the same FSDP collectives.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import torch

from agentrl.algo.batching import MicroBatch, collate, plan_micro_batches, score_tokens
from agentrl.scale.distributed import max_floats, sum_floats
from agentrl.algo.filters import FilterResult
from agentrl.algo.grpo import GroupAdvantages
from agentrl.algo.objective import Objective
from agentrl.types import Trajectory


@dataclass(frozen=True)
class UpdateSettings:
    """How the update runs (the objective says what it optimizes)."""

    micro_batch_tokens: int  # padded tokens per forward/backward
    num_iterations: int = 1  # optimizer steps per batch (π_old fixed across them)
    max_grad_norm: float = 1.0
    pad_id: int = 0
    device: str = "cpu"
    # Attempts whose advantage is exactly 0 add nothing to the gradient when the objective has
    # no KL term: skip their forward and backward (the normalizers still count them).
    skip_zero_advantage: bool = True
    autocast: str = "none"  # "bf16": the forward's matmuls in bfloat16 (see batching.score_tokens)
    # rows sharing a prompt run it once per micro-batch (agentrl.algo.shared_prefix); the
    # micro-batches then follow the groups. Single process only (FSDP ranks must agree).
    share_prefix: bool = False
    # the LM head on trained positions only, without [B, K, V] logits (batching.score_tokens)
    fused_head: bool = False


@dataclass
class UpdateStats:
    """What one update did, reduced over ranks.

    Two kinds of fields, by which pass they describe: ``loss``, ``pg_loss``, ``grad_norm`` and
    ``ratio_*`` describe the **last** iteration (the parameters the step ends with); ``entropy``,
    ``clip_frac``, ``kl``, ``mismatch_*`` and ``is_*`` describe the **first** iteration, where
    π_θ = π_old (so they measure the batch as sampled). Token means are over the tokens that
    went through the model: attempts skipped for a zero advantage (``skipped_attempts``) are
    in the loss's normalizers but not in these means, and get no ``old_logprobs``.
    """

    loss: float = 0.0  # last iteration
    pg_loss: float = 0.0  # last iteration
    grad_norm: float = 0.0  # last iteration, before clipping
    ratio_mean: float = 1.0  # last iteration: π_θ/π_old over trained tokens
    ratio_max: float = 1.0  # last iteration
    entropy: float = 0.0  # first iteration
    clip_frac: float = 0.0  # first iteration
    kl: float = 0.0  # first iteration: KL(π_θ || π_ref) estimate per token
    mismatch_mean: float = 0.0  # first iteration: mean |log π_old - log μ| over trained tokens
    mismatch_max: float = 0.0
    is_weight_mean: float = 1.0  # first iteration: min(π_old/μ, C); 1 when the IS weight is off
    is_weight_max: float = 1.0
    is_trunc_frac: float = 0.0  # first iteration: share of tokens at the cap
    trained_attempts: int = 0  # in the loss (its normalizers count them)
    trained_tokens: int = 0
    skipped_attempts: int = 0  # of those, advantage 0 and no KL term: no forward, no backward
    # algo.distill only: mean over trained tokens of d_t = log μ - log π_teacher (the sampled
    # reverse KL, student to teacher); None (not logged) without distillation
    distill_reverse_kl: float | None = None

    def metrics(self) -> dict[str, float]:
        """The logged names of these figures (see :data:`UPDATE_METRICS`)."""
        return {
            "loss": self.loss, "pg_loss": self.pg_loss, "clip_frac": self.clip_frac, "kl": self.kl,
            "entropy": self.entropy, "grad_norm": self.grad_norm, "ratio/mean": self.ratio_mean,
            "ratio/max": self.ratio_max, "mismatch/abs_mean": self.mismatch_mean,
            "mismatch/abs_max": self.mismatch_max, "is/weight_mean": self.is_weight_mean,
            "is/weight_max": self.is_weight_max, "is/trunc_frac": self.is_trunc_frac,
            "train/attempts": float(self.trained_attempts), "train/tokens": float(self.trained_tokens),
            "train/skipped_zero_adv": float(self.skipped_attempts),
            **({"distill/reverse_kl": self.distill_reverse_kl} if self.distill_reverse_kl is not None else {}),
        }


# The metrics an update logs every step, whatever the objective's variant (distillation adds distill/reverse_kl).
UPDATE_METRICS: tuple[str, ...] = tuple(UpdateStats().metrics())


@dataclass
class _FirstPass:
    """Sums over the first iteration's trained tokens (divided by the token count at the end)."""

    entropy: float = 0.0
    clip: float = 0.0
    kl: float = 0.0
    mismatch: float = 0.0
    mismatch_max: float = 0.0
    is_weight: float = 0.0
    is_weight_max: float = 0.0
    is_trunc: float = 0.0


def compute_advantages(trajs: list[Trajectory], objective: Objective) -> tuple[GroupAdvantages, FilterResult]:
    """Advantages from rewards (written into each trajectory) and the attempt filters.

    Infrastructure failures are left out first (docs/design.md, "Failures"): an attempt whose
    ``failure`` stood gets no advantage, is in no group's mean or std and never enters the
    loss; a group left with fewer than 2 attempts that ran is dropped whole (its attempts get
    no advantage either). The advantages of the rest are exactly those computed from them
    alone. The returned GroupAdvantages describe the surviving attempts and groups; the
    FilterResult's ``keep`` has one entry per trajectory of ``trajs``.
    """
    ran: dict[str, set[int]] = {}
    failed = {(t.group_id, t.sample_index) for t in trajs if t.failure is not None}
    for t in trajs:
        if (t.group_id, t.sample_index) not in failed:
            ran.setdefault(t.group_id, set()).add(t.sample_index)
    dropped = {g for g, _ in failed if len(ran.get(g, ())) < 2}  # only failures leave a group short
    inside = [(t.group_id, t.sample_index) not in failed and t.group_id not in dropped for t in trajs]
    if all(inside):
        return _advantages(trajs, objective)
    survivors = [t for t, ok in zip(trajs, inside) if ok]
    adv, filt = _advantages(survivors, objective)
    keep = torch.zeros(len(trajs), dtype=torch.bool)
    keep[torch.tensor([i for i, ok in enumerate(inside) if ok], dtype=torch.long)] = filt.keep
    for t, ok in zip(trajs, inside):
        if not ok:
            t.trained.advantage = None
    heads = {(t.group_id, t.sample_index) for t, ok in zip(trajs, inside) if not ok}
    return adv, dataclasses.replace(filt, keep=keep, excluded_infra=len(heads), dropped_infra_groups=len(dropped))


def _advantages(trajs: list[Trajectory], objective: Objective) -> tuple[GroupAdvantages, FilterResult]:
    if not trajs:  # a rank with no prompt this step (fewer prompts than ranks), or nothing ran
        empty = torch.zeros(0, dtype=torch.bool)
        return (GroupAdvantages(torch.zeros(0, dtype=torch.float64), empty, torch.zeros(0, dtype=torch.long), []),
                FilterResult(keep=empty, zero_variance_groups=0, dropped_zero_variance=0, masked_truncated=0,
                             dropped_void=0))
    # One advantage per attempt: the segments of a split attempt (same group and sample index)
    # share it and count once in their group's mean and std.
    number: dict[tuple[str, int], int] = {}  # attempt -> its index among attempts
    row = [number.setdefault((t.group_id, t.sample_index), len(number)) for t in trajs]
    firsts = {}  # attempt index -> its first trajectory
    for i, a in enumerate(row):
        firsts.setdefault(a, i)
    attempts = [trajs[firsts[a]] for a in range(len(number))] if len(number) < len(trajs) else trajs
    rewards = torch.tensor([float(t.reward or 0.0) for t in attempts], dtype=torch.float64)
    adv = objective.advantages(rewards, [t.group_id for t in attempts])
    if attempts is not trajs:
        at = torch.tensor(row)
        adv = dataclasses.replace(adv, advantages=adv.advantages[at], group_index=adv.group_index[at])
    for t, a in zip(trajs, adv.advantages.tolist()):
        t.trained.advantage = float(a)
    filt = objective.select(adv, [t.finish_reason for t in trajs], [t.void_turns > 0 for t in trajs])
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


def _one_cast_per_pass(model, settings: UpdateSettings):
    """An autocast region around a pass over the micro-batches: autocast keeps its bfloat16
    copy of each weight until the outermost region exits, so the weights are cast once per
    pass, not once per micro-batch (score_tokens' own region nests inside; the same values).
    Not under FSDP: the cache would keep every gathered layer's copy for the whole pass. Off,
    no region at all: a disabled ``torch.autocast`` still counts as one and keeps the cache."""
    from torch.distributed.tensor import DTensor

    if settings.autocast != "bf16" or any(isinstance(p, DTensor) for p in model.parameters()):
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(settings.device).type, dtype=torch.bfloat16)


def grpo_update(model, optimizer, scheduler, trajs: list[Trajectory], keep: list[bool], objective: Objective,
                settings: UpdateSettings, ref_model=None, teacher_model=None) -> UpdateStats:
    """Apply ``settings.num_iterations`` optimizer steps of ``objective`` on the kept
    trajectories; fill their ``old_logprobs``. ``ref_model``: the KL term's reference (β > 0);
    ``teacher_model``: the teacher of on-policy distillation (``objective.uses_teacher``), both
    frozen and only scored (a forward per micro-batch, once per step, no sampling).

    Under torchrun, ``trajs`` are this rank's; every rank must call this (collectively).
    """
    if objective.uses_teacher and teacher_model is None:
        raise ValueError("algo.distill needs the teacher's log-probs: pass teacher_model=")
    stats = UpdateStats()
    kept = [trajs[i] for i, k in enumerate(keep) if k and sum(trajs[i].loss_mask) > 0]
    # With no KL term an attempt of advantage 0 has loss 0 at every token, so exactly zero
    # gradient: it stays in the normalizers (the objective's counts) but not in the passes.
    # Not under distillation: there A_t = [A_i +] coef·(log π_T - log μ) is not 0 when A_i is.
    skip = settings.skip_zero_advantage and not objective.uses_reference and not objective.uses_teacher
    rows = [t for t in kept if not skip or (t.advantage or 0.0) != 0.0]
    plan = plan_micro_batches([len(t.token_ids) for t in rows], settings.micro_batch_tokens,
                              [t.group_id for t in rows] if settings.share_prefix else None) if rows else []
    seqs_f, tokens_f, skipped_f, seen_f = sum_floats([len(kept), sum(sum(t.loss_mask) for t in kept),
                                                      len(kept) - len(rows), sum(sum(t.loss_mask) for t in rows)])
    total_seqs, total_tokens = int(seqs_f), int(tokens_f)
    if total_seqs == 0:
        return stats
    stats.trained_attempts, stats.trained_tokens, stats.skipped_attempts = total_seqs, total_tokens, int(skipped_f)
    seen_tokens = max(1, int(seen_f))  # the diagnostics' denominator: tokens that went through the model
    pad_id, device, temperature = settings.pad_id, settings.device, objective.temperature
    batches = [collate(rows, p, pad_id, device) for p in plan]
    n_batches = int(max_floats([len(batches)])[0])
    batches += [empty_micro_batch(pad_id, device) for _ in range(n_batches - len(batches))]
    adv_all = torch.tensor([float(t.advantage or 0.0) for t in rows])

    # π_old: computed once per step. With a single iteration the first pass's own
    # (detached) log-probs are π_old exactly, so the extra forward is skipped.
    old: list[torch.Tensor | None] = [None] * len(batches)
    ref: list[torch.Tensor | None] = [None] * len(batches)
    # the advantage of each micro-batch: A_i per row, or distillation's A_t per token (fixed
    # across the iterations: it is made of the sampler's and the teacher's log-probs)
    advs = [adv_all[mb.indices] if mb.indices else torch.zeros(mb.input_ids.shape[0]) for mb in batches]
    rkl_sum = 0.0
    with torch.no_grad(), _one_cast_per_pass(model, settings):
        for b, mb in enumerate(batches):
            if settings.num_iterations > 1:
                old[b] = score_tokens(model, mb, temperature, settings.autocast, settings.share_prefix,
                                   settings.fused_head)[0]
            if ref_model is not None and objective.uses_reference:
                ref[b] = score_tokens(ref_model, mb, temperature, settings.autocast, settings.share_prefix,
                                   settings.fused_head)[0]
            if objective.uses_teacher:
                teacher = score_tokens(teacher_model, mb, temperature, settings.autocast, settings.share_prefix,
                                   settings.fused_head)[0]
                advs[b], rkl = objective.token_advantages(advs[b].to(teacher.device), mb.sampler_logprobs, teacher,
                                                          mb.loss_mask)
                rkl_sum += float(rkl.sum())

    first = _FirstPass()
    for it in range(settings.num_iterations):
        optimizer.zero_grad(set_to_none=True)
        if not batches:  # every attempt skipped on every rank: the step a zero gradient makes
            for p in model.parameters():
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
        loss_sum = pg_sum = 0.0
        rmax, rsum = 0.0, 0.0
        # the copies are dropped at the exit, before the step changes the weights
        with _one_cast_per_pass(model, settings):
            for b, mb in enumerate(batches):
                lp, ent = score_tokens(model, mb, temperature, settings.autocast, settings.share_prefix,
                                   settings.fused_head)
                if old[b] is None:
                    old[b] = lp.detach()
                isw = objective.is_weights(old[b], mb.sampler_logprobs, mb.loss_mask)
                out = objective.policy_loss(lp, old[b], advs[b], mb.loss_mask, total_seqs=total_seqs,
                                            total_tokens=total_tokens, is_weights=isw, ref_logprobs=ref[b])
                out.loss.backward()
                ntok = float(mb.loss_mask.sum())
                loss_sum += float(out.loss.detach())
                pg_sum += float(out.pg_loss)
                rmax = max(rmax, float(out.ratio_max))
                rsum += float(out.ratio_mean) * ntok
                if it == 0:
                    m = mb.loss_mask
                    first.entropy += float((ent.detach() * m).sum())
                    first.clip += float(out.clip_frac) * ntok
                    first.kl += float(out.kl) * ntok
                    diff = (old[b] - mb.sampler_logprobs).abs() * m
                    first.mismatch += float(diff.sum())
                    first.mismatch_max = max(first.mismatch_max, float(diff.max()))
                    if isw is not None:
                        first.is_weight += float((isw * m).sum())
                        first.is_trunc += float(((isw >= objective.is_cap - 1e-6).float() * m).sum())
                        first.is_weight_max = max(first.is_weight_max, float((isw * m).max()))
        # listed here, after the passes: FSDP2 swaps in the parameters that carry the gradients
        gn = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad],
                                            settings.max_grad_norm)
        optimizer.step()
        scheduler.step()
        loss_sum, pg_sum, rsum = sum_floats([loss_sum, pg_sum, rsum])
        stats.loss, stats.pg_loss, stats.grad_norm = loss_sum, pg_sum, _full_norm(gn)
        stats.ratio_mean = rsum / seen_tokens if int(seen_f) else 1.0
        stats.ratio_max = max_floats([rmax])[0] if int(seen_f) else 1.0
    optimizer.zero_grad(set_to_none=True)

    ent, clip, kl, mis, isw_sum, trunc = sum_floats(
        [first.entropy, first.clip, first.kl, first.mismatch, first.is_weight, first.is_trunc])
    stats.mismatch_max = max_floats([first.mismatch_max])[0]
    stats.entropy, stats.clip_frac, stats.kl = ent / seen_tokens, clip / seen_tokens, kl / seen_tokens
    stats.mismatch_mean = mis / seen_tokens
    if objective.uses_teacher:  # nothing is skipped under distillation: the mean of every trained token
        stats.distill_reverse_kl = sum_floats([rkl_sum])[0] / seen_tokens
    if objective.uses_is_weights and int(seen_f):
        stats.is_weight_mean = isw_sum / seen_tokens
        stats.is_trunc_frac = trunc / seen_tokens
        stats.is_weight_max = max_floats([first.is_weight_max])[0]
    for b, mb in enumerate(batches):
        o = (old[b] * mb.loss_mask).tolist()
        for r, i in enumerate(mb.indices):
            rows[i].trained.old_logprobs = [float(x) for x in o[r][: len(rows[i].token_ids)]]
    return stats
