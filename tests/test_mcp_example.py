"""The example of docs/mcp.md, examples/arithmetic_mcp_tiny.yaml, for 2 GRPO steps: the tiny
model, warm-started on a short run of the environment's demonstrations, calls
mcp-server-calculator's ``calculate`` (from its own venv) inside real rollouts, through the
CLI, and the run trains on what it read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="needs the mcp package: pip install 'agentrl[mcp]'")

from test_mcp_servers import calculator_python  # noqa: E402,F401  (a fixture)

from agentrl.run.config import load_config  # noqa: E402
from agentrl.types import read_jsonl  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "arithmetic_mcp_tiny.yaml"
QUICK = ["train.steps=2", "train.prompts_per_step=4", "algo.num_samples=4", "eval.num_tasks=8", "eval.every=0",
         # a short warm start of correct demonstrations only: enough for the call format
         "warmstart.num_demos=256", "warmstart.steps=80", "warmstart.clean_steps=80", "warmstart.corruption=0.0"]


def test_the_example_lists_the_calculator():
    cfg = load_config(CONFIG)
    (server,) = cfg.tools.mcp
    assert (server.name, server.command, server.args, server.lifecycle) == (
        "calculator", ".venv-mcp/bin/python", ["-m", "mcp_server_calculator"], "run")


def test_two_steps_through_the_calculator(tmp_path, calculator_python):  # noqa: F811
    run = tmp_path / "run"
    server = f"tools.mcp=[{{name: calculator, command: '{calculator_python}', args: [-m, mcp_server_calculator]}}]"
    proc = subprocess.run([sys.executable, "-m", "agentrl", "train", str(CONFIG.relative_to(ROOT)),
                           f"output_dir={run}", server, *QUICK],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    calls = [c for step in (1, 2) for t in read_jsonl(str(run / "rollouts" / f"step_{step:06d}.jsonl"))
             for c in t.tool_calls]
    assert not [c for c in calls if c.error == "infra"]  # the model's own slips (a misspelt name) may be there
    answered = [c for c in calls if c.name == "calculate" and c.error is None]
    assert answered, [c.result for c in calls][:5]
    for c in answered:  # the server's own answers, as the model read them
        a, b = c.arguments["expression"].split("*") if "*" in c.arguments["expression"] else (None, None)
        if a and b and a.isdigit() and b.isdigit():
            assert c.result == str(int(a) * int(b))
