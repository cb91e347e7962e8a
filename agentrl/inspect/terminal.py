"""Terminal view with rich: summary table, then each selected trajectory span by span.

Every span gets a header line naming its kind, token range and whether it is trained
(``TRAINED n`` vs ``masked``), so the view stays exact in a pipe without color. With
color, token text is colored by kind, alternate tokens are shaded (boundaries show) and
trained tokens (loss_mask == 1) are underlined, whatever their span says: a template or
tool token that is trained stands out. Untrusted text (tool output) is printed with
control characters escaped. An evaluation attempt (``eval @ step N``) is never trained:
its header and spans say so and show no advantage or trained count.

Example::

    import io
    from rich.console import Console
    from agentrl.inspect.decode import Decoding, table_decoder
    from agentrl.inspect.loader import Record
    from agentrl.types import Span, TrainerMarks, Trajectory, Verdict
    t = Trajectory([1, 2], 1, [0, 1], [0.0, -0.5], [Span(0, 1, "prompt"), Span(1, 2, "model")], [],
                   verdict=Verdict(1.0), trained=TrainerMarks(advantage=0.5))
    out = io.StringIO()
    console = Console(file=out, width=100, color_system=None)
    print_trajectory(console, Record(t, Path("r.jsonl"), 1, 1), Decoding(table_decoder({1: "Q", 2: "A"}), "test"))
    assert "TRAINED 1" in out.getvalue() and "advantage +0.500" in out.getvalue()
"""

from __future__ import annotations

import re
from pathlib import Path  # noqa: F401 (doc example)

from rich.console import Console
from rich.table import Table
from rich.text import Text

from agentrl.inspect.decode import Decoding
from agentrl.inspect.loader import Record
from agentrl.inspect.summary import SummaryRow, failure_lines, segment_note, training_cells
from agentrl.inspect.tokens import old_logprobs_note, ratio_stats, span_facts, token_kinds
from agentrl.types import Trajectory

KIND_STYLES: dict[str, tuple[str, str]] = {  # (even token, odd token)
    "prompt": ("blue", "bright_blue"),
    "template": ("grey50", "grey70"),
    "tool": ("yellow", "bright_yellow"),
    "model": ("green", "bright_green"),
    "summary": ("cyan", "bright_cyan"),  # a frozen compaction summary: sampled, not trained
    "unknown": ("magenta", "bright_magenta"),
}
MAX_SUMMARY_ROWS = 40
PROMPT_LINES = 12  # a long system prompt is elided in the middle unless --full
IDS_PER_SPAN = 24
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def safe_text(s: str) -> str:
    r"""Escape control characters (except newline and tab) so tool output cannot drive the terminal.

    >>> safe_text("a\x1b[2Jb")
    'a\\x1b[2Jb'
    """
    return _CONTROL_RE.sub(lambda m: f"\\x{ord(m.group()):02x}", s)


def _fmt(x: float | None, spec: str = ".3f", none: str = "—") -> str:
    return none if x is None else format(x, spec)


def summary_table(rows: list[SummaryRow]) -> Table:
    """The per-step (or per-file) table; long runs keep the first 5 and last rows."""
    table = Table(title="rollouts", title_justify="left", show_edge=False, pad_edge=False)
    for name, justify in [("step/file", "left"), ("attempts", "right"), ("reward", "right"),
                          ("groups", "right"), ("zero-var", "right"), ("finish", "left"),
                          ("calls", "right"), ("call err", "right"), ("tokens", "right"),
                          ("trained", "right"), ("problems", "right")]:
        table.add_column(name, justify=justify, no_wrap=name in ("step/file", "finish"))  # type: ignore[arg-type]
    shown = rows
    if len(rows) > MAX_SUMMARY_ROWS:
        shown = rows[:5] + [None] + rows[-(MAX_SUMMARY_ROWS - 6):]  # type: ignore[operator]
    for r in shown:
        if r is None:
            table.add_row(f"… {len(rows) - MAX_SUMMARY_ROWS + 1} more", *[""] * 10)
            continue
        groups, zero_var, trained = training_cells(r)
        table.add_row(
            r.label, str(r.attempts), _fmt(r.reward_mean), groups, zero_var, r.finish_text,
            str(r.tool_calls), str(r.tool_errors), f"{r.mean_tokens:.0f}", trained,
            str(r.problems) if r.problems else "",
        )
    return table


def _header(t: Trajectory, rec: Record, ordinal: str) -> list[Text]:
    where = f"{rec.step_label} · " if rec.step_label else ""
    title = Text(f"━━ trajectory {ordinal} · {where}group {t.group_id or '—'} · sample {t.sample_index}"
                 f" · {rec.where}", style="bold")
    resp = len(t.token_ids) - t.prompt_len
    sizes = f"tokens {len(t.token_ids)} = prompt {t.prompt_len} + response {resp}"
    flagged = [Text(line, style="bold red" if line.startswith("infra") else "yellow") for line in failure_lines(t)]
    if rec.evaluation:
        facts = Text(f"reward {_fmt(t.reward, 'g')}  finish {t.finish_reason}  policy v{t.policy_version}  "
                     f"{sizes}{segment_note(t)}")
        return [title, facts, *flagged, Text("evaluation attempt: sampled and scored, never trained "
                                   "(no advantage, no trainer log-probs)", style="dim")]
    adv = _fmt(t.advantage, "+.3f")
    facts = Text(f"reward {_fmt(t.reward, 'g')}  advantage {adv}  finish {t.finish_reason}  "
                 f"policy v{t.policy_version}  {sizes} (trained {sum(t.loss_mask)}){segment_note(t)}")
    rs = ratio_stats(t)
    if rs.tokens:
        ratio = Text(f"ratio π_old/μ over {rs.tokens} trained tokens: mean {rs.mean:.4f}, "
                     f"max |log ρ| {rs.max_abs_log:.4f}, {rs.outside_clip} outside [0.8, 1.2]")
    else:
        ratio = Text(f"ratio π_old/μ: {old_logprobs_note(t) or 'trainer log-probs not recorded'}", style="dim")
    return [title, facts, *flagged, ratio]


def _span_text(t: Trajectory, texts: list[str], kinds: list[str], start: int, end: int, color: bool) -> Text:
    text = Text()
    for i in range(max(0, start), min(len(texts), end)):
        # The newline glyph keeps newline tokens (often template, masked) visible.
        piece = safe_text(texts[i]).replace("\n", "↵\n")
        if not color:
            text.append(piece)
            continue
        style = KIND_STYLES.get(kinds[i], KIND_STYLES["unknown"])[i % 2]
        if i < len(t.loss_mask) and t.loss_mask[i] == 1:
            style += " underline"
        text.append(piece, style=style)
    return text


def _elide(lines: list[Text], keep: int) -> list[Text]:
    if len(lines) <= keep:
        return lines
    head, tail = lines[: keep - 3], lines[-2:]
    return head + [Text(f"… {len(lines) - len(head) - len(tail)} lines …", style="dim")] + tail


def print_trajectory(console: Console, rec: Record, decoding: Decoding, ordinal: str = "",
                     full: bool = False) -> None:
    """Print one trajectory: header, spans with their text (or ids), tool calls."""
    t = rec.trajectory
    color = console.color_system is not None
    for line in _header(t, rec, ordinal or "1"):
        console.print(line, highlight=False)
    texts = decoding.decode(t.token_ids) if decoding.decode is not None else None
    kinds = token_kinds(t)
    for f in span_facts(t):
        label = Text(f" {f.kind:<8} {f.start:>5}–{f.end:<5} ", style=KIND_STYLES.get(f.kind, ("magenta",))[0]
                     + (" bold" if color else ""))
        if f.trained and rec.evaluation:  # loss_mask 1 marks the sampled tokens; evaluation trains none
            label.append(f"sampled {f.trained} (evaluation: not trained)  logprob mean {f.mean_logprob:.3f} "
                         f"min {f.min_logprob:.3f}")
            if f.kind != "model":
                label.append(f"  ⚠ {f.trained} token(s) with loss_mask 1 in a {f.kind} span", style="bold red")
        elif f.trained:
            label.append(f"TRAINED {f.trained}  logprob mean {f.mean_logprob:.3f} min {f.min_logprob:.3f}")
            if f.kind != "model":
                label.append(f"  ⚠ {f.trained} trained token(s) in a {f.kind} span", style="bold red")
        else:
            label.append("masked")
            if f.kind == "model":
                label.append("  ⚠ model span with no trained token", style="bold red")
        console.print(label, highlight=False)
        if texts is not None:
            lines = _span_text(t, texts, kinds, f.start, f.end, color).split("\n")
            if f.kind == "prompt" and not full:
                lines = _elide(list(lines), PROMPT_LINES)
            for line in lines:
                console.print(Text.assemble(("   │ ", "dim"), line), highlight=False, soft_wrap=False)
        else:
            ids = t.token_ids[max(0, f.start):f.end]
            more = f" … (+{len(ids) - IDS_PER_SPAN})" if len(ids) > IDS_PER_SPAN else ""
            console.print(Text(f"   │ ids: {' '.join(map(str, ids[:IDS_PER_SPAN]))}{more}"), highlight=False)
    if texts is None:
        _print_messages(console, t)
    _print_tool_calls(console, t)
    console.print()


def _print_messages(console: Console, t: Trajectory) -> None:
    console.print(Text(" conversation (message text; pass --tokenizer DIR to see token text)", style="bold"))
    for m in t.messages:
        body = safe_text(m.content)
        for c in m.tool_calls:
            body += f"\n→ call {c.name}({safe_text(str(c.arguments))})"
        console.print(Text(f"   {m.role:>9}: ", style="bold") + Text(body), highlight=False)


def _print_tool_calls(console: Console, t: Trajectory) -> None:
    if not t.tool_calls:
        return
    table = Table(title="tool calls", title_justify="left", show_edge=False, pad_edge=False)
    for name in ("turn", "tool", "arguments", "result", "error", "latency"):
        table.add_column(name, overflow="fold")
    for c in t.tool_calls:
        result = safe_text(c.result)
        if len(result) > 200:
            result = result[:200] + f"… ({len(c.result)} chars)"
        table.add_row(str(c.turn), c.name, safe_text(str(c.arguments)), result,
                      Text(safe_text(c.error), style="red") if c.error else "", f"{c.latency_s:.2f}s")
    console.print(table)


def make_console(file, no_color: bool, width: int | None = None) -> Console:
    """Color only on a TTY and without --no-color; ``width`` pins the layout (tests)."""
    return Console(file=file, color_system=None if no_color else "auto", width=width,
                   highlight=False, emoji=False)
