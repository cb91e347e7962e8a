"""``train.autocast=bf16``: the update's forward under bfloat16 autocast moves the parameters
the way the float32 update does (same direction, bf16-sized differences), keeps float32
weights and log-probs, and the config refuses an unknown mode."""

from __future__ import annotations

import copy

import pytest
import torch

from agentrl.algo.batching import collate, score_tokens
from agentrl.algo.objective import Objective
from agentrl.algo.update import UpdateSettings, compute_advantages, grpo_update
from agentrl.run.config import ConfigError, TrainConfig

from test_update_skip import base_model, batch  # noqa: F401  (the fixture and the seeded batch)


def step(model, trajs, autocast: str):
    model = copy.deepcopy(model)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    objective = Objective()
    _, filt = compute_advantages(trajs, objective)
    grpo_update(model, opt, sched, trajs, filt.keep.tolist(), objective,
                UpdateSettings(micro_batch_tokens=64, autocast=autocast))
    delta = torch.cat([(p.detach() - b).flatten() for p, b in zip(model.parameters(), before)])
    return model, delta


def test_bf16_autocast_update_follows_the_float32_update(base_model):  # noqa: F811
    trajs = batch([[1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 0.0, 1.0]])
    m32, d32 = step(base_model, trajs, "none")
    m16, d16 = step(base_model, trajs, "bf16")
    assert all(p.dtype == torch.float32 for p in m16.parameters())  # master weights stay float32
    cos = torch.nn.functional.cosine_similarity(d32, d16, dim=0).item()
    rel = ((d16 - d32).norm() / d32.norm()).item()
    assert cos > 0.98 and 1e-4 < rel < 0.2, (cos, rel)  # close, yet really computed in bf16


def test_bf16_scores_are_float32_and_near_the_float32_scores(base_model):  # noqa: F811
    trajs = batch([[1.0, 0.0]])
    mb = collate(trajs, list(range(len(trajs))), 0, "cpu")
    with torch.no_grad():
        lp32, _ = score_tokens(base_model, mb, 1.0)
        lp16, _ = score_tokens(base_model, mb, 1.0, "bf16")
    m = mb.loss_mask.bool()
    assert lp16.dtype == torch.float32
    gap = (lp16 - lp32)[m].abs().max().item()
    assert 0 < gap < 0.1, gap


def test_unknown_autocast_mode_is_a_config_error():
    with pytest.raises(ConfigError, match="train.autocast"):
        TrainConfig(autocast="fp16")
