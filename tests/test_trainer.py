"""The training loop on the tiny model: one step changes the weights and writes the run dir;
a run killed with SIGKILL mid-step resumes from its last checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from agentrl.run.checkpoint import list_checkpoints
from agentrl.run.config import load_config
from agentrl.run.trainer import Trainer
from agentrl.types import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
CI_CFG = ROOT / "examples" / "arithmetic_ci.yaml"

REQUIRED_METRICS = ["step", "reward/mean", "reward/std", "groups/zero_variance_frac", "tools/calls_per_traj",
                    "tools/error_rate", "turns/mean", "finish/length_frac", "response/len_mean", "loss",
                    "clip_frac", "kl", "entropy", "grad_norm", "time/rollout", "time/tools", "time/update"]


@pytest.mark.slow
def test_one_step_changes_weights_and_writes_run_dir(tmp_path, capsys):
    cfg = load_config(CI_CFG, [f"output_dir={tmp_path / 'run'}", "train.steps=1", "eval.num_tasks=4"])
    trainer = Trainer(cfg)
    # the untrained tiny model never solves a task; reward every other attempt so the step has signal
    from agentrl.env import Score
    trainer.env.score = lambda task, messages: Score(reward=float(len(messages[-1].content) % 2))
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    result = trainer.train()
    out = capsys.readouterr().out
    assert "── objective" in out and "seq-mean-token-mean" in out
    changed = [k for k, v in trainer.model.named_parameters() if not torch.equal(v, before[k])]
    assert changed, "one GRPO step must change the parameters"
    run = tmp_path / "run"
    assert result.run_dir == run
    assert (run / "config.yaml").exists()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    assert "eval/accuracy" in rows[0] and "eval/accuracy" in rows[1]
    assert (result.first_eval, result.first_eval_step) == (rows[0]["eval/accuracy"], 0)
    assert (result.final_eval, result.final_eval_step) == (rows[1]["eval/accuracy"], 1)
    assert "Writing model shards" not in out + capsys.readouterr().err  # no stray bars through GRPO's
    for key in REQUIRED_METRICS:
        assert key in rows[1], key
    # memory (agentrl/run/memory.py): the policy's bytes, AdamW's two moments, the phases' peaks
    weights = sum({p.data_ptr(): p.numel() * p.element_size() for p in trainer.model.parameters()}.values())
    assert rows[1]["memory/weights_gb"] == pytest.approx(weights / 1e9)
    assert rows[1]["memory/optimizer_gb"] >= 2 * rows[1]["memory/weights_gb"]
    assert rows[1]["memory/peak_update_gb"] > rows[1]["memory/weights_gb"] + rows[1]["memory/optimizer_gb"]
    assert {"memory/peak_rollout_gb", "memory/peak_eval_gb", "memory/rest_gb"} <= rows[1].keys()
    assert result.peak_memory_gb >= rows[1]["memory/peak_gb"] - 1e-9
    assert "peak resident memory" in out
    trajs = read_jsonl(str(run / "rollouts" / "step_000001.jsonl"))
    assert len(trajs) == cfg.train.prompts_per_step * cfg.algo.num_samples
    for t in trajs:
        t.check()
        assert t.advantage is not None and t.reward is not None
        if t.advantage == 0.0:  # no KL term: skipped by the update (train.skip_zero_advantage)
            assert t.old_logprobs is None
            continue
        assert t.old_logprobs is not None and len(t.old_logprobs) == len(t.token_ids)
        assert all(o == 0.0 for o, m in zip(t.old_logprobs, t.loss_mask) if m == 0)
        # π_old is scored on the sampler's own tokens: it agrees with the sampler's log-probs
        diffs = [abs(o - s) for o, s, m in zip(t.old_logprobs, t.logprobs, t.loss_mask) if m]
        assert max(diffs, default=0.0) < 1e-3
    assert any(t.old_logprobs is not None for t in trajs)
    assert list((run / "tensorboard").iterdir())
    assert (run / "plots" / "curves.png").stat().st_size > 1000
    ck = list_checkpoints(run)
    assert [s for s, _ in ck] == [1]
    for name in ["model/config.json", "model/model.safetensors", "state.pt", "config.yaml"]:
        assert (ck[0][1] / name).exists(), name


def _run_cli(args, **kw):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "agentrl", "train", str(CI_CFG), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, **kw)


@pytest.mark.slow
def test_kill9_mid_step_then_resume(tmp_path):
    run = tmp_path / "run"
    common = [f"output_dir={run}", "eval.at_start=false", "eval.num_tasks=4"]
    proc = _run_cli([*common, "train.steps=6"], start_new_session=True)
    deadline = time.time() + 600
    try:
        while time.time() < deadline:  # step 2's checkpoint exists -> step 3 is under way
            if [s for s, _ in list_checkpoints(run)][-1:] == [2]:
                break  # step 3 starts now: kill at once (a CI step can take only ~0.3 s)
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.05)
        else:
            pytest.fail("no step-2 checkpoint in time")
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    steps_before = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert [s for s, _ in list_checkpoints(run)] == [1, 2] and max(steps_before) <= 3

    done = _run_cli([*common, "train.steps=4", "resume=true"])
    out, _ = done.communicate(timeout=600)
    assert done.returncode == 0, out
    assert "resumed from" in out and "(step 2)" in out
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    # The summary reports the first evaluation of the run, written before the kill.
    evals = [(r["step"], r["eval/accuracy"]) for r in rows if r.get("eval/accuracy") is not None]
    summary = next(line for line in out.splitlines() if line.startswith("run written to"))
    assert evals and "None" not in summary, summary
    assert f"{evals[0][1]:.3f} (step {evals[0][0]})" in summary and f"(step {evals[-1][0]})" in summary, summary
    assert "Writing model shards" not in out
    # the end-of-run summary covers the whole run, the steps before the kill included
    assert "── run summary" in out and "in 4 steps" in out and f"agentrl inspect {run} --step last" in out, out
    for p in sorted((run / "rollouts").glob("step_*.jsonl")):
        for t in read_jsonl(str(p)):
            t.check()
    assert [s for s, _ in list_checkpoints(run)] == [3, 4]
