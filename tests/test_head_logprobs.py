"""The fused LM head (agentrl/algo/head_logprobs.py): hand-computed values and gradients,
chunking that changes nothing, and score_tokens / the update equal to materialized logits."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from agentrl.algo.batching import collate, fused_head_parts, score_tokens
from agentrl.algo.grpo import token_logprobs
from agentrl.algo.head_logprobs import head_logprobs
from agentrl.algo.update import UpdateSettings
from agentrl.models.tiny import ensure_tiny_model
from agentrl.run.build import resolve_fused_head
from agentrl.run.config import ConfigError, load_config
from tests.test_shared_prefix import group, two_groups, update_delta


@pytest.fixture(scope="module")
def model():
    return AutoModelForCausalLM.from_pretrained(ensure_tiny_model(), dtype=torch.float32)


def test_values_and_gradients_by_hand():
    # h = (1, 0), W rows (1,0), (0,1), (0,0): z = (1, 0, 0), target 0
    h = torch.tensor([[1.0, 0.0]], requires_grad=True)
    w = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]], requires_grad=True)
    lp, ent = head_logprobs(h, w, torch.tensor([0]))
    e = math.e
    p0, p1 = e / (e + 2), 1 / (e + 2)
    assert lp.item() == pytest.approx(1 - math.log(e + 2), abs=1e-6)  # -0.551444
    assert ent.item() == pytest.approx(math.log(e + 2) - p0, abs=1e-6)  # lse - sum p z
    lp.sum().backward()
    # dL/dz = onehot - p = (1 - p0, -p1, -p1); dL/dh = dz W; dL/dW = dz^T h
    assert h.grad.tolist()[0] == pytest.approx([1 - p0, -p1], abs=1e-6)  # (0.423883, -0.211942)
    assert w.grad.tolist() == [pytest.approx([1 - p0, 0.0], abs=1e-6), pytest.approx([-p1, 0.0], abs=1e-6),
                               pytest.approx([-p1, 0.0], abs=1e-6)]
    assert not ent.requires_grad


def test_temperature_divides_the_logits_and_the_gradient():
    h = torch.tensor([[2.0, 0.0]], requires_grad=True)
    w = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    lp, _ = head_logprobs(h, w, torch.tensor([1]), temperature=2.0)
    # z = (1, 0): log p(1) = -log(1 + e); d/dh0 = -p0 / T with p0 = e / (1 + e)
    assert lp.item() == pytest.approx(-math.log(1 + math.e), abs=1e-6)
    lp.sum().backward()
    assert h.grad[0, 0].item() == pytest.approx(-(math.e / (1 + math.e)) / 2, abs=1e-6)


@pytest.mark.parametrize("dtype,tol", [(None, 1e-5), (torch.bfloat16, 3e-2)])
def test_chunked_equals_materialized_logits(dtype, tol):
    g = torch.Generator().manual_seed(0)
    h0, w0 = torch.randn(37, 16, generator=g), torch.randn(50, 16, generator=g) * 0.5
    y = torch.randint(0, 50, (37,), generator=g)
    coef = torch.randn(37, generator=g)
    results = []
    for fused, chunk in ((False, 0), (True, 50 * 5), (True, 50 * 64)):  # 5 rows a chunk, then one chunk
        h, w = h0.clone().requires_grad_(), w0.clone().requires_grad_()
        if fused:
            lp, ent = head_logprobs(h, w, y, 0.7, dtype, chunk_elements=chunk)
        else:
            z = F.linear(h.to(dtype or h.dtype), w.to(dtype or w.dtype)).float()
            lp, ent = token_logprobs(z[None], y[None], 0.7)
            lp, ent = lp[0], ent[0]
        (lp * coef).sum().backward()
        results.append((lp.detach(), ent, h.grad, w.grad))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert (a - b).abs().max().item() < tol * max(1.0, a.abs().max().item())
    # chunking alone changes nothing beyond float summation order (and, in bfloat16, where
    # each chunk's weight gradient is rounded before the float32 sum)
    for a, b in zip(results[1], results[2]):
        assert torch.allclose(a, b, atol=1e-6 if dtype is None else 1e-2 * a.abs().max().item())


@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("autocast", ["none", "bf16"])
def test_score_tokens_fused_equals_materialized(model, share, autocast):
    trajs = group(40, [[7, 3, 5], [12, 2, 1], [3, 4, 9], [9, 1, 2]], seed=1, rewards=[1, 0, 0, 1])
    mb = collate(trajs, list(range(4)), 0, "cpu")
    results = []
    for fused in (False, True):
        m = copy.deepcopy(model)
        lp, ent = score_tokens(m, mb, 0.7, autocast, share_prefix=share, fused_head=fused)
        (lp * mb.loss_mask * torch.tensor([[1.0], [-2.0], [0.5], [3.0]])).sum().backward()
        grads = torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None])
        results.append((lp.detach() * mb.loss_mask, ent * mb.loss_mask, grads))
    (lp_m, ent_m, g_m), (lp_f, ent_f, g_f) = results
    tol = 1e-4 if autocast == "none" else 3e-2
    assert (lp_m - lp_f).abs().max().item() < tol
    assert (ent_m - ent_f).abs().max().item() < tol * 10
    assert ((g_m - g_f).norm() / g_m.norm()).item() < (1e-4 if autocast == "none" else 5e-2)
    lp_f_raw, _ = score_tokens(model, mb, 0.7, autocast, share_prefix=share, fused_head=True)
    assert bool(((lp_f_raw != 0) == (mb.loss_mask > 0)).all())  # trained tokens and nothing else


def test_update_with_the_fused_head_matches(model):
    trajs = two_groups()
    deltas = [update_delta(model, trajs, UpdateSettings(micro_batch_tokens=256, share_prefix=True, fused_head=fused,
                                                        num_iterations=2))
              for fused in (False, True)]
    assert ((deltas[0] - deltas[1]).norm() / deltas[0].norm()).item() < 1e-4


def test_which_models_get_the_fused_head(model):
    from agentrl.scale.parallel import AdapterDisabledReference, apply_lora
    from agentrl.run.config import LoRAConfig

    body, weight = fused_head_parts(model)
    assert body is model.get_decoder() and weight is model.get_output_embeddings().weight
    peft = apply_lora(copy.deepcopy(model), LoRAConfig(enabled=True))
    assert fused_head_parts(peft) is None  # LoRA wrappers: materialized logits
    assert fused_head_parts(AdapterDisabledReference(peft)) is None
    assert fused_head_parts(torch.nn.Linear(2, 2)) is None
    # the tiny model's 1024 words: auto keeps the materialized logits (the CPU example unchanged)
    assert resolve_fused_head("auto", model) is False
    assert resolve_fused_head("on", model) is True and resolve_fused_head("off", model) is False
    with pytest.raises(ConfigError, match="train.fused_head=auto or off"):
        resolve_fused_head("on", torch.nn.Linear(2, 2))
    for written, meant in (("off", "off"), ("on", "on"), ("false", "off"), ("auto", "auto")):  # YAML: off is false
        assert load_config("examples/arithmetic_tiny.yaml", [f"train.fused_head={written}"]).train.fused_head == meant
    with pytest.raises(ConfigError, match="'auto', 'on' or 'off'"):
        load_config("examples/arithmetic_tiny.yaml", ["train.fused_head=always"])


def test_auto_turns_on_for_a_large_vocabulary(model):
    big = copy.deepcopy(model)
    big.resize_token_embeddings(32768)
    assert resolve_fused_head("auto", big) is True


def _weight_casts(settings: UpdateSettings) -> int:
    """float32 -> bfloat16 casts of a Linear's [32, 64] weight over 3 micro-batch passes
    (each forward in its own autocast region, as score_tokens runs it), backward casts included."""
    from torch.profiler import profile

    from agentrl.algo.update import _one_cast_per_pass

    lin = torch.nn.Linear(64, 32)
    with profile(record_shapes=True) as prof, _one_cast_per_pass(lin, settings):
        for _ in range(3):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = lin(torch.randn(4, 64))
            y.float().sum().backward()
    return sum(1 for e in prof.events()
               if e.name == "aten::_to_copy" and e.input_shapes and list(e.input_shapes[0]) == [32, 64])


def test_the_update_casts_each_weight_once_per_pass():
    # 3 forwards + 3 gradients cast back without the pass's region; 1 + 3 with it
    assert _weight_casts(UpdateSettings(micro_batch_tokens=1)) == 6
    assert _weight_casts(UpdateSettings(micro_batch_tokens=1, autocast="bf16")) == 4
