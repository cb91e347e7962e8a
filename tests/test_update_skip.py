"""Attempts with advantage 0 skip the forward and backward when the objective has no KL term:
the update is the same (up to float summation order), the normalizers unchanged."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from agentrl.algo.objective import Objective
from agentrl.algo.update import UpdateSettings, compute_advantages, grpo_update
from agentrl.models.tiny import ensure_tiny_model
from agentrl.types import Span, Trajectory, Verdict


def batch(rewards: list[list[float]], seed: int = 0) -> list[Trajectory]:
    """Groups of seeded trajectories: prompt, model turn, tool output, model turn."""
    rng = random.Random(seed)
    out = []
    for g, group in enumerate(rewards):
        prompt = [1] + [rng.randrange(11, 1000) for _ in range(rng.randint(4, 8))]
        for i, r in enumerate(group):
            ids, mask, lps, spans = list(prompt), [0] * len(prompt), [0.0] * len(prompt), [Span(0, len(prompt), "prompt")]
            for kind, n in (("model", rng.randint(3, 9)), ("tool", rng.randint(2, 5)), ("model", rng.randint(2, 6))):
                start = len(ids)
                ids += [rng.randrange(11, 1000) for _ in range(n)]
                mask += [int(kind == "model")] * n
                lps += [-rng.uniform(0.1, 3.0) if kind == "model" else 0.0 for _ in range(n)]
                spans.append(Span(start, len(ids), kind))
            out.append(Trajectory(ids, len(prompt), mask, lps, spans, [], verdict=Verdict(r), group_id=f"g{g}",
                                  sample_index=i, task_id=f"t{g}"))
    return out


@pytest.fixture(scope="module")
def base_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(ensure_tiny_model(), dtype=torch.float32)


def run(model, trajs, objective, *, skip: bool, iterations: int = 1, steps: int = 1):
    """SGD: the parameters move by the gradient itself. (Adam's first step, about lr * sign(g),
    turns the float-order noise of gradients that cancel to ~1e-8 into 1% differences.)"""
    model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    adv, filt = compute_advantages(trajs, objective)
    settings = UpdateSettings(micro_batch_tokens=64, num_iterations=iterations, skip_zero_advantage=skip)
    stats = [grpo_update(model, opt, sched, trajs, filt.keep.tolist(), objective, settings) for _ in range(steps)]
    return model, stats


@pytest.mark.parametrize("iterations", [1, 2])
def test_skipping_zero_advantage_attempts_gives_the_same_update(base_model, iterations):
    # group 0 has signal, group 1 none (all 0: advantage 0), group 2 one 0.5 among equal rewards
    trajs = batch([[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 1.0]])
    objective = Objective()
    a, (sa,) = run(base_model, copy.deepcopy(trajs), objective, skip=True, iterations=iterations)
    b_trajs = copy.deepcopy(trajs)
    b, (sb,) = run(base_model, b_trajs, objective, skip=False, iterations=iterations)
    assert sa.skipped_attempts == 4 and sb.skipped_attempts == 0
    assert (sa.trained_attempts, sa.trained_tokens) == (sb.trained_attempts, sb.trained_tokens)  # same normalizers
    assert sa.loss == pytest.approx(sb.loss, abs=1e-6) and sa.grad_norm == pytest.approx(sb.grad_norm, rel=1e-5)
    for (n, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(pa, pb, atol=1e-6), n
    assert not all(torch.equal(pa, pb) for pa, pb in zip(a.parameters(), base_model.parameters()))


def test_skipped_attempts_get_no_pi_old_and_the_others_the_same(base_model):
    trajs = batch([[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    skipped, kept = copy.deepcopy(trajs), copy.deepcopy(trajs)
    run(base_model, skipped, Objective(), skip=True)
    run(base_model, kept, Objective(), skip=False)
    for s, k in zip(skipped, kept):
        if s.advantage == 0.0:
            assert s.old_logprobs is None and k.old_logprobs is not None
        else:
            assert s.old_logprobs == pytest.approx(k.old_logprobs, abs=1e-6)


def test_a_batch_without_signal_takes_the_zero_gradient_step_exactly(base_model):
    """Every advantage 0: no pass at all, yet AdamW's step (momentum from an earlier step, weight
    decay) is bit-identical to the one the zero gradients of a full pass give."""
    warm = batch([[1.0, 0.0, 1.0, 0.0]], seed=1)
    flat = batch([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]], seed=2)
    objective = Objective()
    out = {}
    for skip in (True, False):
        model = copy.deepcopy(base_model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        settings = UpdateSettings(micro_batch_tokens=64, skip_zero_advantage=skip)
        for trajs in (copy.deepcopy(warm), copy.deepcopy(flat)):
            adv, filt = compute_advantages(trajs, objective)
            before = [p.detach().clone() for p in model.parameters()]
            stats = grpo_update(model, opt, sched, trajs, filt.keep.tolist(), objective, settings)
        out[skip] = (model, stats, before)
    (a, sa, before_a), (b, sb, _) = out[True], out[False]
    assert sa.skipped_attempts == 8 and sb.skipped_attempts == 0
    assert all(torch.equal(pa, pb) for pa, pb in zip(a.parameters(), b.parameters()))
    assert not all(torch.equal(pa, pb) for pa, pb in zip(a.parameters(), before_a))  # momentum moved them


def test_nothing_is_skipped_when_the_objective_has_a_kl_term(base_model):
    trajs = batch([[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    objective = Objective(kl_coef=0.05)
    ref = copy.deepcopy(base_model)
    model = copy.deepcopy(base_model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    adv, filt = compute_advantages(trajs, objective)
    stats = grpo_update(model, opt, sched, trajs, filt.keep.tolist(), objective,
                        UpdateSettings(micro_batch_tokens=64), ref_model=ref)
    assert stats.skipped_attempts == 0 and all(t.old_logprobs is not None for t in trajs)
