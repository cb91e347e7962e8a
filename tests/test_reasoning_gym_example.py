"""examples/reasoning_gym_tiny.yaml trains end to end through the CLI (2 GRPO steps on the
offline tiny model) and reports held-out accuracy per reasoning-gym dataset."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("reasoning_gym")

from agentrl.run.config import load_config  # noqa: E402
from agentrl.types import read_jsonl  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "reasoning_gym_tiny.yaml"


def test_the_example_names_datasets_with_configs_and_the_python_tool():
    cfg = load_config(CONFIG)
    assert cfg.env.name.startswith("reasoning_gym:") and cfg.model.path == "tiny"
    assert cfg.env.args["tools"] == ["python"] and set(cfg.env.args["configs"]) == {"chain_sum", "leg_counting"}


def test_the_example_trains_two_steps_and_reports_each_dataset(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "agentrl", "train", str(CONFIG), f"output_dir={run}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in (rows[0], rows[-1]):
        assert {"eval/accuracy", "eval/accuracy/chain_sum", "eval/accuracy/leg_counting"} <= set(r)
    trajs = read_jsonl(str(run / "rollouts" / "step_000002.jsonl"))
    assert len(trajs) == 16 and {t.family for t in trajs} <= {"chain_sum", "leg_counting"}
    for t in trajs:
        t.check()
        assert t.verdict is not None and 0.0 <= t.verdict.reward <= 1.0
