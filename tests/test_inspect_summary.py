"""Summary table values and filters of `agentrl inspect` on a small two-step run directory."""

from __future__ import annotations

import re

import pytest

from agentrl.inspect.cli import run_inspect
from synthetic_trajectories import known_example
from agentrl.inspect.filters import RewardCondition, Selection
from agentrl.inspect.scan import scan
from agentrl.inspect.sources import InspectError, find_sources
from agentrl.types import ToolCallRecord, Trajectory, Verdict, write_jsonl


def attempt(group: str, sample: int, reward: float, finish: str = "stop", tool_error: bool = False) -> Trajectory:
    t = Trajectory.from_json(known_example().trajectory.to_json())
    t.group_id, t.sample_index, t.verdict, t.finish_reason = group, sample, Verdict(reward), finish
    if tool_error:
        t.tool_calls.append(ToolCallRecord("add", {"a": "x"}, "TypeError: bad operand", "TypeError", 0.01, 1))
    return t


@pytest.fixture
def run_dir(tmp_path):
    """step 1: group a = 1,0,1,0 (one tool error, one truncated); group b = 1,1 (zero variance).
    step 2: group c = 0,0,0 (zero variance)."""
    (tmp_path / "rollouts").mkdir()
    step1 = [attempt("a", 0, 1.0), attempt("a", 1, 0.0, tool_error=True), attempt("a", 2, 1.0),
             attempt("a", 3, 0.0, finish="length"), attempt("b", 0, 1.0), attempt("b", 1, 1.0)]
    step2 = [attempt("c", i, 0.0) for i in range(3)]
    write_jsonl(str(tmp_path / "rollouts" / "step_000001.jsonl"), step1)
    write_jsonl(str(tmp_path / "rollouts" / "step_000002.jsonl"), step2)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.66}\n')
    return tmp_path


def test_summary_rows(run_dir):
    res = scan(find_sources(str(run_dir)), Selection(limit=1))
    r1, r2 = res.rows
    assert (r1.label, r1.attempts, r1.groups, r1.zero_variance_groups) == ("step 1", 6, 2, 1)
    assert r1.reward_mean == pytest.approx(4 / 6)
    assert r1.finish_reasons == {"stop": 5, "length": 1}
    assert (r1.tool_calls, r1.tool_errors) == (7, 1)  # one call each + the failed extra one
    assert r1.mean_tokens == 15 and r1.model_token_frac == pytest.approx(6 / 15)
    assert (r2.label, r2.attempts, r2.groups, r2.zero_variance_groups, r2.reward_mean) == ("step 2", 3, 1, 1, 0.0)
    assert res.matched == 9 and len(res.selected) == 1  # counted everything, kept one


def test_summary_table_in_terminal(run_dir, capsys):
    assert run_inspect([str(run_dir), "--no-color"]) == 0
    out = capsys.readouterr().out
    row1 = next(ln for ln in out.splitlines() if ln.startswith("step 1 "))
    cells = [c.strip() for c in re.split(r"[│┃]", row1)]
    assert cells == ["step 1", "6", "0.667", "2", "1/2", "stop 5, length 1", "7", "1", "15", "40%", ""]
    # The summary covers the run; the trajectories shown are the latest step's.
    assert "showing 3 of 3 matching trajectories from training step 2" in " ".join(out.split())


def shown(run_dir, capsys, *flags: str) -> list[tuple[str, str, str]]:
    """(step, group, sample) of every trajectory the terminal view shows."""
    code = run_inspect([str(run_dir), "--no-color", "--limit", "50", *flags])
    out = capsys.readouterr().out
    found = re.findall(r"━━ trajectory \d+/\d+ · step (\d+) · group (\S+) · sample (\d+)", out)
    assert code == (0 if found else 1)
    return found


def test_filters(run_dir, capsys):
    step2 = [("2", "c", "0"), ("2", "c", "1"), ("2", "c", "2")]
    assert shown(run_dir, capsys) == step2  # the default: the latest step
    assert shown(run_dir, capsys, "--step", "last") == step2
    assert shown(run_dir, capsys, "--step", "2") == step2
    assert len(shown(run_dir, capsys, "--step", "all")) == 9
    assert shown(run_dir, capsys, "--group", "b") == [("1", "b", "0"), ("1", "b", "1")]  # a group: every step
    assert shown(run_dir, capsys, "--reward", ">0") == []  # step 2 has none
    assert len(shown(run_dir, capsys, "--reward", ">0", "--step", "all")) == 4
    assert len(shown(run_dir, capsys, "--reward", "==0")) == 3
    assert len(shown(run_dir, capsys, "--reward", "==0", "--step", "all")) == 5
    assert len(shown(run_dir, capsys, "--reward", "<0.5", "--step", "1")) == 2
    assert shown(run_dir, capsys, "--finish-reason", "length", "--step", "all") == [("1", "a", "3")]
    assert shown(run_dir, capsys, "--tool-error", "--step", "all") == [("1", "a", "1")]
    assert shown(run_dir, capsys, "--index", "4", "--step", "all") == [("1", "b", "0")]
    assert shown(run_dir, capsys, "--index", "1") == [("2", "c", "1")]
    assert shown(run_dir, capsys, "--group", "a", "--reward", "==0", "--index", "1") == [("1", "a", "3")]
    assert len(shown(run_dir, capsys, "--limit", "2")) == 2


def test_no_match_explains(run_dir, capsys):
    assert run_inspect([str(run_dir), "--group", "zzz"]) == 1
    err = capsys.readouterr().err
    assert "no trajectory matched the filters; group ids look like: 'a', 'b', 'c'" in err
    assert run_inspect([str(run_dir), "--index", "99"]) == 1
    err = capsys.readouterr().err
    assert "only 3 match, indices 0..2" in err and "in training step 2 (the default; --step all" in err
    assert run_inspect([str(run_dir), "--index", "99", "--step", "all"]) == 1
    assert "only 9 match, indices 0..8" in capsys.readouterr().err


@pytest.mark.parametrize("text,op,value", [(">0", ">", 0.0), ("==1", "==", 1.0), ("<0.5", "<", 0.5),
                                           (">= -1e-3", ">=", -0.001), ("1", "==", 1.0), ("!=.5", "!=", 0.5)])
def test_reward_condition_parse(text, op, value):
    assert RewardCondition.parse(text) == RewardCondition(op, value)


def test_reward_condition_semantics():
    assert RewardCondition.parse("==1").holds(1.0) and not RewardCondition.parse("==1").holds(0.999)
    assert RewardCondition.parse("<0.5").holds(0.0) and not RewardCondition.parse("<0.5").holds(0.5)
    assert not RewardCondition.parse(">0").holds(None)  # unscored attempts never match


@pytest.mark.parametrize("flags,message", [
    (["--reward", "big"], "--reward 'big': expected an operator and a number"),
    (["--step", "x"], "--step 'x': expected a step number, 'last' or 'all'"),
    (["--finish-reason", "done"], "--finish-reason 'done': expected one of stop, length, max_turns, error"),
])
def test_bad_flag_values_name_the_fix(run_dir, capsys, flags, message):
    assert run_inspect([str(run_dir), *flags]) == 2
    assert message in capsys.readouterr().err


def test_missing_path_and_empty_folder(tmp_path, capsys):
    assert run_inspect([str(tmp_path / "nope")]) == 1
    assert "no such file or directory" in capsys.readouterr().err
    with pytest.raises(InspectError, match="no rollout files found"):
        find_sources(str(tmp_path))
