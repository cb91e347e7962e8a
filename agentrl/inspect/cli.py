"""``agentrl inspect PATH [--html OUT.html] [filters]``: the command-line entry point.

By default it shows the latest *training* step (the summary table covers the whole run);
``--step N`` / ``--step all`` pick other steps and ``--eval`` the held-out evaluation
rollouts instead (``eval_step_*.jsonl``: sampled and scored, never trained). The terminal
shows 3 trajectories spread over the reward range (highest, median, lowest, from distinct
groups); the HTML page the first 64, whole groups.

Example::

    import tempfile, pathlib
    from agentrl.types import Span, Trajectory, Verdict
    d = pathlib.Path(tempfile.mkdtemp())
    t = Trajectory([1, 2], 1, [0, 1], [0.0, -0.2], [Span(0, 1, "prompt"), Span(1, 2, "model")], [],
                   verdict=Verdict(1.0))
    (d / "step_000001.jsonl").write_text(t.to_json() + "\\n")
    assert run_inspect([str(d), "--no-color"]) == 0
    assert run_inspect([str(d), "--html", str(d / "view.html")]) == 0
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from agentrl.inspect.decode import Decoding, choose_decoding
from agentrl.inspect.filters import RewardCondition, Selection
from agentrl.inspect.scan import ScanResult, other_views_hint, scan, showing_text
from agentrl.inspect.sources import InspectError, find_sources
from agentrl.inspect.terminal import make_console, print_trajectory, safe_text, summary_table
from agentrl.types import FINISH_REASONS

TERMINAL_LIMIT = 3
HTML_LIMIT = 64
PROBLEMS_SHOWN = 20


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="agentrl inspect",
        description="Show trajectories token by token: what the policy was trained on, and why.",
    )
    p.add_argument("path", metavar="PATH", help="run directory, rollouts .jsonl file, or a folder of them")
    p.add_argument("--html", metavar="OUT", help="write a self-contained HTML page instead of printing")
    p.add_argument("--step", help="step number, 'last' (the default: the latest step) or 'all' "
                                  "(every step; also the default with --group)")
    p.add_argument("--eval", action="store_true",
                   help="the held-out evaluation rollouts (eval_step_*.jsonl, never trained) instead of training")
    p.add_argument("--group", help="group id (exact)")
    p.add_argument("--reward", help="reward condition, e.g. '>0', '==1', '<0.5'")
    p.add_argument("--finish-reason", help=f"one of {', '.join(FINISH_REASONS)}")
    p.add_argument("--tool-error", action="store_true", help="only trajectories with a failed tool call")
    p.add_argument("--index", type=int, help="the N-th (0-based) trajectory among those that match")
    p.add_argument("--limit", type=int,
                   help=f"show at most this many (default {TERMINAL_LIMIT}; {HTML_LIMIT} with --html)")
    p.add_argument("--tokenizer", metavar="DIR", help="tokenizer directory to decode token ids into text")
    p.add_argument("--no-color", action="store_true", help="plain text (also automatic when not a TTY)")
    p.add_argument("--full", action="store_true", help="do not elide long prompts in the terminal")
    return p


def selection_from_args(args: argparse.Namespace) -> Selection:
    """Validate the filter flags into a Selection (InspectError names the fix)."""
    step, last, read_all = None, False, False
    if args.step is None:
        # The default view: the latest step's trajectories, the whole run in the summary. A group
        # id names one step's group, so --group alone searches every step.
        last, read_all = args.group is None, True
    elif args.step == "last":
        last = True
    elif args.step == "all":
        pass
    elif args.step.lstrip("-").isdigit():
        step = int(args.step)
    else:
        raise InspectError(f"--step {args.step!r}: expected a step number, 'last' or 'all'")
    if args.finish_reason is not None and args.finish_reason not in FINISH_REASONS:
        raise InspectError(f"--finish-reason {args.finish_reason!r}: expected one of {', '.join(FINISH_REASONS)}")
    limit = args.limit if args.limit is not None else (HTML_LIMIT if args.html else TERMINAL_LIMIT)
    if limit < 1:
        raise InspectError(f"--limit {limit}: must be at least 1")
    return Selection(
        step=step,
        last_step=last,
        group=args.group,
        reward=RewardCondition.parse(args.reward) if args.reward is not None else None,
        finish_reason=args.finish_reason,
        tool_error=True if args.tool_error else None,
        index=args.index,
        limit=limit,
        evaluation=True if args.eval else None,
        read_all=read_all,
        pick="first" if args.html else "spread",
    )


def _report_problems(res: ScanResult) -> None:
    for p in res.problems[:PROBLEMS_SHOWN]:
        print(f"warning: {safe_text(str(p))}", file=sys.stderr)
    if res.problem_count > PROBLEMS_SHOWN:
        print(f"warning: … and {res.problem_count - PROBLEMS_SHOWN} more problems", file=sys.stderr)


def _no_match_message(res: ScanResult, sel: Selection) -> str:
    msg = "no trajectory matched the filters"
    if res.matched and sel.index is not None:
        msg += f" (--index {sel.index}: only {res.matched} match, indices 0..{res.matched - 1})"
    elif sel.group is not None and res.group_hint:
        msg += f"; group ids look like: {', '.join(repr(g) for g in res.group_hint)}"
    if sel.last_step and sel.read_all:
        msg += f" in {res.scope} (the default; --step all searches every step)"
    return msg


def _print_terminal(res: ScanResult, decoding: Decoding, no_color: bool, full: bool) -> None:
    width = None if sys.stdout.isatty() or "COLUMNS" in os.environ else 120
    console = make_console(sys.stdout, no_color=no_color, width=width)
    if res.rows:
        console.print(summary_table(res.rows))
    console.print(f"showing {showing_text(res)} · {decoding.origin}", style="dim", highlight=False, soft_wrap=True)
    if other_views_hint(res):
        console.print(other_views_hint(res), style="dim", highlight=False, soft_wrap=True)
    console.print()
    for k, rec in enumerate(res.selected, start=1):
        print_trajectory(console, rec, decoding, ordinal=f"{k}/{len(res.selected)}", full=full)


def run_inspect(argv: list[str]) -> int:
    """Entry point of ``agentrl inspect``; returns the process exit code.

    0: shown; 1: nothing to show (missing PATH, no file, no match); 2: bad flag value.
    """
    args = build_parser().parse_args(argv)
    try:
        sel = selection_from_args(args)
    except InspectError as e:
        print(f"agentrl inspect: error: {e}", file=sys.stderr)
        return 2
    try:
        sources = find_sources(args.path)
        decoding = choose_decoding(sources, args.tokenizer)
    except InspectError as e:
        print(f"agentrl inspect: error: {e}", file=sys.stderr)
        return 1
    res = scan(sources, sel)
    _report_problems(res)
    if args.html:
        from agentrl.inspect.html import write_page

        out = write_page(Path(args.html), sources, res, decoding)
        print(f"wrote {out} ({showing_text(res)}, {out.stat().st_size / 1e6:.2f} MB) · {decoding.origin}")
        return 0
    _print_terminal(res, decoding, no_color=args.no_color, full=args.full)
    if not res.selected:
        print(f"agentrl inspect: {_no_match_message(res, sel)}", file=sys.stderr)
        return 1
    return 0
