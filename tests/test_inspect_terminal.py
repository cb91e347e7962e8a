"""Terminal view of `agentrl inspect`: exact plain-text rendering of a known trajectory."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from agentrl.inspect.cli import run_inspect
from agentrl.inspect.decode import Decoding, table_decoder
from synthetic_trajectories import arithmetic_group, known_example
from agentrl.inspect.loader import Record
from agentrl.inspect.terminal import make_console, print_trajectory, safe_text
from agentrl.types import write_jsonl
from fixture_paths import QWEN25 as QWEN



def render(decoding: Decoding, color: bool = False, **record_kw) -> str:
    ex = known_example()
    out = io.StringIO()
    console = make_console(out, no_color=not color, width=100)
    if color:
        console = type(console)(file=out, width=100, color_system="standard", force_terminal=True)
    print_trajectory(console, Record(ex.trajectory, Path("runs/a/rollouts/step_000004.jsonl"), 9, 4), decoding,
                     ordinal="1/1", **record_kw)
    return out.getvalue()


def test_known_trajectory_plain_text_lines():
    text = render(Decoding(table_decoder(known_example().vocab), "test vocab"))
    lines = text.splitlines()
    assert lines[0] == ("━━ trajectory 1/1 · step 4 · group g-known · sample 2 · "
                        "runs/a/rollouts/step_000004.jsonl:9")
    assert lines[1] == ("reward 1  advantage +1.500  finish stop  policy v7  "
                        "tokens 15 = prompt 6 + response 9 (trained 6)")
    # ρ = exp(old - sampler): 1 for five tokens, e^0.5 for token 13 -> one outside the clip range.
    assert lines[2].startswith("ratio π_old/μ over 6 trained tokens: mean 1.1081")
    assert lines[2].endswith("1 outside [0.8, 1.2]")
    # One header per span, naming kind, range and whether it is trained.
    headers = [ln.split() for ln in lines if ln.startswith(" ") and not ln.startswith("   │")]
    span_heads = [h[:3] for h in headers if h and h[0] in ("prompt", "model", "tool", "template")]
    assert span_heads == [["prompt", "0–6", "masked"], ["model", "6–10", "TRAINED"], ["template", "10–11", "masked"],
                          ["tool", "11–12", "masked"], ["template", "12–13", "masked"], ["model", "13–15", "TRAINED"]]
    assert " model        6–10    TRAINED 4  logprob mean -0.198 min -0.510" in lines
    # Token text, with newline tokens made visible.
    assert "   │ <|im_start|>user↵" in lines
    assert "   │ <tool_call>add(2,3)</tool_call><|im_end|>" in lines
    assert "   │ <answer>5</answer><|im_end|>" in lines
    # Tool calls table: name, arguments, result, latency.
    call_row = next(ln for ln in lines if ln.startswith("0 ") and "add" in ln)
    assert "{'a': 2, 'b': 3}" in call_row and "0.12s" in call_row and " 5 " in call_row
    assert "\x1b[" not in text  # no color codes in plain mode


def test_ids_fallback_shows_ids_and_message_text():
    text = render(Decoding(None, "no tokenizer"))
    assert "   │ ids: 100 101 102 103 100 104" in text
    assert "   │ ids: 105 106 107 108" in text
    assert "conversation (message text; pass --tokenizer DIR to see token text)" in text
    assert "→ call add({'a': 2, 'b': 3})" in text


def test_color_marks_trained_tokens_and_kinds():
    text = render(Decoding(table_decoder(known_example().vocab), "t"), color=True)
    assert "\x1b[" in text
    # Underline (SGR 4) marks exactly the trained tokens, shaded alternately (32 / 92 green).
    styled = re.findall(r"\x1b\[([\d;]+)m([^\x1b]*)", text)
    underlined = [piece for codes, piece in styled if "4" in codes.split(";")]
    assert underlined == ["<tool_call>", "add(2,3)", "</tool_call>", "<|im_end|>", "<answer>5</answer>", "<|im_end|>"]
    assert ("93", "5") in styled  # the tool's "5": yellow, not underlined


def test_span_warning_when_mask_and_kind_disagree():
    ex = known_example()
    t = ex.trajectory
    t.loss_mask[10] = 1  # a template token trained: a classic off-by-one
    out = io.StringIO()
    print_trajectory(make_console(out, no_color=True, width=120), Record(t, Path("x.jsonl"), 1, None),
                     Decoding(table_decoder(ex.vocab), "t"))
    assert "⚠ 1 trained token(s) in a template span" in out.getvalue()


def test_control_characters_from_tools_are_escaped():
    assert safe_text("ok\x1b[31mred\x07") == "ok\\x1b[31mred\\x07"
    assert safe_text("a\nb\tc") == "a\nb\tc"


def test_cli_with_qwen_tokenizer_decodes_tokens(tmp_path, capsys):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(QWEN))
    group = arithmetic_group(lambda s: tok.encode(s, add_special_tokens=False))
    path = tmp_path / "step_000003.jsonl"
    write_jsonl(str(path), group)
    assert run_inspect([str(path), "--tokenizer", str(QWEN), "--index", "2", "--no-color"]) == 0
    out = capsys.readouterr().out
    assert "trajectory 1/1 · step 3 · group step3/pencils · sample 2" in out
    assert '   │ {"name": "python", "arguments": {"code": "prnt(17 * 23 + 4)"}}↵' in out
    assert "NameError" in out and "0.03s" in out
    assert "showing 1 of 4 matching trajectories from training step 3 · tokenizer" in out
    assert "\x1b[" not in out  # not a TTY: no color codes


def test_cli_finds_tokenizer_named_in_run_config(tmp_path, capsys):
    ex = known_example()
    (tmp_path / "rollouts").mkdir()
    write_jsonl(str(tmp_path / "rollouts" / "step_000001.jsonl"), [ex.trajectory])
    (tmp_path / "config.yaml").write_text(f"model:\n  path: {QWEN}\n")
    assert run_inspect([str(tmp_path), "--no-color"]) == 0
    assert f"tokenizer {QWEN}" in capsys.readouterr().out


def test_the_showing_line_is_never_wrapped(tmp_path, capsys):
    # a tokenizer path longer than the console: the line stays whole (copy-pastable), as in a
    # clone that sits deep in a temporary directory
    ex = known_example()
    (tmp_path / "rollouts").mkdir()
    write_jsonl(str(tmp_path / "rollouts" / "step_000001.jsonl"), [ex.trajectory])
    link = tmp_path / ("deep_" * 30) / "qwen"
    link.parent.mkdir()
    link.symlink_to(QWEN, target_is_directory=True)
    (tmp_path / "config.yaml").write_text(f"model:\n  path: {link}\n")
    assert run_inspect([str(tmp_path), "--no-color"]) == 0
    assert f"tokenizer {link}" in capsys.readouterr().out
