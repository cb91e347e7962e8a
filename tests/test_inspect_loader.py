"""Bad input: malformed lines, a truncated last line, missing fields -> `file:line: what`, and go on."""

from __future__ import annotations

import json
from pathlib import Path

from agentrl.inspect.cli import run_inspect
from synthetic_trajectories import known_example
from agentrl.inspect.loader import Problem, Record, iter_file
from agentrl.inspect.metrics import read_series
from agentrl.inspect.sources import RolloutFile, find_sources, step_of


def good_line(sample: int) -> str:
    t = known_example().trajectory
    t.sample_index = sample
    return t.to_json()


def without(field: str) -> str:
    d = json.loads(good_line(9))
    del d[field]
    return json.dumps(d)


def write_broken(path: Path) -> None:
    lines = [
        good_line(0),                       # 1 ok
        "{not json",                        # 2 malformed
        "",                                 # 3 blank: ignored
        without("spans"),                   # 4 missing spans: shown, spans derived from the mask
        without("token_ids"),               # 5 nothing to show
        json.dumps([1, 2]),                 # 6 not an object
        good_line(1),                       # 7 ok
    ]
    bad_mask = json.loads(good_line(2))
    bad_mask["loss_mask"][10] = 1           # 8 invariant broken: template token trained
    lines.append(json.dumps(bad_mask))
    text = "\n".join(lines) + "\n" + good_line(3)[:40]  # 9 truncated: killed mid-write
    path.write_text(text, encoding="utf-8")


def test_iter_file_reports_and_continues(tmp_path):
    path = tmp_path / "step_000005.jsonl"
    write_broken(path)
    items = list(iter_file(RolloutFile(path, 5)))
    records = [i for i in items if isinstance(i, Record)]
    problems = [(p.line, p.what, p.skipped) for p in items if isinstance(p, Problem)]
    assert [r.line for r in records] == [1, 4, 7, 8]
    assert [r.trajectory.sample_index for r in records] == [0, 9, 1, 2]
    assert problems[0][0] == 2 and problems[0][1].startswith("malformed JSON") and problems[0][2]
    assert problems[1] == (4, "missing field spans", False)
    assert problems[2] == (5, "missing field token_ids (line skipped)", True)
    assert problems[3] == (6, "expected a JSON object, got list", True)
    assert problems[4][0] == 8 and "invariant broken: loss_mask disagrees with span" in problems[4][1]
    assert problems[5] == (9, "truncated last line (no newline at end: the writer was likely killed mid-write)", True)
    derived = records[1].trajectory.spans
    assert [(s.start, s.end, s.kind) for s in derived] == [(0, 6, "prompt"), (6, 10, "model"), (10, 13, "unknown"),
                                                           (13, 15, "model")]


def test_cli_names_file_and_line_and_shows_the_rest(tmp_path, capsys):
    path = tmp_path / "step_000005.jsonl"
    write_broken(path)
    assert run_inspect([str(path), "--no-color", "--limit", "10"]) == 0
    captured = capsys.readouterr()
    assert f"warning: {path}:2: malformed JSON" in captured.err
    assert f"warning: {path}:9: truncated last line" in captured.err
    assert f"warning: {path}:5: missing field token_ids (line skipped)" in captured.err
    assert captured.out.count("━━ trajectory") == 4
    assert f"{path}:8" in captured.out
    assert "⚠ 1 trained token(s) in a template span" in captured.out
    # The summary counts the readable lines and the problems.
    row = next(ln for ln in captured.out.splitlines() if ln.startswith("step 5 "))
    assert row.split("│")[1].strip() == "4" and row.split("│")[-1].strip() == "6"


def test_html_shows_problems_and_notes(tmp_path, capsys):
    path = tmp_path / "step_000005.jsonl"
    write_broken(path)
    out = tmp_path / "v.html"
    assert run_inspect([str(path), "--html", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert "6 problem(s) while reading" in page
    assert f"{path}:9: truncated last line" in page
    assert "invariant broken: loss_mask disagrees" in page  # attached to the trajectory as a note


def test_invalid_utf8_is_a_problem_not_a_crash(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(good_line(0).encode() + b"\n" + b'{"token_ids": "\xff\xfe"}\n' + good_line(1).encode() + b"\n")
    items = list(iter_file(RolloutFile(path, None)))
    assert [type(i).__name__ for i in items] == ["Record", "Problem", "Record"]


def test_metrics_reader_tolerates_bad_lines(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1, "reward/mean": 0.1, "note": "x", "flag": true}\n'
                 'garbage\n'
                 '{"step": 2, "reward/mean": 0.3, "reward/std": 0.1, "eval/accuracy": 0.5}\n'
                 '{"step": 3, "reward/m')
    m = read_series(p)
    assert m.series["reward/mean"].steps == [1, 2] and m.series["eval/accuracy"].values == [0.5]
    assert "note" not in m.series and "flag" not in m.series
    assert [(q.line, q.what.split(" (")[0]) for q in m.problems] == [(2, "unreadable metrics line"),
                                                                     (4, "truncated last line")]


def test_sources_order_and_steps(tmp_path):
    (tmp_path / "rollouts").mkdir()
    for name in ["step_000010.jsonl", "step_000002.jsonl", "extra.jsonl"]:
        (tmp_path / "rollouts" / name).write_text("")
    (tmp_path / "config.yaml").write_text("a: 1\n")
    src = find_sources(str(tmp_path))
    assert [f.path.name for f in src.files] == ["step_000002.jsonl", "step_000010.jsonl", "extra.jsonl"]
    assert src.config is not None and src.metrics is None and src.is_run_dir
    assert step_of(Path("rollouts_step-7.jsonl")) == 7 and step_of(Path("eval.jsonl")) is None


def test_files_written_before_typed_bookkeeping_still_load(tmp_path):
    """Lines whose task id, turns, score... sit under ``metadata`` (older runs) read into the typed fields."""
    import json

    from agentrl.types import Trajectory

    ex = known_example().trajectory
    d = json.loads(ex.to_json())
    for k in ("task_id", "family", "turns", "void_turns", "score", "filtered", "staleness"):
        d.pop(k)
    d["metadata"] = {"task_id": "t7", "family": "mul", "turns": 3, "void_turns": 1, "score": {"method": "numeric"},
                     "filtered": True, "staleness": 2, "step": 4}
    t = Trajectory.from_json(json.dumps(d))
    assert (t.task_id, t.family, t.turns, t.void_turns, t.trained.filtered, t.trained.staleness) == \
        ("t7", "mul", 3, 1, True, 2)
    assert t.verdict.info == {"method": "numeric"} and t.metadata == {"step": 4}
    back = json.loads(t.to_json())
    assert back["task_id"] == "t7" and back["metadata"] == {"step": 4}  # written typed from now on
    assert Trajectory.from_json(t.to_json()) == t
