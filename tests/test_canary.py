"""The weight-sync canary (agentrl/run/canary.py) and its ``weight_sync`` alarm: after every sync
a fixed sequence is scored by the trainer and by the engine. A sync broken on purpose (skipped,
a stale copy, LoRA adapters not merged) is caught at the first step; healthy runs stay silent.

The broken syncs run in the layout where a sync copies weights: a one-rank FSDP2 run on CPU,
whose HF engine samples from its own full-weight copy (``parallel.fsdp=true``; with
``lora.enabled=true`` the adapters are merged into that copy, agentrl/scale/weight_sync.py).
In the default single-process layout the HF engine reads the trainer's own tensors, so there
is nothing to break there, and the canary agrees to ~5e-7.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from agentrl.run.alarms import AlarmsConfig, check
from agentrl.run.canary import WeightCanary, canary_ids
from agentrl.scale import weight_sync

ROOT = Path(__file__).resolve().parents[1]
CI_CFG = ROOT / "examples" / "arithmetic_ci.yaml"
CFG = AlarmsConfig()
OK = {"reward/mean": 0.5, "groups/with_signal": 4.0, "mismatch/abs_max": 1e-6, "train/attempts": 16.0}


def _rows(*sync: dict) -> list[dict]:
    return [{"step": s, **OK, "sync/canary_tol": 1e-3, **f} for s, f in enumerate(sync, 1)]


def _replay(rows: list[dict], cfg: AlarmsConfig = CFG) -> list[tuple[str, int]]:
    return [(a.name, a.step) for i in range(1, len(rows) + 1) for a in check(rows[:i], cfg)]


# -- the rule ----------------------------------------------------------------------------------


def test_the_rule_fires_on_a_gap_or_an_engine_that_did_not_move():
    good = {"sync/canary_abs_max": 5e-7, "sync/trainer_moved": 0.015, "sync/engine_moved": 0.015}
    assert _replay(_rows(good, good, good)) == []
    still = {**good, "sync/canary_abs_max": 0.015, "sync/engine_moved": 0.0}
    assert _replay(_rows(still, still, good, still)) == [("weight_sync", 1), ("weight_sync", 4)]
    (a,) = check(_rows(still), CFG)
    assert "moved the trainer's canary log-probs by 0.015 and the engine's by 0" in a.message
    assert "did not reach the engine" in a.message and "verl#7495" in a.message
    assert "mismatch/abs_max 1e-06" in a.message and "LoRA merged" in a.fix
    # a stale copy moves, but not to the trainer's weights
    stale = {**good, "sync/canary_abs_max": 0.02}
    ((b,),) = [check(_rows(good, stale), CFG)]
    assert b.step == 2 and "differ from the trainer's by 0.02 (max per token, tolerance 0.001)" in b.message
    # a bf16 or vLLM run logs its looser tolerance with the figures
    assert _replay(_rows({**stale, "sync/canary_tol": 0.5})) == []
    # a step that did not change the trainer (every group without signal): nothing to follow
    assert _replay(_rows({**good, "sync/trainer_moved": 0.0, "sync/engine_moved": 0.0})) == []
    # no canary (an engine that cannot score): no figures, no alarm; disabled: none either
    assert _replay([{"step": 1, **OK}]) == [] and _replay(_rows(still), AlarmsConfig(disable=["weight_sync"])) == []


def test_the_config_fields():
    from agentrl.run.config import ConfigError, load_config

    cfg = load_config(None, ["alarms.canary_tol=1e-4", "alarms.disable=[weight_sync]"]).alarms
    assert cfg.canary_tol == 1e-4 and cfg.canary_tokens == 32 and cfg.canary_tol_loose == 0.5
    with pytest.raises(ConfigError, match="alarms.canary_tokens=1 is out of range"):
        load_config(None, ["alarms.canary_tokens=1"])


def test_the_canary_is_the_first_prompt_then_a_seeded_tail():
    from transformers import AutoTokenizer

    from agentrl.models.tiny import ensure_tiny_model

    tok = AutoTokenizer.from_pretrained(ensure_tiny_model())
    ids = canary_ids(tok, "What is 2+3?", 32, len(tok), seed=0)
    head = tok.encode("What is 2+3?", add_special_tokens=False)
    assert len(ids) == 32 and ids[: len(head)] == head and ids == canary_ids(tok, "What is 2+3?", 32, len(tok), 0)
    assert ids != canary_ids(tok, "What is 2+3?", 32, len(tok), seed=1) and max(ids) < len(tok)


# -- at the WeightSync level: a trainer, a sampler copy, the HF engine on it --------------------


def _tiny():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.models.tiny import ensure_tiny_model

    path = ensure_tiny_model()
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def _optimizer_step(model, seed: int) -> None:
    """A step's worth of change on the trainable parameters (LoRA: the adapters only)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=g) * 1e-3)


def _unmerged(module, prefix):
    """The fault of (c): the base weight goes to the sampler without the adapter's B A."""
    yield prefix + "weight", weight_sync._full(module.base_layer.weight)  # gathered, under FSDP
    if getattr(module.base_layer, "bias", None) is not None:
        yield prefix + "bias", weight_sync._full(module.base_layer.bias)


@pytest.mark.parametrize("fault", ["none", "skip", "told_not_given", "stale", "lora", "lora_unmerged"])
def test_at_the_weight_sync_level(fault, monkeypatch):
    from agentrl.engines.hf import HFEngine

    trainer, tok = _tiny()
    if fault.startswith("lora"):
        from agentrl.scale.config import LoRAConfig
        from agentrl.scale.parallel import apply_lora

        trainer = apply_lora(trainer, LoRAConfig(enabled=True, r=4))
    if fault == "lora_unmerged":
        monkeypatch.setattr(weight_sync, "_merged_lora", _unmerged)
    sampler = _tiny()[0].requires_grad_(False)
    engine = HFEngine(sampler, tok)
    sync = weight_sync.WeightSync(engine, sampler, shared=False)
    sync(trainer)
    canary = WeightCanary(engine, canary_ids(tok, "What is 2+3?", 32, len(tok), 0), tol=1e-3, device="cpu")
    canary.baseline(trainer)
    rows, before = [], copy.deepcopy(trainer)
    for step in (1, 2):
        _optimizer_step(trainer, step)
        if fault in ("none", "lora", "lora_unmerged"):
            sync(trainer)
        elif fault == "told_not_given":
            engine.sync_weights(sampler)  # the version moves, the weights do not
        elif fault == "stale":
            sync(before)  # the weights of the step before
        before = copy.deepcopy(trainer)
        rows.append({"step": step, **OK, **canary.after_sync(trainer)})
    fired = _replay(rows)
    if fault in ("none", "lora"):
        assert fired == [] and all(r["sync/canary_abs_max"] < 1e-5 for r in rows)
        assert all(abs(r["sync/engine_moved"] - r["sync/trainer_moved"]) < 1e-5 for r in rows)
    else:
        assert fired == [("weight_sync", 1)], (fault, rows)
    assert all(r["sync/trainer_moved"] > 1e-3 for r in rows)
    assert rows[0]["time/canary"] < 1.0


# -- through the Trainer: faults caught at step 1, healthy runs silent ---------------------------


def _run(tmp_path, overrides: list[str], fault=None, steps: int = 2):
    """A short run of the CPU CI example whose attempts get rewards with signal (so every step
    updates the weights); ``fault(trainer)`` breaks its sync. Returns (rows, console lines)."""
    from agentrl.env import Score
    from agentrl.run.config import load_config
    from agentrl.run.trainer import Trainer

    cfg = load_config(CI_CFG, [f"output_dir={tmp_path / 'run'}", f"train.steps={steps}", "eval.at_start=false",
                               "eval.num_tasks=2", "train.checkpoint_every=100", *overrides])
    seen: list[str] = []
    trainer = Trainer(cfg, log=lambda *a, **k: seen.append(" ".join(map(str, a))))
    trainer.env.score = lambda task, messages: Score(reward=float(len(messages[-1].content) % 2))
    if fault is not None:
        fault(trainer)
    trainer.train()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    return rows, seen


def _skip(trainer):  # (a) the sync never runs
    trainer.sync = lambda model: None


def _lagging_copy():
    """(b) ``copy_weights`` that writes the weights of the call before (the first call: none, so
    the sampler keeps the step-0 weights)."""
    held: dict[str, torch.Tensor] = {}

    def copy_weights(model, dst):
        now = {n: t.clone() for n, t in weight_sync.export_weights(model)}
        with torch.no_grad():
            for n, p in dst.named_parameters():
                if n in held:
                    p.copy_(held[n])
        held.update(now)
        return len(now)

    return copy_weights


FAULTS = {  # the layout where the sync copies, and how it is broken
    "skipped": (["parallel.fsdp=true"], "skip"),
    "stale_copy": (["parallel.fsdp=true"], "stale"),
    "lora_not_merged": (["parallel.fsdp=true", "lora.enabled=true", "lora.r=4"], "unmerged"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FAULTS))
def test_a_broken_sync_is_caught_at_the_first_step(name, tmp_path, monkeypatch):
    overrides, kind = FAULTS[name]
    if kind == "stale":
        monkeypatch.setattr(weight_sync, "copy_weights", _lagging_copy())
    elif kind == "unmerged":
        monkeypatch.setattr(weight_sync, "_merged_lora", _unmerged)
    rows, seen = _run(tmp_path, overrides, _skip if kind == "skip" else None)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0].get("alarm/weight_sync") == 1.0, rows[0]
    assert any(line.startswith("ALARM weight_sync (step 1)") for line in seen), seen
    assert rows[0]["sync/trainer_moved"] > 1e-3 and rows[0]["sync/canary_abs_max"] > 1e-3
    assert rows[0]["sync/engine_moved"] == 0.0  # step 1 of each: the engine still holds the step-0 weights
    assert "alarm/weight_sync" not in rows[1]  # still broken at step 2: not fired again


HEALTHY = {
    "ci_example": [],  # the HF engine reads the trainer's tensors
    "fsdp_copy": ["parallel.fsdp=true"],  # its own full copy, refreshed by WeightSync
    "lora": ["lora.enabled=true", "lora.r=4"],  # samples the peft model itself
    "lora_fsdp_merged": ["parallel.fsdp=true", "lora.enabled=true", "lora.r=4"],  # adapters merged into the copy
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(HEALTHY))
def test_healthy_runs_stay_silent(name, tmp_path):
    rows, seen = _run(tmp_path, HEALTHY[name], steps=3)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert not any("alarm/weight_sync" in r for r in rows) and not any("ALARM weight_sync" in s for s in seen)
    for r in rows:
        assert r["sync/canary_abs_max"] < 1e-5 and r["sync/canary_tol"] == 1e-3
        assert abs(r["sync/engine_moved"] - r["sync/trainer_moved"]) < 1e-5
    assert any(r["sync/trainer_moved"] > 1e-3 for r in rows)  # the weights did move
    cost = [r["time/canary"] for r in rows]
    print(f"\n{name}: canary {1e3 * sum(cost) / len(cost):.1f} ms/step, "
          f"step {sum(r['time/step'] for r in rows) / len(rows):.2f} s")
