"""The one block a run prints at start: what exactly it optimizes."""

from __future__ import annotations

from agentrl.run.config import Config


def describe_objective(cfg: Config) -> str:
    """Human-readable statement of the resolved objective (advantage, normalizer, clip, KL, IS, filters)."""
    a = cfg.algo
    adv = "A_i = (r_i - mean(r)) / std(r)" if a.scale == "std" else "A_i = r_i - mean(r)   (Dr. GRPO: no std division)"
    norm = {
        "seq-mean-token-mean": "1/G Σ_i 1/|y_i| Σ_t L_t   (seq-mean-token-mean)",
        "token-mean": "Σ_i Σ_t L_t / Σ_i |y_i|   (token-mean, DAPO)",
        "seq-mean-token-sum-norm": f"Σ_i Σ_t L_t / (G · {a.norm_len or cfg.rollout.max_total_tokens})   "
        "(seq-mean-token-sum-norm, Dr. GRPO)",
    }[a.agg]
    clip = f"L_t = -min(ρA, clip(ρ, 1-{a.eps_low}, 1+{a.eps_high})A),  ρ = π_θ/π_old"
    if a.dual_clip:
        clip += f";  dual-clip for A<0: L_t = min(L_t, -{a.dual_clip}·A)"
    kl = "none (β = 0, no reference model loaded)" if a.kl_coef == 0 else f"β={a.kl_coef}, estimator {a.kl_estimator}"
    isw = "off (π_old is the sampler)" if a.is_level == "none" else f"min(π_old/μ, {a.is_cap}) at {a.is_level} level"
    filters = [name for name, on in [
        ("drop zero-variance groups" + (" (refill batch)" if a.refill_batch else ""), a.drop_zero_variance),
        ("mask truncated attempts", a.mask_truncated),
        ("drop attempts with void turns", a.drop_void_turns),
    ] if on]
    lines = [
        "── objective ───────────────────────────────────────────────",
        f" advantage   {adv}   std={a.std}, floor={a.std_floor} (zero-variance group -> A=0)",
        f" surrogate   {clip}",
        f" aggregate   {norm}",
        f" KL          {kl}",
        f" IS weight   {isw}",
        f" filters     {', '.join(filters) if filters else 'none'}",
        f" sampling    G={a.num_samples}, prompts/step={cfg.train.prompts_per_step}, T={cfg.rollout.temperature}, "
        f"iterations/step={cfg.train.num_iterations}, lr={cfg.optim.lr} (warmup {cfg.optim.warmup_steps}, {cfg.optim.schedule})",
        "────────────────────────────────────────────────────────────",
    ]
    return "\n".join(lines)
