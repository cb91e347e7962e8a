"""Scoring with the shared prompt run once per micro-batch gives the log-probs and the
gradients of the full forward (up to float summation order), on the tiny model; and the
update with ``share_prefix`` moves the parameters as the unshared one does."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl.algo.batching import collate, score_tokens
from agentrl.algo.objective import Objective
from agentrl.algo.shared_prefix import MIN_SHARED, shared_prefix_len
from agentrl.algo.update import UpdateSettings, compute_advantages, grpo_update
from agentrl.models.tiny import ensure_tiny_model
from agentrl.types import Span, Trajectory, Verdict


@pytest.fixture(scope="module")
def model():
    return AutoModelForCausalLM.from_pretrained(ensure_tiny_model(), dtype=torch.float32)


def group(prompt_len: int, lengths: list[list[int]], seed: int, rewards: list[float], gid: str = "g0"):
    """Attempts sharing one prompt: model, tool, model spans of the given lengths."""
    g = torch.Generator().manual_seed(seed)
    prompt = [1] + torch.randint(11, 1000, (prompt_len - 1,), generator=g).tolist()
    out = []
    for i, (lens, r) in enumerate(zip(lengths, rewards)):
        ids, mask, spans = list(prompt), [0] * prompt_len, [Span(0, prompt_len, "prompt")]
        for kind, n in zip(("model", "tool", "model"), lens):
            start = len(ids)
            ids += torch.randint(11, 1000, (n,), generator=g).tolist()
            mask += [int(kind == "model")] * n
            spans.append(Span(start, len(ids), kind))
        lps = [-1.0 if m else 0.0 for m in mask]
        out.append(Trajectory(ids, prompt_len, mask, lps, spans, [], verdict=Verdict(r), group_id=gid, sample_index=i,
                              task_id=gid))
    return out


def test_shared_prefix_len_stops_at_the_first_difference_and_keeps_a_remainder():
    ids = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4]])
    assert shared_prefix_len(ids, torch.ones_like(ids)) == 3  # identical rows: one token left each
    assert shared_prefix_len(ids[:1], torch.ones_like(ids[:1])) == 0  # one row: nothing to share


@pytest.mark.parametrize("autocast", ["none", "bf16"])
def test_shared_scores_and_gradients_equal_the_full_forward(model, autocast):
    trajs = group(40, [[7, 3, 5], [12, 2, 1], [3, 4, 9], [9, 1, 2]], seed=1, rewards=[1, 0, 0, 1])
    mb = collate(trajs, list(range(4)), 0, "cpu")
    assert shared_prefix_len(mb.input_ids, mb.attention_mask) == 40 >= MIN_SHARED
    results = []
    for share in (False, True):
        m = copy.deepcopy(model)
        lp, _ = score_tokens(m, mb, 0.7, autocast, share_prefix=share)
        (lp * mb.loss_mask * torch.tensor([[1.0], [-2.0], [0.5], [3.0]])).sum().backward()
        grads = torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None])
        results.append((lp.detach(), grads))
    (lp_full, g_full), (lp_shared, g_shared) = results
    tol = 1e-4 if autocast == "none" else 3e-2
    assert (lp_full - lp_shared).abs().max().item() < tol
    assert ((g_full - g_shared).norm() / g_full.norm()).item() < (1e-4 if autocast == "none" else 5e-2)
    assert bool(((lp_shared != 0) | (mb.loss_mask == 0)).all())  # every trained token scored


def two_groups() -> list[Trajectory]:
    return group(30, [[5, 2, 4], [8, 3, 2], [2, 2, 6]], 2, [1, 0, 0], "a") + \
        group(25, [[4, 1, 3], [6, 2, 2], [3, 3, 3]], 3, [0, 1, 1], "b")


def update_delta(model, trajs: list[Trajectory], settings: UpdateSettings) -> torch.Tensor:
    """The parameter change of one SGD update of ``trajs`` on a copy of ``model``."""
    m = copy.deepcopy(model)
    before = [p.detach().clone() for p in m.parameters()]
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    objective = Objective()
    _, filt = compute_advantages(trajs, objective)
    stats = grpo_update(m, opt, sched, trajs, filt.keep.tolist(), objective, settings)
    assert stats.trained_attempts == len(trajs)
    return torch.cat([(p.detach() - b).flatten() for p, b in zip(m.parameters(), before)])


def test_update_with_shared_prefix_matches_the_unshared_update(model):
    trajs = two_groups()
    deltas = [update_delta(model, trajs, UpdateSettings(micro_batch_tokens=256, share_prefix=share))
              for share in (False, True)]
    assert ((deltas[0] - deltas[1]).norm() / deltas[0].norm()).item() < 1e-4
