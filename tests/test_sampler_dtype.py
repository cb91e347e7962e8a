"""The bfloat16 sampler (model.sampler_dtype, agentrl/engines/sampler_dtype.py): its logits are
the float32 ones up to bfloat16 rounding, an optimizer step reaches it, its KV is bfloat16, the
canary scores what it samples with, and a run that cannot use it is refused by name."""

from __future__ import annotations

import pytest
import torch

from agentrl.engines.base import SamplingParams
from agentrl.engines.decode import FastDecoder
from agentrl.engines.hf import HFEngine
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
