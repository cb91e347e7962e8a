"""Health alarms (agentrl/run/alarms.py): each rule fires on a history made to raise it, fires
once when it starts, stays quiet on the healthy CPU example (tests/fixtures/healthy_runs), and
reaches the console, the metrics row, the run summary and, under ``on_alarm=stop``, the exit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl import cli
from agentrl.run.alarms import ALARMS, AlarmMonitor, AlarmsConfig, AlarmStop, check
from agentrl.run.config import ConfigError, load_config
from agentrl.run.metrics import read_metrics
from agentrl.run.report import summarize
from agentrl.types import Failure, ToolCallRecord, Trajectory

ROOT = Path(__file__).resolve().parents[1]
CI_CFG = ROOT / "examples" / "arithmetic_ci.yaml"
HEALTHY = sorted((ROOT / "tests" / "fixtures" / "healthy_runs").glob("*.jsonl"))
CFG = AlarmsConfig()

# a healthy step of the CPU example: signal, tool calls that work, measured entropy and mismatch
OK = {"reward/mean": 0.5, "groups/with_signal": 8.0, "tools/calls_per_traj": 1.0, "tools/error_rate": 0.05,
      "finish/length_frac": 0.0, "entropy": 0.5, "mismatch/abs_mean": 3e-7, "train/attempts": 128.0,
      "train/skipped_zero_adv": 10.0, "infra/failed": 0.0, "infra/excluded": 0.0}


def _rows(*changes: dict, first: int = 1) -> list[dict]:
    """One step row per ``changes`` entry: the healthy row with those keys changed."""
    return [{"step": s, **OK, **c} for s, c in enumerate(changes, first)]


def _replay(history: list[dict], cfg: AlarmsConfig = CFG) -> list[tuple[str, int]]:
    """(name, step) of every alarm a run with this history would have fired, step by step."""
    return [(a.name, a.step) for i in range(1, len(history) + 1) for a in check(history[:i], cfg)]


# -- the healthy CPU example ------------------------------------------------------------------


@pytest.mark.parametrize("path", HEALTHY, ids=lambda p: p.stem)
def test_the_healthy_cpu_example_raises_no_alarm(path):
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 31 and rows[-1]["eval/accuracy"] == 1.0
    assert _replay(rows) == []
    mon, seen = AlarmMonitor(CFG, log=lambda s: seen.append(s)), []
    for r in rows[1:]:
        mon.step(r["step"], dict(r))
    assert seen == [] and mon.fired == []


def test_the_fixtures_are_the_three_seeds_and_an_injected_fault_run():
    assert [p.stem for p in HEALTHY] == ["arithmetic_tiny_faults0.15_seed0", "arithmetic_tiny_seed0",
                                         "arithmetic_tiny_seed1", "arithmetic_tiny_seed2"]


# -- each alarm -----------------------------------------------------------------------------


@pytest.mark.parametrize("reward, says, fix", [
    (0.0, "no attempt succeeded", "warmstart.enabled=true"),
    (1.0, "every attempt succeeded", "harder tasks"),
    (0.5, "always or never solved", "algo.num_samples"),
])
def test_no_signal_names_the_likely_cause_from_the_reward(reward, says, fix):
    dead = {"groups/with_signal": 0.0, "reward/mean": reward}
    rows = _rows({}, dead, dead, dead)
    (a,) = check(rows, CFG)
    assert (a.name, a.step) == ("no_signal", 4)
    assert "no group with signal for 3 steps" in a.message and says in a.message and fix in a.fix
    assert "docs/custom_env.md" in a.fix or "docs/reward_integrity.md" in a.fix or reward == 0.5
    assert check(rows[:-1], CFG) == []  # two steps are not enough
    assert _replay(_rows(dead, dead, {}, dead, dead)) == []  # a step with signal breaks the run of steps


def test_no_signal_says_when_the_attempts_ran_out_of_tokens():
    dead = {"groups/with_signal": 0.0, "reward/mean": 0.0, "finish/length_frac": 1.0}
    (a,) = check(_rows(dead, dead, dead), CFG)
    assert "100% of the attempts ran out of tokens" in a.message and "rollout.max_new_tokens" in a.message


def test_tool_errors_fire_with_the_first_error_text_of_the_step():
    bad = {"tools/error_rate": 1.0}
    assert _replay(_rows({}, bad, bad, bad, bad)) == [("tool_errors", 4)]
    assert _replay(_rows(bad, bad, {"tools/calls_per_traj": 0.0}, bad)) == []  # a step without calls breaks it
    call = ToolCallRecord("python", {"code": "x"}, "Traceback ...\nNameError: name 'x' is not defined",
                          "exception", 0.1, 0)
    traj = Trajectory(token_ids=[], prompt_len=0, loss_mask=[], logprobs=[], spans=[], messages=[],
                      tool_calls=[call])
    mon, seen = AlarmMonitor(CFG, log=lambda s: seen.append(s)), []
    fired = [mon.step(r["step"], r, [traj]) for r in _rows(bad, bad, bad)][-1]
    (a,) = fired
    assert "first this step: python: exception: Traceback ... NameError: name 'x' is not defined" in a.message
    assert "agentrl inspect RUN --tool-error" in a.fix and seen == [a.text()]


def test_infra_failures_fire_on_excluded_attempts_or_many_retried_tries():
    excluded = {"infra/excluded": 20.0, "train/attempts": 108.0}  # 16% of 128 attempts
    assert _replay(_rows(excluded, excluded, excluded)) == [("infra_failures", 3)]
    flaky = {"infra/failed": 90.0}  # every attempt retried, none excluded
    (a,) = check(_rows(flaky, flaky, flaky), CFG)
    assert "0.7, 0.7, 0.7 failed tries per attempt" in a.message and "train.max_infra_fail_frac" in a.message
    assert _replay(_rows(*[{"infra/failed": 30.0, "infra/excluded": 5.0}] * 5)) == []  # the 15%-fault example
    traj = Trajectory(token_ids=[], prompt_len=0, loss_mask=[], logprobs=[], spans=[], messages=[],
                      failure=Failure("tool:search", "connection_refused", "the index at :9200 refused"))
    mon = AlarmMonitor(CFG, log=lambda s: None)
    (a,) = [mon.step(r["step"], r, [traj]) for r in _rows(excluded, excluded, excluded)][-1]
    assert "first this step: tool:search (connection_refused): the index at :9200 refused" in a.message


def test_tool_calls_collapse_against_the_first_steps():
    calls = [1.0, 1.1, 0.9, 0.6, 0.3, 0.2, 0.1, 0.1, 0.1]
    rows = _rows(*[{"tools/calls_per_traj": c} for c in calls])
    assert _replay(rows) == [("tool_calls_collapse", 7)]  # steps 5-7: 0.20 < 25% of 1.00
    (a,) = check(rows[:7], CFG)
    assert "fell from 1.00 (first 3 steps) to 0.20" in a.message and "verl PR#4998" in a.message
    # a model that barely called its tools to begin with: nothing collapsed
    assert _replay(_rows(*[{"tools/calls_per_traj": c} for c in [0.1, 0.1, 0.1, 0.0, 0.0, 0.0]])) == []


def test_entropy_collapse_absolute_and_relative():
    assert _replay(_rows(*[{"entropy": e} for e in [0.005, 0.004, 0.003]])) == [("entropy_collapse", 3)]
    falling = [0.6, 0.6, 0.6, 0.2, 0.05, 0.03, 0.02, 0.02]
    assert _replay(_rows(*[{"entropy": e} for e in falling])) == [("entropy_collapse", 8)]  # 0.023 < 5% of 0.6
    # steps whose attempts were all skipped (advantage 0) log entropy 0.0, unmeasured: no alarm
    skipped = {"entropy": 0.0, "train/skipped_zero_adv": 128.0}
    assert _replay(_rows(skipped, skipped, skipped, skipped)) == []


def test_mismatch_above_the_threshold_or_growing():
    assert _replay(_rows(*[{"mismatch/abs_mean": m} for m in [0.2, 0.3, 0.25]])) == [("mismatch", 3)]
    growing = [1e-3, 1e-3, 1e-3, 5e-3, 2e-2, 3e-2, 4e-2]
    ((name, step),) = _replay(_rows(*[{"mismatch/abs_mean": m} for m in growing]))
    assert (name, step) == ("mismatch", 6)  # steps 4-6: 0.018 > 10x 0.001 and > 0.01
    # the synchronous HF engine: ~1e-7, however it wanders
    noise = [3e-7, 1e-7, 9e-7, 4e-6, 5e-6, 6e-6, 8e-6]
    assert _replay(_rows(*[{"mismatch/abs_mean": m} for m in noise])) == []


def test_reward_rising_while_held_out_accuracy_falls():
    rewards = [0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75]
    steps = _rows(*[{"reward/mean": r} for r in rewards])
    acc = {0: 0.8, 5: 0.72, 10: 0.6}
    history = [{"step": 0, "eval/accuracy": acc[0]}]
    for r in steps:
        history.append({**r, "eval/accuracy": acc[r["step"]]} if r["step"] in acc else r)
    assert _replay(history) == [("reward_vs_eval", 10)]
    (a,) = check(history, CFG)
    assert "held-out accuracy fell (0.8, 0.72, 0.6)" in a.message and "audit-env" in a.fix
    # accuracy that rose in between, or a flat training reward: no alarm
    up = [{**r, "eval/accuracy": 0.9} if r["step"] == 5 else r for r in history]
    assert _replay(up) == []
    flat = [{**r, "reward/mean": 0.5} if "reward/mean" in r else r for r in history]
    assert _replay(flat) == []


# -- firing, stopping, resuming, reporting -----------------------------------------------------


def test_an_alarm_fires_once_when_it_starts_and_again_after_it_cleared():
    dead = {"groups/with_signal": 0.0, "reward/mean": 0.0}
    rows = _rows(dead, dead, dead, dead, dead, {}, dead, dead, dead)
    assert _replay(rows) == [("no_signal", 3), ("no_signal", 9)]
    assert _replay(rows, AlarmsConfig(steps=1)) == [("no_signal", 1), ("no_signal", 7)]
    assert _replay(rows, AlarmsConfig(disable=["no_signal"])) == []


def test_the_monitor_marks_the_row_and_stops_when_asked():
    dead = {"groups/with_signal": 0.0, "reward/mean": 0.0}
    rows = _rows(dead, dead)
    warn = AlarmMonitor(AlarmsConfig(steps=2), log=lambda s: None)
    fired = [warn.step(r["step"], r) for r in rows]
    assert fired[0] == [] and [a.name for a in fired[1]] == ["no_signal"]
    assert rows[1]["alarm/no_signal"] == 1.0 and not any(k.startswith("alarm/") for k in rows[0])
    warn.stop_if_asked(fired[1])  # warn: no exception
    stop = AlarmMonitor(AlarmsConfig(steps=2, on_alarm="stop"), log=lambda s: None)
    stop.stop_if_asked([])
    with pytest.raises(AlarmStop, match=r"(?s)on_alarm=stop.*ALARM no_signal \(step 2\)") as err:
        stop.stop_if_asked([stop.step(r["step"], dict(r)) for r in rows][-1])
    assert [a.name for a in err.value.alarms] == ["no_signal"] and isinstance(err.value, RuntimeError)


def test_the_monitor_starts_from_the_metrics_file_so_a_resume_does_not_fire_again(tmp_path):
    dead = {"groups/with_signal": 0.0, "reward/mean": 0.0}
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [{"step": 0, "eval/accuracy": 0.0},
                                                           *_rows(dead, dead, {**dead, "entropy": None})]))
    resumed = AlarmMonitor(CFG, log=lambda s: None, metrics_path=path)
    assert resumed.step(4, {**OK, **dead}) == []  # already firing at step 3: not new
    # rows at or after the step seen are not history (a killed run's lines past its checkpoint)
    early = AlarmMonitor(CFG, log=lambda s: None, metrics_path=path)
    assert [a.name for a in early.step(3, {**OK, **dead})] == ["no_signal"]
    assert [r["step"] for r in early.history] == [0, 1, 2, 3]


def test_the_run_summary_lists_the_alarms():
    dead = {"groups/with_signal": 0.0, "reward/mean": 0.0}
    rows = [{**r, "time/step": 1.0} for r in _rows({}, dead, dead, dead, {"tools/error_rate": 1.0})]
    rows[3]["alarm/no_signal"] = 1.0
    rows[4]["alarm/tool_errors"] = 1.0
    text = summarize(rows, "runs/r")
    assert " alarm                no_signal at step 4: no group with signal (nothing to learn from); " \
           "docs/alarms.md" in text
    assert " alarm                tool_errors at step 5: most tool calls failed; docs/alarms.md" in text
    assert " alarm " not in summarize(_rows({}, {}), "runs/r")


def test_the_config_section():
    cfg = load_config(None, ["alarms.on_alarm=stop", "alarms.steps=2", "alarms.disable=[mismatch]"])
    assert (cfg.alarms.on_alarm, cfg.alarms.steps, cfg.alarms.disable) == ("stop", 2, ["mismatch"])
    with pytest.raises(ConfigError, match="not one of"):
        load_config(None, ["alarms.on_alarm=halt"])
    with pytest.raises(ConfigError, match=r"alarms.disable: \['nosuch'\] not among the alarms"):
        load_config(None, ["alarms.disable=[nosuch]"])
    with pytest.raises(ConfigError, match="alarms.steps=0 is out of range"):
        load_config(None, ["alarms.steps=0"])
    assert set(ALARMS) == {"no_signal", "tool_errors", "infra_failures", "tool_calls_collapse",
                           "entropy_collapse", "mismatch", "reward_vs_eval"}


def test_docs_alarms_md_describes_every_alarm():
    text = (ROOT / "docs" / "alarms.md").read_text()
    assert all(f"`{name}`" in text for name in ALARMS)
    assert "alarms.on_alarm" in text and len(text.splitlines()) <= 80


# -- end to end: a run that never succeeds ------------------------------------------------------


@pytest.mark.slow
def test_a_run_that_never_succeeds_raises_no_signal_and_stops_when_asked(tmp_path, monkeypatch, capsys):
    """arithmetic_ci without a warm start: the tiny model never succeeds, no group has signal.
    Warn: the alarm at step 2 in the console, metrics.jsonl and the summary, exit 0. Stop: exit
    through AlarmStop with step 2 checkpointed; a resume goes on (the alarm is not new)."""
    monkeypatch.chdir(tmp_path)
    common = [str(CI_CFG), "train.steps=3", "alarms.steps=2", "eval.at_start=false", "eval.num_tasks=2"]
    assert cli.main(["train", *common, "output_dir=runs/warn"]) == 0
    out = capsys.readouterr().out
    rows = read_metrics(tmp_path / "runs" / "warn" / "metrics.jsonl")
    assert [(r["step"], k) for r in rows for k in r if k.startswith("alarm/")] == [(2, "alarm/no_signal")]
    assert "ALARM no_signal (step 2): no group with signal for 2 steps" in out and "warmstart.enabled" in out
    assert " alarm                no_signal at step 2" in out

    with pytest.raises(AlarmStop, match="no_signal"):
        cli.main(["train", *common, "output_dir=runs/stop", "alarms.on_alarm=stop"])
    err = capsys.readouterr().err
    assert "resume with: agentrl train runs/stop/config.yaml resume=true  (last checkpoint: step_000002)" in err
    stopped = read_metrics(tmp_path / "runs" / "stop" / "metrics.jsonl")
    assert [r["step"] for r in stopped] == [1, 2] and stopped[-1]["alarm/no_signal"] == 1.0
    assert cli.main(["train", "runs/stop/config.yaml", "resume=true"]) == 0
    assert [r["step"] for r in read_metrics(tmp_path / "runs" / "stop" / "metrics.jsonl")] == [1, 2, 3]
