"""Every example config loads; the CPU smoke configs run end to end (2 steps)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.run.config import load_config
from agentrl.types import read_jsonl

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_example_configs_are_valid(path):
    cfg = load_config(path)
    assert cfg.algo.num_samples >= 2
    assert cfg.rollout.max_total_tokens > cfg.rollout.max_new_tokens


@pytest.mark.slow
def test_search_smoke_run_through_the_cli(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "agentrl", "train", str(EXAMPLES / "search_tiny.yaml"), f"output_dir={run}",
         "eval.num_tasks=4"],
        capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    trajs = read_jsonl(str(run / "rollouts" / "step_000002.jsonl"))
    assert len(trajs) == 16
    for t in trajs:
        t.check()
    assert (run / "checkpoints" / "step_000002" / "state.pt").exists()
