"""The bfloat16 sampler (model.sampler_dtype, agentrl/engines/sampler_dtype.py): its logits are
the float32 ones up to bfloat16 rounding, an optimizer step reaches it, its KV is bfloat16, the
canary scores what it samples with, and a run that cannot use it is refused by name."""

from __future__ import annotations

import pytest
import torch

from agentrl.engines.base import SamplingParams
from agentrl.engines.decode import FastDecoder
from agentrl.engines.hf import HFEngine
from agentrl.engines.projection import Projection, packing_works
from agentrl.engines.sampler_dtype import CastWeights
from agentrl.models.tiny import build_tiny_model
from agentrl.run.config import load_config
from agentrl.types import ConfigError

PROMPTS = [[5, 400, 77, 12, 9, 31, 64, 2], [300, 18], [7] * 20]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.set_num_threads(1)
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", seed=0)


def _steps(decoder: FastDecoder, n: int) -> list[torch.Tensor]:
    out = [decoder.prefill(PROMPTS, n)]
    for s in range(n):
        out.append(decoder.step(torch.tensor([11 + s, 13 + s, 17 + s])))
    decoder.release()
    return out


def test_bf16_logits_are_the_float32_ones_up_to_rounding(model_dir):
    engine = HFEngine.from_pretrained(model_dir, max_cached_tokens=0)
    model = engine.model
    full, half = FastDecoder(model), FastDecoder(model, None, CastWeights(torch.bfloat16))
    for a, b in zip(_steps(full, 4), _steps(half, 4)):
        gap = (a - b).abs().max().item()
        # bfloat16 keeps 8 bits of mantissa: a relative error of ~2^-8 per operation
        assert 0 < gap < 0.02 * max(1.0, a.abs().max().item()), gap
        assert b.dtype == torch.float32
    assert half.cast.nbytes() > 0 and all(c.dtype == torch.bfloat16 for _, c in half.cast._copies.values())


def test_an_optimizer_step_reaches_the_bf16_sampler(model_dir):
    engine = HFEngine.from_pretrained(model_dir, sampler_dtype=torch.bfloat16)
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=3)
    engine.generate(PROMPTS, params)
    with torch.no_grad():  # what AdamW does: the same tensors, changed in place
        for p in engine.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    engine.sync_weights()
    after = engine.generate(PROMPTS, params)
    fresh = HFEngine.from_pretrained(model_dir, sampler_dtype=torch.bfloat16)
    fresh.model.load_state_dict(engine.model.state_dict())
    again = fresh.generate(PROMPTS, params)
    assert [g.token_ids for g in after] == [g.token_ids for g in again]
    assert [g.logprobs for g in after] == [g.logprobs for g in again]  # no stale copy was read


def test_kv_and_prefix_cache_are_bf16_and_half_the_bytes(model_dir):
    sizes = {}
    for dtype in (None, torch.bfloat16):
        engine = HFEngine.from_pretrained(model_dir, sampler_dtype=dtype)
        engine.generate(PROMPTS, SamplingParams(max_new_tokens=20, seed=1))
        entries = list(engine.prefix_cache._entries.values())
        assert entries and all(e.keys.dtype == (dtype or torch.float32) for e in entries)
        sizes[dtype] = engine.prefix_cache.nbytes()
    assert sizes[torch.bfloat16] * 2 == sizes[None]


def test_the_canary_scores_the_copies_the_sampler_reads(model_dir):
    engine = HFEngine.from_pretrained(model_dir, sampler_dtype=torch.bfloat16)
    seq = PROMPTS[0] + [40, 41, 42]
    scored = engine.score([seq])[0]
    # the sampler's own log-prob of each next token, from prefill + steps on the bf16 copies
    decoder = FastDecoder(engine.model, None, engine.cast)
    with torch.inference_mode():
        logits = [decoder.prefill([seq[:4]], len(seq))] + [decoder.step(torch.tensor([t])) for t in seq[4:-1]]
    decoder.release()
    steps = [torch.log_softmax(z[0], -1)[t].item() for z, t in zip(logits, seq[4:])]
    assert max(abs(a - b) for a, b in zip(scored[4:], steps)) < 2e-2  # same weights, other kernels
    full = HFEngine.from_pretrained(model_dir).score([seq])[0]
    assert scored != full  # float32 scoring would hide a sampler that reads other weights


def test_runs_that_cannot_use_it_are_refused_by_name(model_dir, monkeypatch):
    with pytest.raises(ConfigError, match="sampler_dtype.*not one of"):
        load_config(None, ["model.sampler_dtype=fp8"])
    with pytest.raises(ConfigError, match="engine_args.dtype"):
        load_config(None, ["model.engine=vllm", "model.sampler_dtype=bfloat16"])
    engine = HFEngine.from_pretrained(model_dir, sampler_dtype=torch.bfloat16)
    monkeypatch.setattr(FastDecoder, "supports", staticmethod(lambda model: False))
    with pytest.raises(ConfigError, match="needs the fast decoder.*sampler_dtype=float32"):
        engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=2))


def test_a_bf16_sampler_run_gets_the_narrow_canary_tolerance_and_still_catches_a_stale_engine(tmp_path):
    """One step of the CI config with model.sampler_dtype=bfloat16: the canary's tolerance is
    alarms.canary_tol_narrow, the healthy step raises no weight_sync alarm, and an engine that
    never receives the update (its copies frozen) is caught by the moved/still rule."""
    from pathlib import Path

    from agentrl.env import Score
    from agentrl.run.alarms import AlarmsConfig, weight_sync
    from agentrl.run.trainer import Trainer

    cfg_path = Path(__file__).resolve().parents[1] / "examples" / "arithmetic_ci.yaml"
    cfg = load_config(cfg_path, [f"output_dir={tmp_path / 'run'}", "train.steps=1", "eval.every=0",
                                 "eval.at_start=false", "model.sampler_dtype=bfloat16"])
    trainer = Trainer(cfg)
    assert trainer.canary.tol == cfg.alarms.canary_tol_narrow == 1.5
    trainer.env.score = lambda task, messages: Score(reward=float(len(messages[-1].content) % 2))
    row = trainer.train_step(1)
    assert 0 < row["sync/canary_abs_max"] < row["sync/canary_tol"] and "alarm/weight_sync" not in row
    assert weight_sync([{"step": 1, **row}], AlarmsConfig()) is None
    stale = dict(row, **{"sync/engine_moved": 0.0})  # what a bf16 copy that is never re-cast reports
    assert weight_sync([{"step": 1, **stale}], AlarmsConfig()) is not None


def test_the_update_runs_without_the_samplers_stale_copies(tmp_path):
    """The bf16 copies and the kept KV caches are freed before the update (the engine's
    sleep), not held through it while the optimizer step makes them stale."""
    from pathlib import Path

    from agentrl.env import Score
    from agentrl.run.trainer import Trainer

    cfg_path = Path(__file__).resolve().parents[1] / "examples" / "arithmetic_ci.yaml"
    cfg = load_config(cfg_path, [f"output_dir={tmp_path / 'run'}", "train.steps=1", "eval.every=0",
                                 "eval.at_start=false", "model.sampler_dtype=bfloat16"])
    trainer = Trainer(cfg)
    trainer.env.score = lambda task, messages: Score(reward=float(len(messages[-1].content) % 2))
    held = []
    update = trainer.update

    def watched(trajs):
        held.append((trainer.engine.cast.nbytes(), trainer.engine.prefix_cache.nbytes()))
        return update(trajs)

    trainer.update = watched
    trainer.train_step(1)
    assert held == [(0, 0)]
    assert trainer.engine.cast.nbytes() > 0  # the canary after the sync cast the new weights again


def test_the_bf16_sampler_fuses_qkv_and_gate_up_without_changing_the_logits(model_dir, monkeypatch):
    """With sampler copies, each layer's q/k/v and gate/up projections are one matrix each
    (4 matrix products a layer, not 7), packed for oneDNN where it runs; the logits are those
    of the separate bf16 products up to summation order, and the copies take no more bytes
    than one bf16 copy of the weights."""
    engine = HFEngine.from_pretrained(model_dir, max_cached_tokens=0)
    model = engine.model
    fused = FastDecoder(model, None, CastWeights(torch.bfloat16))
    got = _steps(fused, 4)
    layers = fused._layers()
    assert all(len(p.qkv.weights) == 1 and p.qkv.sizes == [128, 64, 64] and len(p.gate_up.weights) == 1
               and p.qkv.packed == packing_works(torch.bfloat16) for p in layers)
    assert layers[0].qkv.biases[0] is not None  # Qwen2's q/k/v biases are fused too
    # no part is cast twice; a tied LM head is the exception: packed, beside the embedding's copy
    tied = model.lm_head.weight is model.get_input_embeddings().weight
    assert fused.cast.nbytes() == 2 * (sum(p.numel() for p in model.parameters()) + tied * model.lm_head.weight.numel())
    # the parts one by one, each a plain bf16 copy: what the decoder ran before fusing
    monkeypatch.setattr(Projection, "of", classmethod(lambda cls, ws, bs, dtype: cls(
        [w.detach().to(dtype) for w in ws], [None if b is None else b.detach().to(dtype) for b in bs],
        [w.shape[0] for w in ws])))
    apart = FastDecoder(model, None, CastWeights(torch.bfloat16))
    want = _steps(apart, 4)
    assert len(apart._layers()[0].qkv.weights) == 3
    for a, b in zip(got, want):
        assert (a - b).abs().max().item() < 0.02 * max(1.0, b.abs().max().item())


def test_a_projection_follows_an_in_place_change_of_any_part():
    parts = [torch.nn.Linear(3, n).weight for n in (4, 2)]
    cast = CastWeights(torch.bfloat16)
    first = cast.projection(parts, [None, None])
    x = torch.randn(5, 3).bfloat16()
    assert [tuple(y.shape) for y in first(x)] == [(5, 4), (5, 2)] and cast.projection(parts, [None, None]) is first
    with torch.no_grad():
        parts[1].mul_(2.0)
    again = cast.projection(parts, [None, None])
    assert again is not first
    assert torch.equal(again(x)[1], torch.nn.functional.linear(x, parts[1].detach().bfloat16()))
    own = CastWeights(None).projection(parts, [None, None])  # float32: the parameters themselves
    assert own.weights[0] is parts[0] and CastWeights(None).nbytes() == 0
    cast.clear()
    assert cast.nbytes() == 0


@pytest.mark.skipif(not packing_works(torch.bfloat16), reason="oneDNN does not run bfloat16 on this CPU")
def test_the_packed_product_is_bit_identical_to_f_linear():
    """The oneDNN-packed matrix gives exactly F.linear's result on the same bf16 matrix, for
    a decode step's rows, one row, and a prefill's many, with and without a bias."""
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(96, 64, generator=gen)
    b = torch.randn(96, generator=gen)
    for bias in (None, b):
        proj = Projection.of([w[:64], w[64:]], [None, None] if bias is None else [bias[:64], bias[64:]],
                             torch.bfloat16)
        assert proj.packed and proj.weights[0].is_mkldnn
        for rows in (1, 48, 700):
            x = torch.randn(rows, 64, generator=gen).bfloat16()
            want = torch.nn.functional.linear(x, w.bfloat16(), None if bias is None else bias.bfloat16())
            assert torch.equal(torch.cat(proj(x), dim=-1), want)
    assert proj.nbytes() == 96 * 64 * 2 + 96 * 2


def test_a_part_without_a_bias_among_biased_parts_gets_zeros():
    """Fused q/k/v where only some parts have a bias: the missing one adds exact zeros, so each
    output is the bf16 product of its own part with its own bias (or none)."""
    gen = torch.Generator().manual_seed(2)
    ws = [torch.randn(n, 8, generator=gen) for n in (4, 2)]
    bias = torch.randn(4, generator=gen)
    proj = Projection.of(ws, [bias, None], torch.bfloat16)
    assert len(proj.weights) == 1 and proj.biases[0].shape == (6,)
    x = torch.randn(3, 8, generator=gen).bfloat16()
    full = torch.nn.functional.linear(x, torch.cat(ws).bfloat16(), torch.cat([bias, torch.zeros(2)]).bfloat16())
    assert torch.equal(torch.cat(proj(x), dim=-1), full)
    alone = torch.nn.functional.linear(x, ws[1].bfloat16())  # the same sums, maybe in another order
    assert torch.allclose(proj(x)[1].float(), alone.float(), atol=0.05, rtol=0.01)
