"""The surrogates of ``algo.loss`` (agentrl/algo/surrogates) against numbers computed by hand
(arithmetic in the comments, evaluated with ``math`` on plain floats, never with the code under
test); the degenerate cases every surrogate must get right; ``clip`` unchanged bit for bit
against a frozen copy of ``policy_loss`` as it was before the registry (commit e803935)."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import random

import pytest

from synthetic_trajectories import seeded_update_batch
import torch

from agentrl.algo.grpo import PolicyLossOutput, aggregate, kl_penalty, policy_loss, truncated_is_weights
from agentrl.algo.objective import Objective
from agentrl.algo.settings import AlgoConfig
from agentrl.algo.surrogates import FIELD_CLASSES, SURROGATES, SurrogateName
from agentrl.algo.surrogates.cispo import cispo_loss
from agentrl.algo.surrogates.gspo import gspo_loss
from agentrl.algo.surrogates.gspo_token import gspo_token_loss
from agentrl.run.config import load_config
from agentrl.types import ConfigError

E = math.e
NAN, INF = float("nan"), float("inf")


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def close(got: torch.Tensor, want, atol: float = 1e-5) -> None:
    want_t = torch.as_tensor(want, dtype=torch.float64)
    assert torch.allclose(got.detach().double(), want_t, atol=atol, rtol=0), (got, want)


def run(loss: str, lp, old, adv, mask, *, is_weights=None, ref=None, **cfg) -> tuple[PolicyLossOutput, torch.Tensor]:
    """Objective(loss=...).policy_loss on one micro-batch that is the whole batch; (output, d loss / d lp).
    With algo.is_level set and no ``is_weights``, the sampler is taken 0.1 nats below π_old."""
    x = torch.as_tensor(lp, dtype=torch.float32).clone().requires_grad_(True)
    m = torch.as_tensor(mask, dtype=torch.float32)
    old = torch.as_tensor(old, dtype=torch.float32)
    obj = Objective(loss=loss, **cfg)
    if is_weights is None and obj.uses_is_weights:
        is_weights = obj.is_weights(old, old - 0.1, m)
    out = obj.policy_loss(x, old, torch.as_tensor(adv, dtype=torch.float32), m,
                          total_seqs=int((m.sum(1) > 0).sum()), total_tokens=int(m.sum()), is_weights=is_weights,
                          ref_logprobs=ref)
    out.loss.backward()
    return out, x.grad


# ---------------------------------------------------------------- clip: unchanged bit for bit


def _policy_loss_v0(logprobs, old_logprobs, advantages, mask, *, eps_low=0.2, eps_high=0.2, dual_clip=None,
                    agg="seq-mean-token-mean", total_seqs=None, total_tokens=None, norm_len=None, is_weights=None,
                    ref_logprobs=None, kl_coef=0.0, kl_estimator="k3"):
    """agentrl.algo.grpo.policy_loss at commit e803935 (before the surrogate registry), verbatim
    but for its argument checks: the oracle the clip surrogate must match bit for bit."""
    m = mask.bool()
    zero = torch.zeros_like(logprobs)
    log_ratio = torch.where(m, logprobs - old_logprobs.detach(), zero)
    ratio = torch.exp(log_ratio.clamp(-20.0, 20.0))
    adv = advantages.detach().to(logprobs.dtype)[:, None]
    loss_unclipped = -ratio * adv
    loss_clipped = -ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    pg = torch.maximum(loss_unclipped, loss_clipped)
    clipped = m & (loss_clipped > loss_unclipped)
    dual = torch.zeros_like(m)
    if dual_clip is not None:
        cap = -dual_clip * adv
        dual = m & (adv < 0) & (pg > cap)
        pg = torch.where(adv < 0, torch.minimum(pg, cap), pg)
    if is_weights is not None:
        pg = pg * torch.where(m, is_weights.detach().to(pg.dtype), zero)
    per_token = pg
    kl_tok = None
    if ref_logprobs is not None:
        kl_tok = kl_penalty(torch.where(m, logprobs, zero),
                            torch.where(m, ref_logprobs.detach().to(logprobs.dtype), zero), kl_estimator)
        if kl_coef > 0:
            per_token = pg + kl_coef * kl_tok
    counts = dict(total_seqs=total_seqs, total_tokens=total_tokens, norm_len=norm_len)
    loss = aggregate(per_token, mask, agg, **counts)
    with torch.no_grad():
        n = m.sum()
        denom = n.clamp(min=1).to(logprobs.dtype)
        masked_ratio = torch.where(m, ratio, zero)
        return PolicyLossOutput(
            loss=loss, pg_loss=aggregate(pg.detach(), mask, agg, **counts),
            kl=(torch.where(m, kl_tok, zero).sum() / denom) if kl_tok is not None else zero.sum(),
            clip_frac=clipped.sum() / denom, dual_clip_frac=dual.sum() / denom, ratio_mean=masked_ratio.sum() / denom,
            ratio_max=masked_ratio.max() if n > 0 else zero.sum(), num_tokens=n)


def _random_batch(seed: int):
    """[5, 7] log-probs with ratios far inside and outside the clip, a row with nothing trained,
    an advantage of 0, and NaN/inf at masked positions."""
    g = torch.Generator().manual_seed(seed)
    lp = torch.randn(5, 7, generator=g) * 0.5 - 1.0
    old, ref = lp + torch.randn(5, 7, generator=g) * 0.3, lp + torch.randn(5, 7, generator=g) * 0.4
    mu = old + torch.randn(5, 7, generator=g) * 0.2
    adv, mask = torch.randn(5, generator=g), (torch.rand(5, 7, generator=g) > 0.3).float()
    adv[1], mask[2] = 0.0, 0.0
    lp[0, 0], old[3, 1], ref[4, 2] = NAN, INF, -INF
    mask[0, 0] = mask[3, 1] = mask[4, 2] = 0.0
    return lp, old, mu, ref, adv, mask


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32) if t.dtype == torch.float32 else t


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("kl", [(0.0, "k3"), (0.05, "k1"), (0.05, "k2"), (0.05, "k3")])
@pytest.mark.parametrize("is_level", ["none", "token", "sequence"])
def test_clip_is_the_old_policy_loss_bit_for_bit(agg, kl, is_level):
    for seed, (el, eh), dual in itertools.product(range(2), [(0.2, 0.2), (0.2, 0.28), (0.05, 0.1)], [None, 3.0]):
        lp, old, mu, ref, adv, mask = _random_batch(seed)
        obj = Objective(eps_low=el, eps_high=eh, dual_clip=dual, agg=agg, norm_len=11, kl_coef=kl[0],
                        kl_estimator=kl[1], is_level=is_level, is_cap=1.5)
        w = obj.is_weights(old, mu, mask)
        kw = dict(eps_low=el, eps_high=eh, dual_clip=dual, agg=agg, norm_len=11, total_seqs=6, total_tokens=40,
                  is_weights=w, ref_logprobs=ref, kl_coef=kl[0], kl_estimator=kl[1])
        # the objective passes the reference only with β > 0 (as it always did)
        kw_obj = {**kw, "ref_logprobs": ref if kl[0] > 0 else None}
        pairs = [(policy_loss, kw), (lambda *a, **_: obj.policy_loss(*a, total_seqs=6, total_tokens=40, is_weights=w,
                                                                     ref_logprobs=ref), kw_obj)]
        for fn, args in pairs:
            (want, want_g), (got, got_g) = [_with_grad(f, lp, old, adv, mask, args) for f in (_policy_loss_v0, fn)]
            assert torch.equal(_bits(got_g), _bits(want_g)), (seed, el, eh, dual)
            for f in dataclasses.fields(PolicyLossOutput):
                a, b = getattr(got, f.name).detach(), getattr(want, f.name).detach()
                assert a.dtype == b.dtype and torch.equal(_bits(a), _bits(b)), (f.name, seed, el, eh, dual)


def _with_grad(fn, lp, old, adv, mask, kw):
    x = lp.clone().requires_grad_(True)
    out = fn(x, old, adv, mask, **kw)
    out.loss.backward()
    return out, x.grad


def test_clip_prints_the_block_it_always_printed():
    # the default block of docs/design.md, and every option on (recorded from commit e803935)
    assert Objective().describe() == "\n".join([
        "── objective ───────────────────────────────────────────────",
        " advantage   A_i = (r_i - mean(r)) / std(r)   std=population, floor=1e-06 (zero-variance group -> A=0)",
        " surrogate   L_t = -min(ρA, clip(ρ, 1-0.2, 1+0.2)A),  ρ = π_θ/π_old",
        " aggregate   1/G Σ_i 1/|y_i| Σ_t L_t   (seq-mean-token-mean)",
        " KL          none (β = 0, no reference model loaded)",
        " IS weight   off (π_old is the sampler)",
        " filters     none",
        "────────────────────────────────────────────────────────────"])
    full = Objective(std="sample", scale="none", eps_low=0.1, eps_high=0.28, dual_clip=3.0,
                     agg="seq-mean-token-sum-norm", norm_len=512, kl_coef=0.1, kl_estimator="k2", is_level="sequence",
                     is_cap=1.5, drop_zero_variance=True, refill_batch=True, mask_truncated=True, drop_void_turns=True,
                     sampling="G=4")
    assert full.describe() == (
        "── objective ───────────────────────────────────────────────\n advantage   A_i = r_i - mean(r)   (Dr. GRPO:"
        " no std division)   std=sample, floor=1e-06 (zero-variance group -> A=0)\n surrogate   L_t = -min(ρA, clip(ρ,"
        " 1-0.1, 1+0.28)A),  ρ = π_θ/π_old;  dual-clip for A<0: L_t = min(L_t, -3.0·A)\n aggregate   Σ_i Σ_t L_t /"
        " (G · 512)   (seq-mean-token-sum-norm, Dr. GRPO)\n KL          β=0.1, estimator k2\n IS weight   min(π_old/μ,"
        " 1.5) at sequence level\n filters     drop zero-variance groups (refill batch), mask truncated attempts, drop"
        " attempts with void turns\n sampling    G=4\n────────────────────────────────────────────────────────────")


# ---------------------------------------------------------------- gspo and gspo_token


# Row 0: trained tokens d = log π_θ - log π_old = [0.3, -0.1] (the third is masked, NaN/inf), A = 1.
# Row 1: d = [0.2, -0.5, 0.0], A = -2.  Row 2: d = [2e-4, 0] (third masked), A = 0.5.
GSPO_LP = [[0.3, -0.1, NAN], [0.2, -0.5, 0.0], [2e-4, 0.0, NAN]]
GSPO_OLD = [[0.0, 0.0, INF], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
GSPO_MASK = [[1, 1, 0], [1, 1, 1], [1, 1, 0]]
GSPO_ADV = [1.0, -2.0, 0.5]
S = [math.exp((0.3 - 0.1) / 2), math.exp((0.2 - 0.5 + 0.0) / 3), math.exp(2e-4 / 2)]  # e^0.1, e^-0.1, e^1e-4


@pytest.mark.parametrize("loss", ["gspo", "gspo_token"])
def test_gspo_wide_clip_is_the_sequence_ratio_policy_gradient(loss):
    # ε = 0.2: every s_i inside [0.8, 1.2], L_i = -s_i A_i; loss = (1/3) Σ_i L_i
    out, g = run(loss, GSPO_LP, GSPO_OLD, GSPO_ADV, GSPO_MASK, gspo_eps_low=0.2, gspo_eps_high=0.2)
    close(out.loss, (-S[0] * 1.0 - S[1] * -2.0 - S[2] * 0.5) / 3)
    # d L_i / d log π_t = -A_i s_i / |y_i|, times 1/G: row 0: -e^0.1/2/3, row 1: 2 e^-0.1/3/3, row 2: -0.5 e^1e-4/2/3
    close(g, [[-S[0] / 6, -S[0] / 6, 0.0], [2 * S[1] / 9] * 3, [-0.5 * S[2] / 6, -0.5 * S[2] / 6, 0.0]])
    assert out.clip_frac.item() == 0.0
    close(out.ratio_max, math.exp(0.3))  # the metric stays per token


@pytest.mark.parametrize("loss", ["gspo", "gspo_token"])
def test_gspo_paper_clip_cuts_whole_attempts(loss):
    # ε = 3e-4 / 4e-4: row 0, s = 1.105 > 1.0004 with A > 0: L = -1.0004 A, clipped (no gradient);
    # row 1, s = 0.905 < 0.9997 with A < 0: min(sA, 0.9997 A) = 0.9997·(-2): L = 1.9994, clipped;
    # row 2, s = 1.0001 inside: L = -0.5 s
    out, g = run(loss, GSPO_LP, GSPO_OLD, GSPO_ADV, GSPO_MASK)
    close(out.loss, (-1.0004 + 1.9994 - 0.5 * S[2]) / 3)
    close(g, [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [-0.5 * S[2] / 6, -0.5 * S[2] / 6, 0.0]])
    close(out.clip_frac, 5 / 7)  # the 2 + 3 tokens of the clipped attempts, of 7


def test_gspo_takes_the_sequence_is_weight_and_the_kl_term():
    # w_i multiplies L_i; β·KL_t is added per token (k1: log π_θ - log π_ref), so 1/G Σ_i (w_i L_i + β mean_t KL_t)
    w = torch.tensor([[2.0, 2.0, 0.0], [0.5, 0.5, 0.5], [1.0, 1.0, 0.0]])
    ref = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    out, g = run("gspo", GSPO_LP, GSPO_OLD, GSPO_ADV, GSPO_MASK, is_weights=w, ref=ref, gspo_eps_low=0.2,
                 gspo_eps_high=0.2, kl_coef=0.1, kl_estimator="k1", is_level="sequence")
    kl_means = [(0.3 - 0.1) / 2, (0.2 - 0.5) / 3, 2e-4 / 2]
    close(out.loss, sum(wi * -s * a + 0.1 * k for wi, s, a, k in zip([2.0, 0.5, 1.0], S, GSPO_ADV, kl_means)) / 3)
    # row 1 token: (0.5 · 2 e^-0.1 / 3 + 0.1 / 3) / 3
    close(g[1], [(0.5 * 2 * S[1] / 3 + 0.1 / 3) / 3] * 3)


def test_gspo_token_has_gspo_gradient_whenever_a_is_constant_per_attempt():
    # here it always is (one A_i per attempt): on random batches, clipped or not, the two agree
    for seed in range(4):
        lp, old, _, _, adv, mask = _random_batch(seed)
        old = lp + (old - lp) * 0.01  # ratios near 1: some attempts inside the 3e-4 band, some out
        old[3, 1] = INF
        for eps in [(3e-4, 4e-4), (0.2, 0.2)]:
            a, ga = run("gspo", lp, old, adv, mask, gspo_eps_low=eps[0], gspo_eps_high=eps[1])
            b, gb = run("gspo_token", lp, old, adv, mask, gspo_eps_low=eps[0], gspo_eps_high=eps[1])
            assert torch.allclose(ga, gb, atol=1e-7) and torch.isfinite(ga).all()
            close(b.loss, a.loss.item(), atol=1e-6)
            assert a.clip_frac.item() == b.clip_frac.item()


# ---------------------------------------------------------------- cispo


# Row 0: log π_θ = [-1, -2, NaN(masked)], log π_old = [-1.5, -2, 0]: ρ = [e^0.5, 1], A = 1.
# Row 1: log π_θ = [-0.5, -3, -1], log π_old = [-0.5, -1, -1.2]: ρ = [1, e^-2, e^0.2], A = -0.5.
CISPO_LP = [[-1.0, -2.0, NAN], [-0.5, -3.0, -1.0]]
CISPO_OLD = [[-1.5, -2.0, 0.0], [-0.5, -1.0, -1.2]]
CISPO_MASK = [[1, 1, 0], [1, 1, 1]]


def test_cispo_clips_the_weight_and_keeps_every_gradient():
    # ε_low = 1 (no floor), ε_high = 0.2: row 0 w = [min(e^0.5, 1.2), 1] = [1.2, 1];
    # row 1 w = [1, e^-2, min(e^0.2, 1.2)] = [1, e^-2, 1.2]
    out, g = run("cispo", CISPO_LP, CISPO_OLD, [1.0, -0.5], CISPO_MASK, cispo_eps_high=0.2, agg="token-mean")
    # L_t = -w A log π: row 0: [-1.2·1·-1, -1·1·-2] = [1.2, 2]; row 1: 0.5·w·log π = [-0.25, -1.5 e^-2, -0.6]
    close(out.loss, (1.2 + 2.0 - 0.25 - 1.5 * math.exp(-2) - 0.6) / 5)
    # token-mean over 5 tokens: ∇ = -w A / 5
    close(g, [[-1.2 / 5, -1.0 / 5, 0.0], [0.5 / 5, 0.5 * math.exp(-2) / 5, 0.5 * 1.2 / 5]])
    close(out.clip_frac, 2 / 5)  # e^0.5 and e^0.2 above 1.2; e^-2 has no floor
    # ε_low = 0.2 too: e^-2 < 0.8 is raised to 0.8
    out, g = run("cispo", CISPO_LP, CISPO_OLD, [1.0, -0.5], CISPO_MASK, cispo_eps_low=0.2, cispo_eps_high=0.2,
                 agg="token-mean")
    close(g[1, 1], 0.5 * 0.8 / 5)
    close(out.clip_frac, 3 / 5)


def test_cispo_defaults_and_the_token_is_weight():
    # defaults: cap 1 + 3 = 4 (e^0.5 = 1.65 is under it); seq-mean-token-mean: ∇ = -w_IS · w A / (G |y_i|)
    w_is = torch.tensor([[0.5, 2.0, 0.0], [1.0, 1.0, 1.0]])
    out, g = run("cispo", CISPO_LP, CISPO_OLD, [1.0, -0.5], CISPO_MASK, is_weights=w_is, is_level="token")
    close(g[0], [-0.5 * math.exp(0.5) / 4, -2.0 / 4, 0.0])
    close(g[1], [0.5 / 6, 0.5 * math.exp(-2) / 6, 0.5 * math.exp(0.2) / 6])
    assert out.clip_frac.item() == 0.0
    # L_t = -w_IS w A log π: row 0 [0.5 e^0.5, 2·2], row 1 0.5 w log π = [-0.25, -1.5 e^-2, -0.5 e^0.2]
    row0, row1 = (0.5 * math.exp(0.5) + 2.0 * 2.0) / 2, (-0.25 - 1.5 * math.exp(-2) - 0.5 * math.exp(0.2)) / 3
    close(out.loss, (row0 + row1) / 2)


# ---------------------------------------------------------------- sapo


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


@pytest.mark.parametrize("tau_pos, tau_neg", [(1.0, 1.05), (2.0, 3.0)])
def test_sapo_gate_by_hand(tau_pos, tau_neg):
    # row 0: d = [0.5, -0.3] (third masked), A = 1.5, τ = τ_pos; row 1: d = [0.2, 0, -0.4], A = -1, τ = τ_neg
    lp, mask, adv = [[0.5, -0.3, NAN], [0.2, 0.0, -0.4]], [[1, 1, 0], [1, 1, 1]], [1.5, -1.0]
    old = [[0.0, 0.0, INF], [0.0, 0.0, 0.0]]
    out, g = run("sapo", lp, old, adv, mask, sapo_tau_pos=tau_pos, sapo_tau_neg=tau_neg)
    rows = [([0.5, -0.3], 1.5, tau_pos), ([0.2, 0.0, -0.4], -1.0, tau_neg)]
    # L_t = -σ(τ(ρ-1))·4/τ·A; ∇ = -A·4σ(1-σ)·ρ / (G |y_i|), G = 2; clip_frac = mean(1 - 4σ(1-σ))
    want_loss, want_g, removed = 0.0, [], []
    for ds, a, tau in rows:
        sig = [_sigmoid(tau * (math.exp(d) - 1)) for d in ds]
        want_loss += sum(-sg * 4 / tau * a for sg in sig) / len(ds) / 2
        grad = [-a * 4 * sg * (1 - sg) * math.exp(d) / (2 * len(ds)) for sg, d in zip(sig, ds)]
        want_g.append(grad + [0.0] * (3 - len(ds)))
        removed += [1 - 4 * sg * (1 - sg) for sg in sig]
    close(out.loss, want_loss)
    close(g, want_g)
    close(out.clip_frac, sum(removed) / 5)


def test_sapo_at_ratio_one_and_its_line():
    out, g = run("sapo", [[-1.0, -2.0]], [[-1.0, -2.0]], [2.0], [[1, 1]])
    close(out.loss, -2 / 1.0 * 2.0)  # f(1) = σ(0)·4/τ = 2/τ
    close(g, [[-2.0 / 2, -2.0 / 2]])  # the plain policy gradient
    assert out.clip_frac.item() == 0.0
    assert Objective(loss="sapo").describe().splitlines()[2] == SURROGATE_LINES["sapo"]
    with pytest.raises(ConfigError, match="algo.sapo_tau_neg=0.0 is out of range: use > 0"):
        load_config(None, ["algo.loss=sapo", "algo.sapo_tau_neg=0"])
    assert (load_config(None).algo.sapo_tau_pos, load_config(None).algo.sapo_tau_neg) == (1.0, 1.05)  # Gao et al.


# ---------------------------------------------------------------- every surrogate: degenerate cases


def _settings(name: str) -> list[dict]:
    """Each shared option the surrogate accepts, one at a time."""
    s = SURROGATES[name]
    return [dict(agg=a, norm_len=7) for a in s.aggs] + [dict(is_level=lv) for lv in s.is_levels if lv != "none"]


@pytest.mark.parametrize("name", list(SURROGATES))
def test_at_ratio_one_every_surrogate_is_the_plain_policy_gradient(name):
    # lp == old: ∇ = -A_i m_t / normalizer: G |y_i| (seq-mean-token-mean), N (token-mean), G · norm_len
    lp = [[-1.0, -0.2, -3.0, NAN], [-0.7, -1.1, -2.0, -0.4]]
    mask, adv = [[1, 1, 1, 0], [0, 1, 1, 1]], [0.8, -1.5]
    for agg in SURROGATES[name].aggs:
        _, g = run(name, lp, [[x if x == x else 0.0 for x in row] for row in lp], adv, mask, agg=agg, norm_len=7)
        norm = {"seq-mean-token-mean": [2 * 3, 2 * 3], "token-mean": [6, 6], "seq-mean-token-sum-norm": [14, 14]}[agg]
        close(g, [[-adv[i] * mask[i][t] / norm[i] for t in range(4)] for i in range(2)])


@pytest.mark.parametrize("name", list(SURROGATES))
def test_one_token(name):
    for d in (0.0, 0.05, -3.0):  # log-ratio: at 1, just above, far below
        out, g = run(name, [[-1.0 + d]], [[-1.0]], [2.0], [[1]])
        assert torch.isfinite(out.loss) and torch.isfinite(g).all() and out.num_tokens.item() == 1
        if d == 0.0:
            close(g, [[-2.0]])


@pytest.mark.parametrize("name", list(SURROGATES))
def test_a_row_with_nothing_trained_adds_nothing(name):
    lp, old = [[-0.5, -1.3, -0.2], [NAN, INF, -INF]], [[-0.7, -1.0, -0.2], [INF, NAN, 0.0]]
    for cfg in _settings(name):
        both, g = run(name, lp, old, [1.5, -4.0], [[1, 0, 1], [0, 0, 0]], **cfg)
        alone, g1 = run(name, lp[:1], old[:1], [1.5], [[1, 0, 1]], **cfg)
        assert torch.equal(both.loss, alone.loss) and torch.equal(g[:1], g1), cfg
        assert torch.equal(g[1], torch.zeros(3)) and both.num_tokens.item() == 2


@pytest.mark.parametrize("name", list(SURROGATES))
def test_zero_advantage_gives_zero_loss_and_gradient(name):
    # what lets the update skip such attempts (agentrl/algo/update.py) whatever the surrogate
    for cfg in _settings(name):
        out, g = run(name, [[-0.5, -1.3, -0.2]], [[-0.9, -1.0, -0.6]], [0.0], [[1, 1, 1]], **cfg)
        assert out.loss.item() == 0.0 and torch.equal(g, torch.zeros(1, 3)), cfg


@pytest.mark.parametrize("name", list(SURROGATES))
def test_inf_and_nan_at_untrained_positions_never_reach_loss_or_gradient(name):
    lp, old, mu, ref, adv, mask = _random_batch(0)
    lp[mask == 0], old[mask == 0] = NAN, INF
    t = int(mask[0].nonzero()[0])
    old[0, t] = old[0, t] - 40.0  # a trained log-ratio of ~+40: clamped at 20, finite
    for cfg in _settings(name):
        obj = Objective(loss=name, kl_coef=0.1, **cfg)
        w = obj.is_weights(old, mu, mask) if obj.uses_is_weights else None
        out, g = run(name, lp, old, adv, mask, is_weights=w, ref=ref, kl_coef=0.1, **cfg)
        assert torch.isfinite(out.loss) and torch.isfinite(g).all(), cfg
        assert torch.equal(g[mask == 0], torch.zeros(int((mask == 0).sum()))), cfg
        assert all(torch.isfinite(getattr(out, f.name)).all() for f in dataclasses.fields(out))


# ---------------------------------------------------------------- printed block, config, registry


SURROGATE_LINES = {
    "clip": " surrogate   L_t = -min(ρA, clip(ρ, 1-0.2, 1+0.2)A),  ρ = π_θ/π_old",
    "cispo": " surrogate   L_t = -sg(min(ρ, 1+3.0))·A·log π_θ(y_t),  ρ = π_θ/π_old   (CISPO)",
    "gspo": " surrogate   L_t = L_i = -min(s_i A, clip(s_i, 1-0.0003, 1+0.0004)A),  s_i = (π_θ/π_old)(y_i)^(1/|y_i|)"
            "   (GSPO)",
    "gspo_token": " surrogate   L_t = -min(s_t A, clip(s_t, 1-0.0003, 1+0.0004)A),  "
                  "s_t = sg[s_i]·π_θ(y_t)/sg[π_θ(y_t)],  s_i: GSPO's   (GSPO-token)",
    "sapo": " surrogate   L_t = -f(ρ)A,  f(ρ) = σ(τ(ρ-1))·4/τ,  τ = 1.0 (A>0), 1.05 (A<0),  ρ = π_θ/π_old   (SAPO)",
}


@pytest.mark.parametrize("name", list(SURROGATES))
def test_printed_block_of_each_surrogate(name):
    lines = Objective(loss=name).describe().splitlines()
    assert lines[2] == SURROGATE_LINES[name]
    default = Objective().describe().splitlines()
    assert lines[:2] + lines[3:] == default[:2] + default[3:]  # the other lines are the shared options'


def test_cispo_prints_its_floor_when_it_has_one():
    assert " surrogate   L_t = -sg(clip(ρ, 1-0.2, 1+3.0))·A·log π_θ(y_t)," in Objective(loss="cispo",
                                                                                       cispo_eps_low=0.2).describe()


def test_another_surrogates_keys_are_shown_as_ignored():
    text = Objective(loss="gspo", eps_high=0.28, cispo_eps_high=5.0).describe()
    assert " ignored     algo.eps_high=0.28, algo.cispo_eps_high=5.0 (not read by algo.loss=gspo)" in text
    assert "ignored" not in Objective(loss="gspo_token", gspo_eps_high=1e-3).describe()  # gspo_token reads GSPO's


@pytest.mark.parametrize("overrides, needle", [
    (["algo.loss=gspo", "algo.agg=token-mean"], "algo.agg='token-mean' does not combine with algo.loss=gspo: "
                                                "GSPO's loss is 1/G Σ_i L_i"),
    (["algo.loss=gspo", "algo.agg=token-mean"], "set algo.agg=seq-mean-token-mean"),
    (["algo.loss=gspo", "algo.is_level=token"], "set algo.is_level to one of none, sequence"),
    (["algo.loss=gspo_token", "algo.agg=seq-mean-token-sum-norm"], "does not combine with algo.loss=gspo_token"),
    (["algo.loss=nope"], "algo.loss: 'nope' is not one of ['clip', 'cispo', 'gspo', 'gspo_token'"),
    (["algo.gspo_eps_low=-1"], "algo.gspo_eps_low=-1.0 is out of range: use >= 0"),
    (["algo.cispo_eps_high=-0.5"], "algo.cispo_eps_high=-0.5 is out of range"),
])
def test_config_refusals_name_the_key_and_the_fix(overrides, needle):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert needle in str(e.value)


@pytest.mark.parametrize("name", list(SURROGATES))
def test_every_accepted_combination_builds_and_the_defaults(name):
    s = SURROGATES[name]
    for agg, lv, kl in itertools.product(s.aggs, s.is_levels, [0.0, 0.1]):
        cfg = load_config(None, [f"algo.loss={name}", f"algo.agg={agg}", f"algo.is_level={lv}", f"algo.kl_coef={kl}",
                                 "algo.drop_zero_variance=true", "algo.mask_truncated=true"])
        assert Objective.from_config(cfg).surrogate is s
    cfg = load_config(None)
    assert (cfg.algo.gspo_eps_low, cfg.algo.gspo_eps_high) == (3e-4, 4e-4)  # Zheng et al. 2025
    assert (cfg.algo.cispo_eps_low, cfg.algo.cispo_eps_high) == (1.0, 3.0)  # no floor, cap 4


def test_the_registry():
    assert all(s.name == key for key, s in SURROGATES.items())
    assert list(SURROGATES)[0] == "clip" and list(SurrogateName.__args__) == list(SURROGATES)
    keys = {f.name: f for f in dataclasses.fields(AlgoConfig)}
    for s in SURROGATES.values():
        assert set(s.reads) <= set(keys) and set(s.aggs) and "none" in s.is_levels, s.name
        assert s.refusal(Objective(loss=s.name)) is None  # the shared defaults combine with each
    for cls in FIELD_CLASSES:
        assert cls.__dataclass_params__.frozen and all(f.name in keys for f in dataclasses.fields(cls))
    # every surrogate-specific key is read by some surrogate
    own = {f.name for cls in FIELD_CLASSES for f in dataclasses.fields(cls)}
    assert own == {k for s in SURROGATES.values() for k in s.reads}


# ---------------------------------------------------------------- through the update


def _trajs(seed: int = 0):
    return seeded_update_batch([[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 1.0]], seed)


@pytest.fixture(scope="module")
def tiny_model():
    from transformers import AutoModelForCausalLM

    from agentrl.models.tiny import ensure_tiny_model

    return AutoModelForCausalLM.from_pretrained(ensure_tiny_model(), dtype=torch.float32)


@pytest.mark.parametrize("name", list(SURROGATES))
def test_update_is_the_same_for_any_micro_batch_size_and_with_skipping(tiny_model, name):
    """Two iterations (so ρ moves off 1): micro-batches of one row or of all, skipping the zero-advantage
    attempts or not, give the same parameters: the sequence-level surrogates see whole rows."""
    from agentrl.algo.update import UpdateSettings, compute_advantages, grpo_update

    objective = Objective(loss=name, **({"gspo_eps_low": 0.2, "gspo_eps_high": 0.2} if "gspo" in name else {}))
    results = []
    for tokens, skip in [(16, True), (4096, False)]:
        model, trajs = copy.deepcopy(tiny_model), _trajs()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        _, filt = compute_advantages(trajs, objective)
        stats = grpo_update(model, opt, sched, trajs, filt.keep.tolist(), objective,
                            UpdateSettings(micro_batch_tokens=tokens, num_iterations=2, skip_zero_advantage=skip))
        assert math.isfinite(stats.loss) and stats.grad_norm > 0
        results.append((model, stats))
    (a, sa), (b, sb) = results
    assert sa.loss == pytest.approx(sb.loss, abs=1e-5) and sa.ratio_max != 1.0
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.allclose(pa, pb, atol=1e-5)
