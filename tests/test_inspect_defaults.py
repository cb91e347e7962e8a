"""What `agentrl inspect RUN_DIR` shows by default, on a run directory laid out as the trainer writes it.

rollouts/ holds training steps (``step_*.jsonl``) and held-out evaluations
(``eval_step_*.jsonl``: sampled and scored, never trained). By default the viewer shows the
latest *training* step, three distinct attempts in the terminal; evaluation only with
``--eval``, labelled ``eval @ step N`` and without training statistics; an attempt the update
skipped (advantage 0) says so in the trainer's terms; chart tick labels fit their margin.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agentrl.inspect.cli import run_inspect
from agentrl.inspect.filters import Selection
from agentrl.inspect.scan import MatchKey, scan, spread_picks
from agentrl.inspect.sources import find_sources
from agentrl.inspect.svg import TICK_CHAR_PX, line_chart_svg, tick_label
from agentrl.inspect.tokens import ZERO_ADVANTAGE_NOTE, old_logprobs_note
from agentrl.types import TrainerMarks, Trajectory, Verdict, write_jsonl
from synthetic_trajectories import known_example

DATA_RE = re.compile(r'<script type="application/json" id="agentrl-data">(.*?)</script>', re.DOTALL)
HEADER_RE = re.compile(r"━━ trajectory \d+/\d+ · (.+?) · group (\S+) · sample (\d+)")
GROUP_TOKEN = 102  # the question's token in known_example: changed per group, so groups differ


def attempt(group: str, sample: int, reward: float, advantage: float | None, scored: bool,
            question: int) -> Trajectory:
    t = Trajectory.from_json(known_example().trajectory.to_json())
    t.group_id, t.sample_index, t.verdict = group, sample, Verdict(reward)
    t.token_ids = [question if x == GROUP_TOKEN else x for x in t.token_ids]
    t.trained = TrainerMarks(advantage=advantage, old_logprobs=list(t.old_logprobs) if scored else None)
    return t


def training_step(step: int) -> list[Trajectory]:
    """g0: four identical successes (zero variance: advantage 0, skipped by the update, so no
    π_old); g1: one success of four; g2: three of four. The file starts with g0."""
    out = [attempt(f"s{step}/g0", i, 1.0, 0.0, False, 1000 + 10 * step) for i in range(4)]
    out += [attempt(f"s{step}/g1", i, r, a, True, 1001 + 10 * step)
            for i, (r, a) in enumerate([(1.0, 1.732), (0.0, -0.577), (0.0, -0.577), (0.0, -0.577)])]
    out += [attempt(f"s{step}/g2", i, r, a, True, 1002 + 10 * step)
            for i, (r, a) in enumerate([(1.0, 0.577), (1.0, 0.577), (1.0, 0.577), (0.0, -1.732)])]
    return out


def evaluation(reward: float) -> list[Trajectory]:
    """One greedy attempt per held-out task, as agentrl.run.evaluate writes them: no advantage."""
    return [attempt(f"eval/test-{i}", 0, reward, None, False, 2000 + i) for i in range(5)]


@pytest.fixture
def run_dir(tmp_path):
    r = tmp_path / "rollouts"
    r.mkdir()
    write_jsonl(str(r / "eval_step_000000.jsonl"), evaluation(0.0))  # eval.at_start
    write_jsonl(str(r / "step_000001.jsonl"), training_step(1))
    write_jsonl(str(r / "step_000002.jsonl"), training_step(2))
    write_jsonl(str(r / "eval_step_000002.jsonl"), evaluation(1.0))
    rows = [{"step": 0, "eval/accuracy": 0.0}, {"step": 1, "reward/mean": 0.5, "loss": 2.56e-08},
            {"step": 2, "reward/mean": 0.6, "loss": -5.96e-08, "eval/accuracy": 1.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    return tmp_path


def terminal(capsys, *argv: str) -> tuple[int, str]:
    code = run_inspect([*argv, "--no-color"])
    return code, capsys.readouterr().out


def page_data(path: Path) -> dict:
    return json.loads(DATA_RE.search(path.read_text(encoding="utf-8")).group(1))


# -- 6a: the default is the latest training step ---------------------------------------------

def test_default_terminal_shows_the_latest_training_step(run_dir, capsys):
    code, out = terminal(capsys, str(run_dir))
    assert code == 0
    shown = HEADER_RE.findall(out)
    assert len(shown) == 3 and {where for where, _, _ in shown} == {"step 2"}
    assert all(g.startswith("s2/") for _, g, _ in shown)
    flat = " ".join(out.split())
    assert "showing 3 of 12 matching trajectories from training step 2" in flat
    assert "--eval: the evaluation rollouts (never trained)" in flat


def test_default_html_shows_the_latest_training_step(run_dir, capsys):
    page = run_dir / "view.html"
    assert run_inspect([str(run_dir), "--html", str(page)]) == 0
    assert "12 of 12 matching trajectories from training step 2" in capsys.readouterr().out
    data = page_data(page)
    assert len(data["trajs"]) == 12
    assert {(t["step"], t["eval"], t["label"]) for t in data["trajs"]} == {(2, False, "step 2")}
    assert [g["label"] for g in data["groups"]] == ["step 2 · group s2/g0", "step 2 · group s2/g1",
                                                    "step 2 · group s2/g2"]
    assert "--eval: the evaluation rollouts" in page.read_text(encoding="utf-8")


def test_existing_step_flags_pick_training_files(run_dir, capsys):
    for flags, where in [(["--step", "last"], {"step 2"}), (["--step", "1"], {"step 1"}),
                         (["--step", "all", "--limit", "100"], {"step 1", "step 2"})]:
        code, out = terminal(capsys, str(run_dir), *flags)
        assert code == 0 and {w for w, _, _ in HEADER_RE.findall(out)} == where, flags
    # An eval-only step is no training step.
    code, _ = terminal(capsys, str(run_dir), "--step", "0")
    assert code == 1


# -- 6b: evaluation when asked, labelled, without training statistics ------------------------

def test_eval_flag_shows_evaluation_labelled_as_such(run_dir, capsys):
    code, out = terminal(capsys, str(run_dir), "--eval")
    assert code == 0
    shown = HEADER_RE.findall(out)
    assert len(shown) == 3 and {w for w, _, _ in shown} == {"eval @ step 2"}
    body = out[out.index("━━ trajectory"):]
    assert re.search(r"advantage [-+—\d]", body) is None  # no advantage value
    for training_only in ("TRAINED", "(trained", "ratio π_old/μ"):
        assert training_only not in body, training_only
    assert "evaluation attempt: sampled and scored, never trained" in body
    assert "sampled 4 (evaluation: not trained)" in body
    assert "showing 3 of 5 matching trajectories from eval @ step 2" in " ".join(out.split())
    code, out = terminal(capsys, str(run_dir), "--eval", "--step", "0", "--limit", "10")
    assert code == 0 and {w for w, _, _ in HEADER_RE.findall(out)} == {"eval @ step 0"}
    # A single evaluation file is shown as evaluation without the flag.
    code, out = terminal(capsys, str(run_dir / "rollouts" / "eval_step_000000.jsonl"))
    assert code == 0 and {w for w, _, _ in HEADER_RE.findall(out)} == {"eval @ step 0"}


def test_eval_rows_carry_no_training_statistics(run_dir, capsys):
    res = scan(find_sources(str(run_dir)), Selection(read_all=True, last_step=True))
    assert [(r.label, r.evaluation) for r in res.rows] == [
        ("eval @ step 0", True), ("step 1", False), ("step 2", False), ("eval @ step 2", True)]
    code, out = terminal(capsys, str(run_dir))
    rows = {cells[0]: cells for cells in ([c.strip() for c in re.split(r"[│┃]", ln)] for ln in out.splitlines()
                                          if "│" in ln and not ln.startswith(" "))}
    # label, attempts, reward, groups, zero-var, finish, calls, call err, tokens, trained, problems
    assert rows["eval @ step 0"] == ["eval @ step 0", "5", "0.000", "—", "—", "stop 5", "5", "0", "15", "—", ""]
    assert rows["step 2"][3:5] == ["3", "1/3"] and rows["step 2"][9] == "40%"
    page = run_dir / "eval.html"
    assert run_inspect([str(run_dir), "--html", str(page), "--eval"]) == 0
    html = page.read_text(encoding="utf-8")
    assert ('<tr class="eval"><td>eval @ step 0</td><td>5</td><td>0.000</td><td>—</td><td>—</td>'
            '<td>stop 5</td><td>5</td><td>0</td><td>15</td><td>—</td>') in html
    data = page_data(page)
    assert {(t["eval"], t["label"], t["adv"]) for t in data["trajs"]} == {(True, "eval @ step 2", None)}
    assert all("trained" not in t["ratio"].replace("never trained", "") for t in data["trajs"])
    assert data["groups"][0]["label"] == "eval @ step 2 · group eval/test-0"


# -- 6c: the wording of an attempt the update skipped -----------------------------------------

def test_zero_advantage_attempt_says_why_it_has_no_trainer_logprobs(run_dir, capsys):
    code, out = terminal(capsys, str(run_dir), "--group", "s2/g0", "--index", "0")
    assert code == 0
    assert ("ratio π_old/μ: not scored: advantage 0, skipped by the update (train.skip_zero_advantage)"
            in out.splitlines())
    assert "not recorded" not in out
    page = run_dir / "v.html"
    assert run_inspect([str(run_dir), "--html", str(page)]) == 0
    zero = [t for t in page_data(page)["trajs"] if t["group"] == "s2/g0"]
    assert zero and all(t["old_note"] == ZERO_ADVANTAGE_NOTE and ZERO_ADVANTAGE_NOTE in t["ratio"] for t in zero)


def test_old_logprobs_note_names_each_reason():
    t = attempt("g", 0, 1.0, 0.0, False, 5)
    assert old_logprobs_note(t) == ZERO_ADVANTAGE_NOTE
    assert "train.skip_zero_advantage" in ZERO_ADVANTAGE_NOTE and "not scored: advantage 0" in ZERO_ADVANTAGE_NOTE
    assert old_logprobs_note(attempt("g", 0, 1.0, 0.5, True, 5)) is None
    assert old_logprobs_note(t, evaluation=True) == "evaluation: never trained"
    t.trained.filtered = True
    assert "filter" in old_logprobs_note(t)
    assert old_logprobs_note(attempt("g", 0, 1.0, None, False, 5)) == "trainer log-probs not recorded"


# -- 6d: chart tick labels fit their margin ---------------------------------------------------

@pytest.mark.parametrize("values", [
    [2.56e-08, -2.98e-08, -5.96e-08],  # the reported loss: '.73e-08' was cut
    [0.0, 1.0], [-0.195, 1.21], [-0.0123, 0.0456], [1234567.0, 2345678.0], [1e-30, 3e-30], [999.96, 1000.4],
])
def test_tick_labels_are_short_and_fit_the_left_margin(values):
    svg = line_chart_svg("loss", list(range(len(values))), values)
    ticks = re.findall(r'<text x="([\d.]+)" y="[\d.]+" class="yl">([^<]+)</text>', svg)
    assert len(ticks) == 2
    for x, label in ticks:
        assert len(label) <= 7 and "e-0" not in label and "e+" not in label, label
        # The label is anchored at its right end, x; its left end must stay inside the chart.
        assert len(label) * TICK_CHAR_PX <= float(x), (label, x)
    axis_x = float(re.search(r'<line x1="([\d.]+)" y1="[\d.]+" x2="\1"', svg).group(1))
    assert all(float(x) < axis_x for x, _ in ticks)


def test_tick_label_values():
    assert tick_label(2.73e-08) == "27.3n" and tick_label(-5.96e-08) == "-59.6n"
    assert tick_label(0.5) == "0.5" and tick_label(0) == "0" and tick_label(999.96) == "1k"


# -- 6e: distinct default trajectories ---------------------------------------------------------

def test_default_terminal_trajectories_are_distinct_and_spread(run_dir, capsys):
    code, out = terminal(capsys, str(run_dir))
    shown = HEADER_RE.findall(out)
    groups = [g for _, g, _ in shown]
    assert len(set(groups)) == 3  # the file starts with four identical attempts: not shown thrice
    blocks = out.split("━━ trajectory")[1:]
    assert len(set(b.split("\n", 1)[1] for b in blocks)) == 3  # bodies differ, not only headers
    rewards = [float(m) for m in re.findall(r"^reward (\S+)  advantage", out, re.MULTILINE)]
    advs = [m for m in re.findall(r"advantage (\S+)  finish", out)]
    assert rewards[0] == 1.0 and rewards[-1] == 0.0  # highest first, lowest last
    assert advs[0] == "+1.732" and advs[-1] == "-1.732"
    assert "(the highest, median and lowest reward, from distinct groups)" in " ".join(out.split())
    # --index and a limit that fits every match keep file order.
    code, out = terminal(capsys, str(run_dir), "--limit", "12")
    assert [int(s) for _, _, s in HEADER_RE.findall(out)][:5] == [0, 1, 2, 3, 0]


def test_spread_picks_prefers_distinct_groups_and_tokens():
    keys = [MatchKey(i, Path("f"), i + 1, r, a, g, d) for i, (r, a, g, d) in enumerate([
        (1.0, 0.0, "a", 1), (1.0, 0.0, "a", 1), (1.0, 0.0, "a", 1),
        (1.0, 1.7, "b", 2), (0.0, -0.6, "b", 3), (0.0, -1.7, "c", 4)])]
    picks = spread_picks(keys, 3)
    assert [(p.group, p.advantage) for p in picks] == [("b", 1.7), ("a", 0.0), ("c", -1.7)]
    same = [MatchKey(i, Path("f"), i + 1, 0.0, 0.0, "a", 7) for i in range(5)]
    assert len(spread_picks(same, 3)) == 3  # nothing distinct to find: still three
    assert spread_picks(keys, 10) == keys
