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


def test_the_smollm2_example_scores_what_its_learned_replies_write():
    """examples/smollm2_reasoning_gym.yaml (docs/results.md): its one-shot prompt is the task's
    own form, the replies the trained model writes (code, its output, "The answer is N",
    negatives included) earn 1.0 and a wrong or missing answer 0, on a held-out set that
    does not move with the run's seed."""
    from agentrl.chat.formats import get_format
    from agentrl.run.build import make_env
    from agentrl.types import Message

    cfg = load_config(ROOT / "examples" / "smollm2_reasoning_gym.yaml")
    assert cfg.model.tool_call_format == "code_block" and cfg.env.args["tools"] == ["python"]
    env = make_env(cfg)
    again = make_env(load_config(ROOT / "examples" / "smollm2_reasoning_gym.yaml", ["seed=2"]))
    test = env.tasks("test")[: cfg.eval.num_tasks]
    assert [t.prompt for t in test] == [t.prompt for t in again.tasks("test")[: cfg.eval.num_tasks]]
    assert len(test) == 64 and not {t.prompt for t in test} & {t.prompt for t in env.tasks("train")}
    form = test[0].prompt.rsplit(":", 1)[0]
    assert form + ":" in cfg.env.args["system_prompt"]  # the example shows the task's own wording
    assert [t.name for t in env.tools()] == ["python"] and get_format("code_block") is not None
    negative = next(t for t in test if t.answer.startswith("-"))
    for task in (test[0], negative):
        expr = task.prompt.rsplit(":", 1)[1].strip().rstrip("=").strip()
        reply = f"```python\nprint({expr})\n```\n```output\n{task.answer}\n```\nThe answer is {task.answer}"
        assert env.score(task, [Message("user", task.prompt), Message("assistant", reply)]).reward == 1.0
        wrong = reply.replace(f"The answer is {task.answer}", "The answer is 1000")
        assert env.score(task, [Message("user", task.prompt), Message("assistant", wrong)]).reward == 0.0
        silent = reply.split("The answer")[0]  # the code and its output, no answer: not scored from the output
        assert env.score(task, [Message("user", task.prompt), Message("assistant", silent)]).reward == 0.0
