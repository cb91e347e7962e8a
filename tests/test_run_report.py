"""The end-of-run summary (agentrl/run/report.py), on hand-made metric rows."""

from __future__ import annotations

import json

from agentrl.run.report import run_report, summarize, warnings


def _step(step, reward, signal, calls=1.0, errors=0.0):
    return {"step": step, "reward/mean": reward, "groups/with_signal": signal, "tools/calls_per_traj": calls,
            "tools/error_rate": errors, "time/rollout": 1.0, "time/update": 2.0, "time/step": 4.0}


def test_the_table_reads_first_and_last_evaluation_per_family():
    rows = [{"step": 0, "eval/accuracy": 0.25, "eval/accuracy/a": 0.5, "eval/accuracy/b": 0.0},
            _step(1, 0.1, 4), _step(2, 0.6, 2),
            {"step": 2, "eval/accuracy": 0.75, "eval/accuracy/a": 1.0, "eval/accuracy/b": 0.5}]
    text = summarize(rows, "runs/r")
    assert "step 0 -> step 2" in text
    assert "   all                0.250 -> 0.750" in text
    assert "   a                  0.500 -> 1.000" in text and "   b                  0.000 -> 0.500" in text
    assert "0.100 (step 1) -> 0.600 (step 2)" in text
    assert "4 at step 1, 2 at step 2 (mean 3.0 over 2 steps)" in text
    assert "8.0 s in 2 steps: rollout 2.0 s, update 4.0 s, other 2.0 s" in text
    assert "agentrl inspect runs/r --step last" in text and "warning" not in text


def test_a_run_without_signal_says_so_and_names_the_fix():
    evals = [{"step": 0, "eval/accuracy": 0.0}, {"step": 3, "eval/accuracy": 0.0}]
    steps = [_step(s, 0.0, 0) for s in (1, 2, 3)]
    found = warnings(evals, steps, "runs/r")
    assert len(found) == 2
    assert "no group had signal" in found[0] and "docs/custom_env.md" in found[0]
    assert "never moved from 0.000" in found[1]
    assert summarize([evals[0], *steps, evals[1]], "runs/r").count(" warning ") == 2


def test_a_tool_that_always_fails_is_reported():
    steps = [_step(1, 0.5, 3, errors=1.0), _step(2, 0.5, 3, calls=0.0), _step(3, 0.5, 3, errors=1.0)]
    (found,) = warnings([], steps, "runs/r")
    assert "every tool call failed" in found and "agentrl inspect runs/r --tool-error" in found
    # one step whose calls worked is enough to stay quiet
    assert warnings([], [*steps, _step(4, 0.5, 3, errors=0.5)]) == []


def test_run_report_reads_the_metrics_file(tmp_path):
    assert run_report(tmp_path) == ""
    lines = [{"step": 0, "eval/accuracy": 0.0}, _step(1, 0.5, 1), {"step": 1, "eval/accuracy": 1.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"step": 2, "rew')
    text = run_report(tmp_path)  # a line cut by a kill is skipped
    assert "0.000 -> 1.000" in text and "1 steps" in text
    assert "no evaluation ran" in summarize([_step(1, 0.5, 1)], tmp_path)


def test_infrastructure_failures_are_summed_with_their_causes():
    steps = [{**_step(1, 0.5, 3), "infra/failed": 3.0, "infra/retried": 3.0, "infra/excluded": 1.0,
              "infra/groups_dropped": 0.0, "infra/cause/injected": 2.0, "infra/cause/sandbox_died": 1.0},
             {**_step(2, 0.5, 3), "infra/failed": 2.0, "infra/retried": 1.0, "infra/excluded": 1.0,
              "infra/groups_dropped": 1.0, "infra/cause/injected": 2.0}]
    text = summarize(steps, "runs/r")
    assert (" infrastructure       5 failed tries (injected 4, sandbox_died 1): 4 retried, 2 attempts excluded, "
            "1 groups dropped") in text
    assert "infrastructure" not in summarize([_step(1, 0.5, 3)], "runs/r")
