"""The self-contained HTML view: one file, inline CSS + JS + SVG, no network.

Static parts (summary table, curves, legend, problems, config) are rendered here with
escaping; token data is embedded once as compact JSON in
``<script type="application/json" id="agentrl-data">`` (every ``<`` escaped as ``\\u003c``
so text such as ``</script>`` in a tool result cannot end the block) and drawn by the
page script (page_js.py).

Example::

    import tempfile, pathlib
    from agentrl.inspect.decode import Decoding
    from agentrl.inspect.filters import Selection
    from agentrl.inspect.scan import scan
    from agentrl.inspect.sources import find_sources
    from agentrl.types import Span, Trajectory, Verdict
    d = pathlib.Path(tempfile.mkdtemp())
    t = Trajectory([7, 8], 1, [0, 1], [0.0, -0.3], [Span(0, 1, "prompt"), Span(1, 2, "model")], [],
                   verdict=Verdict(1.0))
    (d / "r.jsonl").write_text(t.to_json() + "\\n")
    src = find_sources(str(d))
    page = render_page(src, scan(src, Selection()), Decoding(None, "ids"))
    assert 'id="agentrl-data"' in page and "http" not in page.replace("http://www.w3.org", "")
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

from agentrl.inspect.decode import Decoding
from agentrl.inspect.loader import Record
from agentrl.inspect.metrics import PLOTTED, Metrics, read_series
from agentrl.inspect.page_css import CSS
from agentrl.inspect.page_js import JS
from agentrl.inspect.scan import ScanResult, other_views_hint, showing_text
from agentrl.inspect.sources import Sources
from agentrl.inspect.summary import SummaryRow, failure_lines, segment_note, training_cells
from agentrl.inspect.svg import line_chart_svg
from agentrl.inspect.tokens import old_logprobs_note, ratio_stats, tiling_segments
from agentrl.types import SPAN_KINDS

MAX_CHART_POINTS = 400
MAX_CONFIG_CHARS = 20_000


def _fit(xs: list, n: int, pad: Any) -> list:
    """Exactly n items: broken lines may carry short or long arrays; the page indexes by token."""
    return list(xs[:n]) + [pad] * max(0, n - len(xs))


def _lp(x: float) -> float | int:
    return 0 if x == 0 else round(x, 4)


def trajectory_data(rec: Record, decoding: Decoding, notes: list[str]) -> dict[str, Any]:
    """The JSON the page script reads for one trajectory (a serialization boundary)."""
    t = rec.trajectory
    n = len(t.token_ids)
    rs = ratio_stats(t)
    note = old_logprobs_note(t, rec.evaluation)
    if rec.evaluation:
        ratio = "evaluation attempt: sampled and scored, never trained"
    elif rs.tokens:
        ratio = (f"ratio π_old/μ: mean {rs.mean:.4f}, max |log ρ| {rs.max_abs_log:.4f}, "
                 f"{rs.outside_clip} of {rs.tokens} outside [0.8, 1.2]")
    else:
        ratio = f"ratio π_old/μ: {note or 'trainer log-probs not recorded'}"
    first_response = next((k for k, m in enumerate(t.messages) if m.role == "assistant"), len(t.messages))
    return {
        "where": rec.where, "step": rec.step, "label": rec.step_label, "eval": rec.evaluation,
        "old_note": note, "group": t.group_id, "sample": t.sample_index,
        "reward": t.reward, "adv": t.advantage, "finish": t.finish_reason, "policy": t.policy_version,
        "seg": segment_note(t),
        "prompt_len": t.prompt_len,
        "ids": t.token_ids,
        "text": decoding.decode(t.token_ids) if decoding.decode is not None else None,
        "mask": _fit(t.loss_mask, n, 0),
        "lp": [_lp(x) for x in _fit(t.logprobs, n, 0.0)],
        "old": None if t.old_logprobs is None else [_lp(x) for x in _fit(t.old_logprobs, n, 0.0)],
        "segs": [list(s) for s in tiling_segments(t)],
        "tools": [{"turn": c.turn, "name": c.name, "arguments": c.arguments, "result": c.result,
                   "error": c.error, "latency_s": c.latency_s} for c in t.tool_calls],
        "messages": [{"role": m.role, "content": m.content,
                      "calls": [f"{c.name}({json.dumps(c.arguments, ensure_ascii=False)})" for c in m.tool_calls]}
                     for m in t.messages],
        "first_response": first_response,
        "ratio": ratio,
        "notes": [*failure_lines(t), *notes],
    }


def groups_of(selected: list[Record]) -> list[dict[str, Any]]:
    """Selected trajectories grouped by (step, group_id), in order of first appearance."""
    groups: dict[tuple[int | None, str], list[int]] = {}
    for k, rec in enumerate(selected):
        groups.setdefault((rec.step, rec.trajectory.group_id), []).append(k)
    out = []
    labels = {(rec.step, rec.trajectory.group_id): rec.step_label for rec in selected}
    for (step, gid), members in groups.items():
        where = labels[(step, gid)]
        label = (f"{where} · " if where else "") + f"group {gid or '—'}"
        out.append({"label": label, "members": members})
    return out


def embed_json(data: Any) -> str:
    """Compact JSON safe inside a <script> element."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")


def _summary_html(rows: list[SummaryRow]) -> str:
    head = "".join(f"<th>{h}</th>" for h in ("step/file", "attempts", "reward", "groups", "zero-var", "finish",
                                              "tool calls", "tool err", "tokens", "trained", "problems"))
    body = []
    for r in rows:
        reward = "—" if r.reward_mean is None else f"{r.reward_mean:.3f}"
        groups, zero_var, trained = training_cells(r)
        cells = [escape(r.label), r.attempts, reward, groups, zero_var, escape(r.finish_text), r.tool_calls,
                 r.tool_errors, f"{r.mean_tokens:.0f}", trained, r.problems or ""]
        row_class = ' class="eval"' if r.evaluation else ""
        body.append(f"<tr{row_class}>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return f'<table class="summary"><tr>{head}</tr>{"".join(body)}</table>'


def _charts_html(metrics: Metrics) -> str:
    thin = Metrics({k: s.thinned(MAX_CHART_POINTS) for k, s in metrics.series.items()}, metrics.problems)
    charts = [line_chart_svg(name, thin.series[name].steps, thin.series[name].values, band=thin.band(name))
              for name in PLOTTED if name in thin.series and thin.series[name].steps]
    return f'<div class="charts">{"".join(charts)}</div>' if charts else '<p class="sub">no metrics logged yet</p>'


def _legend_html() -> str:
    kinds = "".join(f'<span class="sw k-{k}">{k}</span>' for k in SPAN_KINDS)
    return (f'<div id="legend"><b>legend</b> {kinds}'
            '<span class="sw k-model m1">trained (loss_mask 1)</span>'
            '<span class="sw k-template m0">masked (loss_mask 0)</span>'
            '<span class="sw k-unknown">no span</span>'
            '<label>color <select id="mode"><option value="kind">span kind</option>'
            '<option value="lp">sampler log-prob</option><option value="ratio">ratio π_old/μ</option>'
            '</select></label><span id="modehelp" class="modehelp"></span></div>')


def _problems_html(res: ScanResult, metrics: Metrics | None) -> str:
    problems = res.problems + (metrics.problems if metrics else [])
    if not problems:
        return ""
    total = res.problem_count + (len(metrics.problems) if metrics else 0)
    items = "".join(f"<li>{escape(str(p))}</li>" for p in problems)
    more = f"<p>… {total - len(problems)} more</p>" if total > len(problems) else ""
    return f'<section><div class="problems"><b>{total} problem(s) while reading</b><ul>{items}</ul>{more}</div></section>'


def _scope_hint_html(res: ScanResult) -> str:
    hint = other_views_hint(res)
    return f'<div class="sub" id="scopehint">other views (run agentrl inspect with): {escape(hint)}</div>' if hint else ""


def render_page(sources: Sources, res: ScanResult, decoding: Decoding, title: str = "agentrl inspect") -> str:
    """The whole page as a string."""
    metrics = read_series(sources.metrics) if sources.metrics else None
    notes: dict[tuple[str, int], list[str]] = {}
    for p in res.problems:
        if not p.skipped:
            notes.setdefault((str(p.path), p.line), []).append(p.what)
    data = {
        "trajs": [trajectory_data(r, decoding, notes.get((str(r.path), r.line), [])) for r in res.selected],
        "groups": groups_of(res.selected),
    }
    curves = f"<section><h2>curves</h2>{_charts_html(metrics)}</section>" if metrics else ""
    config = ""
    if sources.config is not None:
        text = sources.config.read_text(encoding="utf-8", errors="replace")[:MAX_CONFIG_CHARS]
        config = f'<section><details><summary>config.yaml</summary><pre class="config">{escape(text)}</pre></details></section>'
    src = sources.files[0].path if len(sources.files) == 1 and not sources.is_run_dir else sources.root
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>{escape(title)} · {escape(str(src))}</title>
<style>{CSS}</style></head>
<body>
<header><h1>{escape(title)}</h1>
<div class="sub">{escape(str(src))} · {escape(showing_text(res))} shown · {escape(decoding.origin)}</div>
{_scope_hint_html(res)}
</header>
<section><h2>rollouts</h2>{_summary_html(res.rows)}</section>
{curves}{_problems_html(res, metrics)}{config}
<section><h2>groups</h2><div id="groups"></div></section>
<section id="viewer"><h2>trajectory</h2>
<div class="toolbar"><button id="prev" type="button">◀ prev</button><button id="next" type="button">next ▶</button>{_legend_html()}</div>
<div id="trajhead"></div>
<div class="viewer-main"><div id="tokens"></div><aside id="details"></aside></div>
<h2>tool calls</h2><div id="tools"></div>
<details id="messages"></details>
</section>
<script type="application/json" id="agentrl-data">{embed_json(data)}</script>
<script>{JS}</script>
</body></html>
"""


def write_page(out: Path, sources: Sources, res: ScanResult, decoding: Decoding) -> Path:
    """Write the page to ``out`` (parent folders created); returns the path."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_page(sources, res, decoding), encoding="utf-8")
    return out
