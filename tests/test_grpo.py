"""The GRPO objective against numbers computed by hand (arithmetic in the comments)."""

from __future__ import annotations

import doctest
import math

import pytest
import torch

import agentrl.algo.filters
import agentrl.algo.grpo
from agentrl.algo.filters import filter_attempts
from agentrl.algo.grpo import (
    aggregate,
    group_advantages,
    kl_penalty,
    policy_loss,
    token_logprobs,
    truncated_is_weights,
)

E = math.e


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def close(got: torch.Tensor, want, atol: float = 1e-5) -> None:
    want_t = torch.as_tensor(want, dtype=torch.float64)
    assert torch.allclose(got.detach().double().cpu(), want_t, atol=atol, rtol=0), (got, want)


def one_token_loss(log_ratio: float, adv: float, **kw) -> tuple[float, float]:
    """Loss and clip_frac of a single masked token (any agg mode: 1 seq, 1 token)."""
    out = policy_loss(torch.tensor([[log_ratio]]), torch.zeros(1, 1), torch.tensor([adv]), torch.ones(1, 1), **kw)
    return out.loss.item(), out.clip_frac.item()


# ---------------------------------------------------------------- advantages


def test_worked_example_population_std():
    # mean = 3/8 = 0.375; var = (3*0.625^2 + 5*0.375^2)/8 = 1.875/8 = 0.234375; std = 0.4841229
    # success: 0.625/0.4841229 = 1.2910;  failure: -0.375/0.4841229 = -0.7746
    a = group_advantages(torch.tensor([[1.0, 1, 1, 0, 0, 0, 0, 0]]))
    assert [round(v, 2) for v in a.advantages.tolist()] == [1.29] * 3 + [-0.77] * 5
    close(a.advantages[0], 0.625 / math.sqrt(0.234375))
    close(a.advantages[7], -0.375 / math.sqrt(0.234375))
    assert a.advantages.dtype == torch.float32
    assert a.zero_variance.tolist() == [False]
    assert a.group_index.tolist() == [0] * 8


def test_worked_example_dr_grpo_and_sample_std():
    r = torch.tensor([[1.0, 1, 1, 0, 0, 0, 0, 0]])
    # scale="none": r - mean = 1 - 0.375 = 0.625, 0 - 0.375 = -0.375
    close(group_advantages(r, scale="none").advantages, [0.625] * 3 + [-0.375] * 5)
    # sample std: var = 1.875/7 = 0.2678571, std = 0.5175492; 0.625/0.5175 = 1.20761, -0.375/0.5175 = -0.72457
    a = group_advantages(r, std="sample").advantages
    close(a, [1.207615] * 3 + [-0.724569] * 5)


def test_zero_variance_groups_get_zero_and_are_flagged():
    a = group_advantages(torch.tensor([[1.0, 1, 1, 1], [0.0, 0, 0, 0], [1.0, 0, 0, 0]]))
    # groups 0, 1: std 0 < floor -> all 0; group 2: mean .25, std sqrt(3)/4 = .4330 -> 1.7321, -.5774
    close(a.advantages, [0.0] * 8 + [1.732051, -0.577350, -0.577350, -0.577350])
    assert a.zero_variance.tolist() == [True, True, False]
    # Dr. GRPO too: equal rewards 0.3 have r - mean ~ 1e-17 but are forced to exactly 0
    b = group_advantages(torch.tensor([[0.3, 0.3, 0.3]], dtype=torch.float64), scale="none")
    assert b.advantages.tolist() == [0.0, 0.0, 0.0] and b.zero_variance.tolist() == [True]
    assert b.advantages.dtype == torch.float64
    # std = 5e-9 < floor 1e-6 although r - mean = +-5e-9 is not 0: still exactly 0 with either scale
    for scale in ("std", "none"):
        tiny = group_advantages(torch.tensor([[0.5, 0.5 + 1e-8]], dtype=torch.float64), scale=scale)
        assert tiny.advantages.tolist() == [0.0, 0.0] and tiny.zero_variance.tolist() == [True]
    # a single attempt has no variance (sample std would divide by G-1 = 0)
    for std in ("population", "sample"):
        c = group_advantages(torch.tensor([[1.0]]), std=std)
        assert c.advantages.tolist() == [0.0] and c.zero_variance.tolist() == [True]


def test_flat_rewards_with_string_ids_match_grouped_path():
    # groups of sizes 3, 5, 2, interleaved
    ids = ["a", "b", "a", "c", "b", "b", "a", "c", "b", "b"]
    r = torch.tensor([1.0, 1, 0, 1, 1, 0, 0, 0, 0, 0])
    a = group_advantages(r, ids)
    assert a.group_keys == ["a", "b", "c"] and a.group_index.tolist() == [0, 1, 0, 2, 1, 1, 0, 2, 1, 1]
    # group a = [1, 0, 0]: mean 1/3, var = (4/9 + 1/9 + 1/9)/3 = 2/9, std = .4714; A = +sqrt(2), -1/sqrt(2)
    close(a.advantages[[0, 2, 6]], [math.sqrt(2), -1 / math.sqrt(2), -1 / math.sqrt(2)])
    assert a.zero_variance.tolist() == [False, False, False]
    for key in ("a", "b", "c"):
        idx = [i for i, k in enumerate(ids) if k == key]
        ref = group_advantages(r[idx][None, :]).advantages
        close(a.advantages[idx], ref)
    # tensor ids: same grouping
    t = group_advantages(r, torch.tensor([7, 3, 7, 9, 3, 3, 7, 9, 3, 3]))
    close(t.advantages, a.advantages)
    assert t.group_keys == [7, 3, 9]


def test_group_advantages_argument_errors():
    r = torch.tensor([[1.0, 0.0]])
    with pytest.raises(ValueError, match="population.*sample"):
        group_advantages(r, std="unbiased")
    with pytest.raises(ValueError, match="std.*none"):
        group_advantages(r, scale="mad")
    with pytest.raises(ValueError, match="group_ids"):
        group_advantages(torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match="finite"):
        group_advantages(torch.tensor([[1.0, float("nan")]]))
    with pytest.raises(ValueError, match="match"):
        group_advantages(torch.tensor([1.0, 0.0]), ["a"])


# ---------------------------------------------------------------- aggregation

X = torch.tensor([[1.0, 2, 3, 4], [10, 20, 30, 40]])
M = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])


def test_aggregation_modes_by_hand():
    # row 0: 1+2 = 3 over 2 tokens; row 1: 10+20+30 = 60 over 3 tokens
    close(aggregate(X, M), (3 / 2 + 60 / 3) / 2)  # 10.75
    close(aggregate(X, M, "token-mean"), 63 / 5)  # 12.6
    close(aggregate(X, M, "seq-mean-token-sum-norm", norm_len=4), 63 / (2 * 4))  # 7.875
    # a row with no masked token contributes 0 and is not counted in G; NaN there never leaks
    x3 = torch.cat([X, torch.full((1, 4), float("nan"))])
    m3 = torch.cat([M, torch.zeros(1, 4, dtype=M.dtype)])
    close(aggregate(x3, m3), 10.75)
    close(aggregate(x3, m3, "seq-mean-token-sum-norm", norm_len=4), 7.875)
    # explicit denominators
    close(aggregate(X, M, total_seqs=4), (1.5 + 20) / 4)
    close(aggregate(X, M, "token-mean", total_tokens=10), 6.3)


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"])
def test_micro_batches_sum_to_full_batch(mode):
    x = torch.tensor([[1.0, 2, 3, 4], [10, 20, 30, 40], [5, 6, 7, 8], [-1, -2, -3, -4]])
    m = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0], [1, 0, 0, 0]])
    kw = dict(norm_len=4)
    full = aggregate(x, m, mode, **kw)
    totals = dict(total_seqs=3, total_tokens=6, **kw)  # 3 rows with tokens, 2+3+1 tokens
    parts = aggregate(x[:1], m[:1], mode, **totals) + aggregate(x[1:], m[1:], mode, **totals)
    close(parts, full.item())
    # without the global counts each micro-batch normalizes by itself: the sum is wrong
    naive = aggregate(x[:1], m[:1], mode, **kw) + aggregate(x[1:], m[1:], mode, **kw)
    assert abs(naive.item() - full.item()) > 1e-3


def test_aggregate_errors():
    with pytest.raises(ValueError, match="norm_len"):
        aggregate(X, M, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="token-mean"):
        aggregate(X, M, "mean")
    with pytest.raises(ValueError, match="total_seqs=1 is smaller"):
        aggregate(X, M, total_seqs=1)
    with pytest.raises(ValueError, match="total_tokens"):
        aggregate(X, M, "token-mean", total_tokens=4)


# ---------------------------------------------------------------- clipping


def test_symmetric_clipping():
    # A=+1, rho=1.5: max(-1.5, -1.2) = -1.2 (clipped at 1+0.2)
    loss, frac = one_token_loss(math.log(1.5), 1.0)
    assert loss == pytest.approx(-1.2) and frac == 1.0
    # A=+1, rho=0.5: max(-0.5, -0.8) = -0.5 (a small ratio is not clipped for A>0)
    loss, frac = one_token_loss(math.log(0.5), 1.0)
    assert loss == pytest.approx(-0.5) and frac == 0.0
    # A=-1, rho=0.5: max(0.5, 0.8) = 0.8 (clipped at 1-0.2)
    loss, frac = one_token_loss(math.log(0.5), -1.0)
    assert loss == pytest.approx(0.8) and frac == 1.0
    # A=-1, rho=1.5: max(1.5, 1.2) = 1.5 (unclipped; only the dual clip bounds it)
    loss, frac = one_token_loss(math.log(1.5), -1.0)
    assert loss == pytest.approx(1.5) and frac == 0.0


def test_clip_higher_asymmetric():
    kw = dict(eps_low=0.2, eps_high=0.28)
    # A=+2, rho=1.5 -> clip at 1.28: -2*1.28 = -2.56
    assert one_token_loss(math.log(1.5), 2.0, **kw)[0] == pytest.approx(-2.56)
    # A=+2, rho=1.25 < 1.28: unclipped -2.5 (symmetric 0.2 would give -2.4)
    assert one_token_loss(math.log(1.25), 2.0, **kw) == pytest.approx((-2.5, 0.0))
    assert one_token_loss(math.log(1.25), 2.0)[0] == pytest.approx(-2.4)
    # A=-2, rho=0.5 -> clip at 1-0.2 = 0.8: 2*0.8 = 1.6
    assert one_token_loss(math.log(0.5), -2.0, **kw)[0] == pytest.approx(1.6)


def test_dual_clip():
    # A=-1, rho=5: PPO loss max(5, 1.2) = 5; dual clip c=3: min(5, -3*(-1)) = 3
    lr = torch.tensor([[math.log(5.0), math.log(2.0)]], requires_grad=True)
    out = policy_loss(lr, torch.zeros(1, 2), torch.tensor([-1.0]), torch.ones(1, 2), dual_clip=3.0)
    # token 1: rho=2, loss 2 < 3, unchanged. mean over 2 tokens: (3 + 2)/2
    assert out.loss.item() == pytest.approx(2.5)
    assert out.dual_clip_frac.item() == pytest.approx(0.5)
    out.loss.backward()
    # capped token: constant 3 -> zero gradient; token 1: d(-rho*A)/dlogp / 2 = rho/2 = 1
    close(lr.grad, [[0.0, 1.0]])
    assert one_token_loss(math.log(5.0), -1.0)[0] == pytest.approx(5.0)  # no dual clip
    # A>0: dual clip does nothing; rho=5 -> -1.2
    assert one_token_loss(math.log(5.0), 1.0, dual_clip=3.0)[0] == pytest.approx(-1.2)
    with pytest.raises(ValueError, match="dual_clip"):
        one_token_loss(0.0, 1.0, dual_clip=0.5)


def test_clip_frac_and_ratio_metrics_count_masked_tokens_only():
    rho = torch.tensor([[1.5, 1.0, 0.5, 1.1, 3.0]])
    out = policy_loss(rho.log(), torch.zeros(1, 5), torch.tensor([1.0]), torch.tensor([[1, 1, 1, 1, 0]]))
    # A>0: only rho=1.5 > 1.2 is clipped (rho=3 is masked): 1/4
    assert out.clip_frac.item() == pytest.approx(0.25)
    assert out.ratio_mean.item() == pytest.approx((1.5 + 1 + 0.5 + 1.1) / 4)  # 1.025
    assert out.ratio_max.item() == pytest.approx(1.5)
    assert out.num_tokens.item() == 4
    # loss: (-1.2 - 1 - 0.5 - 1.1)/4 = -0.95
    assert out.loss.item() == pytest.approx(-0.95)


# ---------------------------------------------------------------- KL and IS


def test_kl_estimators_by_hand():
    lp, ref = torch.tensor([-1.0, -0.5]), torch.tensor([-2.0, -0.25])
    # d = ref - lp = [-1, 0.25]
    close(kl_penalty(lp, ref, "k1"), [1.0, -0.25])  # lp - ref
    close(kl_penalty(lp, ref, "k2"), [0.5, 0.03125])  # d^2/2
    close(kl_penalty(lp, ref, "k3"), [math.exp(-1), math.exp(0.25) - 1.25])  # e^d - d - 1: .367879, .034025
    assert torch.isfinite(kl_penalty(torch.tensor([-1000.0]), torch.tensor([0.0]))).all()
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_penalty(lp, ref, "k4")


def test_kl_coef_adds_to_loss():
    lp, ref = torch.tensor([[-1.0, -0.5]]), torch.tensor([[-2.0, -0.25]])
    adv, m = torch.tensor([0.5]), torch.ones(1, 2)
    k3_mean = (math.exp(-1) + math.exp(0.25) - 1.25) / 2  # 0.200952
    out = policy_loss(lp, lp, adv, m, ref_logprobs=ref, kl_coef=0.1)
    # rho = 1: pg = -A = -0.5 per token; loss = -0.5 + 0.1 * 0.200952 = -0.479905
    assert out.loss.item() == pytest.approx(-0.5 + 0.1 * k3_mean)
    assert out.pg_loss.item() == pytest.approx(-0.5)
    assert out.kl.item() == pytest.approx(k3_mean)
    out0 = policy_loss(lp, lp, adv, m, ref_logprobs=ref)  # beta = 0: KL is reported, not added
    assert out0.loss.item() == pytest.approx(-0.5) and out0.kl.item() == pytest.approx(k3_mean)
    out1 = policy_loss(lp, lp, adv, m, ref_logprobs=ref, kl_coef=0.1, kl_estimator="k2")
    assert out1.loss.item() == pytest.approx(-0.5 + 0.1 * (0.5 + 0.03125) / 2)
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(lp, lp, adv, m, kl_coef=0.1)


def test_truncated_is_token_and_sequence():
    old, mu = torch.tensor([[0.0, -1.0, -2.0]]), torch.tensor([[-1.0, -1.0, -1.0]])
    m = torch.ones(1, 3)
    # d = old - mu = [1, 0, -1]: w = [min(e, C), 1, 1/e]
    close(truncated_is_weights(old, mu, m, cap=2.0), [[2.0, 1.0, 1 / E]])
    close(truncated_is_weights(old, mu, m, cap=5.0), [[E, 1.0, 1 / E]])
    old = torch.tensor([[0.0, -0.5, 9.0], [1.0, 2.0, 3.0]], requires_grad=True)
    mu = torch.tensor([[-1.0, -1.0, 0.0], [0.0, 0.0, 0.0]])
    m = torch.tensor([[1, 1, 0], [0, 0, 0]])
    # row 0 masked d = [1, 0.5] (d=9 at the masked token is ignored): sum 1.5, e^1.5 = 4.481689
    w = truncated_is_weights(old, mu, m, cap=10.0, level="sequence")
    close(w, [[math.exp(1.5), math.exp(1.5), 0.0], [0.0, 0.0, 0.0]])
    assert not w.requires_grad
    close(truncated_is_weights(old, mu, m, cap=3.0, level="sequence"), [[3.0, 3.0, 0.0], [0.0] * 3])
    close(truncated_is_weights(old, mu, m, cap=3.0), [[E, math.exp(0.5), 0.0], [0.0] * 3])
    huge = truncated_is_weights(torch.tensor([[1e4]]), torch.tensor([[0.0]]), torch.ones(1, 1), cap=2.0, level="sequence")
    assert huge.item() == 2.0
    with pytest.raises(ValueError, match="token, sequence"):
        truncated_is_weights(old, mu, m, cap=2.0, level="seq")


def test_is_weights_multiply_token_loss():
    lp = torch.zeros(1, 2)
    out = policy_loss(lp, lp, torch.tensor([1.0]), torch.ones(1, 2), is_weights=torch.tensor([[2.0, 0.5]]))
    # rho = 1: L = [-2, -0.5], mean -1.25
    assert out.loss.item() == pytest.approx(-1.25)


# ---------------------------------------------------------------- gradients


def test_gradient_against_manual_derivative_and_gradcheck():
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -1.2, -2.0]], dtype=torch.float64)
    lr = torch.tensor([[0.1, 0.5, 0.0], [-0.5, 0.1, 0.3]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv = torch.tensor([1.0, -0.5], dtype=torch.float64)
    lp = (old + lr).requires_grad_(True)
    policy_loss(lp, old, adv, mask).loss.backward()
    # dL/dlogp_t = -(1/G)(1/|y_i|) A_i rho_t on unclipped tokens, 0 on clipped / masked (G = 2)
    # row 0 (A=+1, |y|=2): rho=e^.1 unclipped -> -e^.1/4 = -0.276293; rho=e^.5=1.65>1.2 clipped -> 0
    # row 1 (A=-.5, |y|=3): rho=e^-.5=.607<.8 clipped -> 0; e^.1 -> .5 e^.1/6 = .092098; e^.3 -> .5 e^.3/6 = .112488
    want = [[-math.exp(0.1) / 4, 0.0, 0.0], [0.0, 0.5 * math.exp(0.1) / 6, 0.5 * math.exp(0.3) / 6]]
    close(lp.grad, want, atol=1e-12)
    ref = old - 0.3
    w = torch.tensor([[1.5, 0.7, 1.0], [1.0, 2.0, 0.3]], dtype=torch.float64)

    def f(x):
        return policy_loss(x, old, adv, mask, dual_clip=3.0, is_weights=w, ref_logprobs=ref, kl_coef=0.05).loss

    assert torch.autograd.gradcheck(f, (lp.detach().clone().requires_grad_(True),))


def test_on_policy_gradient_equals_plain_policy_gradient():
    torch.manual_seed(0)
    policy = torch.nn.Linear(5, 7)
    feats = torch.randn(3, 4, 5)
    targets = torch.randint(0, 7, (3, 4))
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [0, 1, 1, 0]])
    adv = torch.tensor([1.3, -0.7, 0.4])

    def grads(loss):
        return torch.autograd.grad(loss, list(policy.parameters()))

    logp, _ = token_logprobs(policy(feats), targets)
    got = grads(policy_loss(logp, logp.detach(), adv, mask).loss)
    # plain PG: -(1/G) sum_i A_i/|y_i| sum_t m_it log pi(y_it), G = 3, |y| = 4, 1, 2
    logp, _ = token_logprobs(policy(feats), targets)
    lens = mask.sum(1)
    want = grads(-((adv / lens)[:, None] * mask * logp).sum() / 3)
    for g, w in zip(got, want):
        assert torch.allclose(g, w, atol=1e-6)
        assert g.abs().max() > 1e-3  # a non-trivial gradient
    # token-mean: -(1/N) sum_i A_i sum_t m_it log pi, N = 7 tokens
    logp, _ = token_logprobs(policy(feats), targets)
    got = grads(policy_loss(logp, logp.detach(), adv, mask, agg="token-mean").loss)
    logp, _ = token_logprobs(policy(feats), targets)
    want = grads(-(adv[:, None] * mask * logp).sum() / 7)
    for g, w in zip(got, want):
        assert torch.allclose(g, w, atol=1e-6)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"])
def test_masked_tokens_get_exactly_zero_gradient(agg, estimator):
    nan, inf = float("nan"), float("inf")
    mask = torch.tensor([[1, 0, 1, 0, 0], [0, 1, 1, 1, 0]])
    # garbage where mask is 0: a log ratio of 1e4 would overflow exp; NaN / -inf would poison everything
    lp = torch.tensor([[-1.0, 1e4, -0.5, nan, -inf], [nan, -0.2, -1.5, -0.3, -inf]], requires_grad=True)
    old = torch.tensor([[-1.1, -1e4, -0.4, 0.0, 0.0], [0.0, -0.25, -1.4, -0.35, -inf]])
    ref = torch.tensor([[-1.2, nan, -0.6, nan, 0.0], [-1e4, -0.3, -1.3, -0.2, inf]])
    w = torch.tensor([[1.2, nan, 0.9, inf, 1.0], [nan, 1.0, 1.1, 0.8, 1.0]])
    out = policy_loss(lp, old, torch.tensor([0.8, -0.6]), mask, agg=agg, norm_len=4, dual_clip=3.0,
                      is_weights=w, ref_logprobs=ref, kl_coef=0.1, kl_estimator=estimator)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    assert (lp.grad[mask == 0] == 0).all()
    assert torch.isfinite(lp.grad).all() and (lp.grad[mask == 1] != 0).all()
    for metric in (out.kl, out.ratio_mean, out.ratio_max, out.pg_loss):
        assert torch.isfinite(metric)


# ---------------------------------------------------------------- token log-probs


def test_token_logprobs_match_categorical():
    torch.manual_seed(1)
    logits = torch.randn(3, 5, 11, requires_grad=True)
    targets = torch.randint(0, 11, (3, 5))
    dist = torch.distributions.Categorical(logits=logits / 0.7)
    want_lp, want_h = dist.log_prob(targets), dist.entropy()
    for chunk in (2**26, 1):  # one chunk, and one row per chunk
        lp, h = token_logprobs(logits, targets, 0.7, max_chunk_elements=chunk)
        assert lp.dtype == torch.float32 and lp.shape == (3, 5)
        assert torch.allclose(lp, want_lp, atol=1e-5) and torch.allclose(h, want_h, atol=1e-5)
        assert not h.requires_grad
    g = torch.autograd.grad(lp.sum(), logits)[0]
    assert torch.allclose(g, torch.autograd.grad(want_lp.sum(), logits, retain_graph=True)[0], atol=1e-5)
    _, h = token_logprobs(logits, targets, 0.7, entropy_grad=True)
    g = torch.autograd.grad(h.sum(), logits)[0]
    assert torch.allclose(g, torch.autograd.grad(want_h.sum(), logits, retain_graph=True)[0], atol=1e-5)
    # temperature matters: at T=1 the values differ
    assert not torch.allclose(token_logprobs(logits, targets)[0], want_lp, atol=1e-3)


def test_token_logprobs_bf16_and_masked_vocab():
    logits = torch.tensor([[[0.0, 0.0, float("-inf"), 0.0]]], dtype=torch.bfloat16)
    lp, h = token_logprobs(logits, torch.tensor([[1]]))
    # uniform over 3 allowed tokens: log(1/3) = -1.098612, entropy log 3
    assert lp.dtype == torch.float32
    close(lp, [[-math.log(3)]], atol=1e-4)
    close(h, [[math.log(3)]], atol=1e-4)
    with pytest.raises(ValueError, match="targets must be token ids"):
        token_logprobs(logits, torch.tensor([[-100]]))
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(logits, torch.tensor([[1]]), 0.0)


# ---------------------------------------------------------------- filters


def test_filter_attempts_counts():
    adv = group_advantages(torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]]))  # groups 1, 2 zero-variance
    finish = ["stop", "length", "stop", "max_turns", "error", "stop"]
    void = [False, False, True, False, False, True]
    none = filter_attempts(adv, finish, void)
    assert none.keep.all() and none.zero_variance_groups == 2
    assert (none.dropped_zero_variance, none.masked_truncated, none.dropped_void) == (0, 0, 0)
    zv = filter_attempts(adv, finish, void, drop_zero_variance=True)
    assert zv.keep.tolist() == [True, True, False, False, False, False] and zv.dropped_zero_variance == 4
    tr = filter_attempts(adv, finish, void, mask_truncated=True)  # "length" and "max_turns"
    assert tr.keep.tolist() == [True, False, True, False, True, True] and tr.masked_truncated == 2
    vd = filter_attempts(adv, finish, void, drop_void_turns=True)
    assert vd.keep.tolist() == [True, True, False, True, True, False] and vd.dropped_void == 2
    both = filter_attempts(adv, finish, void, drop_zero_variance=True, mask_truncated=True, drop_void_turns=True)
    assert both.keep.tolist() == [True, False, False, False, False, False] and both.num_kept == 1
    assert (both.dropped_zero_variance, both.masked_truncated, both.dropped_void) == (4, 2, 2)
    only_length = filter_attempts(adv, finish, void, mask_truncated=True, truncated_reasons=("length",))
    assert only_length.masked_truncated == 1
    with pytest.raises(ValueError, match="one finish reason"):
        filter_attempts(adv, finish[:5], void)
    with pytest.raises(ValueError, match="unknown finish reasons"):
        filter_attempts(adv, ["stop"] * 5 + ["timeout"], void)


def test_docstring_examples_run():
    for mod in (agentrl.algo.grpo, agentrl.algo.filters):
        result = doctest.testmod(mod)
        assert result.attempted > 0 and result.failed == 0
