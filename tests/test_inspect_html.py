"""HTML view structure: embedded token data, legend, groups, curves, self-containment, escaping."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agentrl.inspect.cli import run_inspect
from agentrl.inspect.decode import Decoding, table_decoder
from synthetic_trajectories import known_example
from agentrl.inspect.filters import Selection
from agentrl.inspect.html import render_page
from agentrl.inspect.scan import scan
from agentrl.inspect.sources import find_sources
from agentrl.inspect.svg import line_chart_svg
from agentrl.types import SPAN_KINDS, Trajectory, Verdict, write_jsonl
from fixture_paths import QWEN25 as QWEN

DATA_RE = re.compile(r'<script type="application/json" id="agentrl-data">(.*?)</script>', re.DOTALL)


def page_data(page: str) -> dict:
    m = DATA_RE.search(page)
    assert m, "embedded data block missing"
    return json.loads(m.group(1))


def copy(t: Trajectory, reward: float, advantage: float, **changes) -> Trajectory:
    c = Trajectory.from_json(t.to_json())
    c.verdict, c.trained.advantage = Verdict(reward), advantage
    for k, v in changes.items():
        setattr(c, k, v)
    return c


@pytest.fixture
def run_dir(tmp_path):
    t = known_example().trajectory
    (tmp_path / "rollouts").mkdir()
    group = [copy(t, sample_index=i, reward=r, advantage=a) for i, (r, a) in enumerate([(1.0, 1.0), (0.0, -1.0)])]
    write_jsonl(str(tmp_path / "rollouts" / "step_000001.jsonl"), group)
    rows = [{"step": s, "reward/mean": 0.1 * s, "reward/std": 0.05, "loss": 0.5 / s} for s in range(1, 6)]
    rows[-1]["eval/accuracy"] = 0.4
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "config.yaml").write_text("model:\n  path: <none>\nlr: 1e-6\n")
    return tmp_path


def test_embedded_token_data_matches_the_trajectory(run_dir):
    ex = known_example()
    src = find_sources(str(run_dir))
    page = render_page(src, scan(src, Selection(limit=10)), Decoding(table_decoder(ex.vocab), "test vocab"))
    data = page_data(page)
    t0 = data["trajs"][0]
    t = ex.trajectory
    assert t0["ids"] == t.token_ids and t0["mask"] == t.loss_mask
    assert t0["lp"] == pytest.approx(t.logprobs) and t0["old"] == pytest.approx(t.old_logprobs)
    assert t0["text"] == [ex.vocab[i] for i in t.token_ids]
    assert t0["segs"] == [[0, 6, "prompt"], [6, 10, "model"], [10, 11, "template"], [11, 12, "tool"],
                          [12, 13, "template"], [13, 15, "model"]]
    assert (t0["reward"], t0["adv"], t0["step"], t0["group"], t0["sample"]) == (1.0, 1.0, 1, "g-known", 0)
    assert t0["tools"] == [{"turn": 0, "name": "add", "arguments": {"a": 2, "b": 3}, "result": "5", "error": None,
                            "latency_s": 0.125}]
    assert "1 of 6 outside [0.8, 1.2]" in t0["ratio"]
    assert data["groups"] == [{"label": "step 1 · group g-known", "members": [0, 1]}]


def test_page_parts_legend_summary_curves_config(run_dir):
    out = run_dir / "view.html"
    assert run_inspect([str(run_dir), "--html", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert page_data(page)["trajs"][0]["text"] is None  # no tokenizer: ids only
    legend = re.search(r'<div id="legend">(.*?)</div>', page, re.DOTALL).group(1)
    for kind in SPAN_KINDS:
        assert f'<span class="sw k-{kind}">{kind}</span>' in legend
    assert "trained (loss_mask 1)" in legend and "masked (loss_mask 0)" in legend
    assert "<td>step 1</td><td>2</td><td>0.500</td><td>1</td><td>0/1</td><td>stop 2</td>" in page
    charts = re.findall(r'<svg class="chart".*?aria-label="([^"]+)"', page)
    assert charts == ["reward/mean", "eval/accuracy", "loss"]
    assert "<polygon" in page  # the reward ± std band
    assert "&lt;none&gt;" in page  # config.yaml shown, escaped
    for needed in ('id="groups"', 'id="tokens"', 'id="details"', 'id="tools"', 'id="messages"'):
        assert needed in page


def test_page_is_self_contained(run_dir):
    out = run_dir / "view.html"
    assert run_inspect([str(run_dir), "--html", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    refs = re.findall(r'(?:src|href)\s*=\s*"([^"]*)"', page)
    assert refs == ["data:,"]  # the empty favicon only: no file, CDN or network reference
    assert "<link rel=\"stylesheet\"" not in page and "@import" not in page
    assert set(re.findall(r"https?://[^\s\"']+", page)) == {"http://www.w3.org/2000/svg"}  # SVG namespace only


def test_untrusted_tool_text_cannot_break_out_of_the_page(tmp_path):
    evil = "</script><script>alert(1)</script><!-- <b>"
    t = known_example().trajectory
    t.tool_calls[0].result = evil
    t.messages[2].content = evil
    path = tmp_path / "r.jsonl"
    write_jsonl(str(path), [t])
    out = tmp_path / "v.html"
    assert run_inspect([str(path), "--html", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert page.count("</script>") == 2  # the data block and the page script, nothing injected
    assert page_data(page)["trajs"][0]["tools"][0]["result"] == evil  # round-trips exactly
    assert "innerHTML" not in page  # the script writes text with textContent only


def test_qwen_tokenizer_text_is_embedded(tmp_path):
    from transformers import AutoTokenizer

    from synthetic_trajectories import arithmetic_group

    tok = AutoTokenizer.from_pretrained(str(QWEN))
    group = arithmetic_group(lambda s: tok.encode(s, add_special_tokens=False))
    write_jsonl(str(tmp_path / "step_000003.jsonl"), group)
    out = tmp_path / "v.html"
    assert run_inspect([str(tmp_path), "--html", str(out), "--tokenizer", str(QWEN)]) == 0
    data = page_data(out.read_text(encoding="utf-8"))
    assert len(data["trajs"]) == 4 and [g["members"] for g in data["groups"]] == [[0, 1, 2, 3]]
    t2 = data["trajs"][2]
    assert "".join(t2["text"]) == tok.decode(group[2].token_ids, skip_special_tokens=False)
    assert t2["text"][0] == "<|im_start|>" and len(t2["text"]) == len(t2["ids"])


def test_line_chart_scales_points_into_the_box():
    svg = line_chart_svg("m", [0, 10], [0.0, 1.0], width=300, height=150)
    pts = re.search(r'<polyline points="([^"]+)"', svg).group(1).split()
    (x0, y0), (x1, y1) = [tuple(map(float, p.split(","))) for p in pts]
    assert x0 < x1 and y0 > y1  # later step to the right, higher value up
    assert 0 <= x0 and x1 <= 300 and 0 <= y1 and y0 <= 150
    flat = line_chart_svg("flat", [3], [0.5])  # one point, zero range: still drawable
    assert "NaN" not in flat and "<circle" in flat
