"""Regenerate docs/templates.md: every chat template TRL ships, checked by agentrl.

    .venv/bin/python examples/make_template_table.py [--templates DIR] [--out docs/templates.md]

Reads the templates from the installed ``trl`` package (``pip install -e .[dev]``), renders
each with the Qwen2.5 fixture tokenizer (only text is compared; it supplies eos/pad strings),
and writes one table row per template, plus the before/after counts of the tool-call format
registry (the "before" column replays the substring detection agentrl used until issue 21).
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentrl.chat import template_renderer  # noqa: E402
from agentrl.chat.formats import FORMATS  # noqa: E402
from agentrl.chat.formats.roundtrip import round_trip_all  # noqa: E402
from agentrl.chat.check import CorpusRow, check_corpus  # noqa: E402

FAMILIES = [("qwen3_5", "Qwen3.5"), ("qwen3_6", "Qwen3.6"), ("qwen3_8", "Qwen3.8"), ("qwen3_instruct", "Qwen3-2507"),
            ("qwen3_vl", "Qwen3-VL"), ("qwen3", "Qwen3"), ("qwen2_5_vl", "Qwen2.5-VL"), ("qwen2_5", "Qwen2.5"),
            ("llama3", "Llama 3"), ("gptoss", "gpt-oss"), ("diffusion_gemma", "DiffusionGemma"),
            ("gemma4", "Gemma 4"), ("gemma3", "Gemma 3"), ("gemma", "Gemma"), ("glm4", "GLM-4-MoE"),
            ("deepseekv3", "DeepSeek-V3"), ("deepseek_r1", "DeepSeek-R1-Distill"), ("nemotron", "Nemotron 3"),
            ("lfm2", "LFM2"), ("phi3", "Phi-3"), ("cohere", "Cohere"), ("muse", "Muse Glimmer"),
            ("idefics", "Idefics3"), ("llava", "LLaVA-NeXT"), ("smolvlm", "SmolVLM")]


def family(name: str) -> str:
    return next((label for prefix, label in FAMILIES if name.startswith(prefix)), name)


def legacy_format(source: str) -> str | None:
    """agentrl's detection before the registry: substring tests on the template source."""
    if "<tool_call>" in source:
        return "hermes"
    if "<|python_tag|>" in source or "ipython" in source or '"parameters"' in source:
        return "llama3_json"
    return None


def prefix_column(row: CorpusRow, passed: dict[str, bool]) -> str:
    if row.check.passed and "as JSON strings" in row.check.notes:
        return "yes, with JSON-string arguments (ChatTemplate passes objects: use the _training variant)"
    if row.check.passed:
        return "yes"
    if row.check.fix.startswith("the template cannot render"):
        return "no (cannot render a tool conversation)"
    variant = row.template.replace(".jinja", "_training.jinja")
    if passed.get(variant):
        return f"with variant ({variant})"
    if row.template == "qwen3.jinja":
        return "with variant (agentrl qwen3_training)"
    return "no"


HAND_WRITTEN = "<!-- Written by hand, not by examples/make_template_table.py"


def hand_written_sections(path: Path) -> str:
    """The sections of the page written by hand (each ``## `` heading followed by the
    HAND_WRITTEN comment), kept as they are after the generated part."""
    if not path.is_file():
        return ""
    parts = re.split(r"(?m)^(?=## )", path.read_text(encoding="utf-8"))
    kept = [p for p in parts if p.startswith("## ") and HAND_WRITTEN in p.split("\n", 3)[2]]
    return "".join("\n" + p.rstrip("\n") + "\n" for p in kept)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    spec = importlib.util.find_spec("trl")
    default = Path(spec.submodule_search_locations[0]) / "chat_templates" if spec else None
    parser.add_argument("--templates", type=Path, default=default)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "templates.md")
    args = parser.parse_args()
    if args.templates is None:
        sys.exit("trl is not installed: `.venv/bin/pip install -e .[dev]`, or pass --templates DIR")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ROOT / "tests" / "fixtures" / "tokenizers" / "qwen2.5")
    rows = check_corpus(args.templates, tok)
    passed = {r.template: r.check.passed for r in rows}
    with_calls = [r for r in rows if r.check.tool_call_format]
    after_ok = sum(all(t.passed for t in r.round_trips if t.rendered) for r in with_calls)
    before_ok = before_wrong = before_none = before_silent = 0
    before_claimed = sum(legacy_format((args.templates / r.template).read_text(encoding="utf-8")) is not None
                         for r in rows if not r.check.tool_call_format)
    for r in with_calls:
        source = (args.templates / r.template).read_text(encoding="utf-8")
        old = legacy_format(source)
        before_wrong += old is not None and old != r.check.tool_call_format
        before_none += old is None
        if old is None:
            continue
        render = template_renderer(tok, source, bos_token="")
        trips = [t for t in round_trip_all(render, old) if t.rendered]
        before_ok += bool(trips) and all(t.passed for t in trips)
        before_silent += any(not t.passed and not FORMATS[old].parse(t.detail).errors for t in trips)
    lines = [
        "# Chat templates and tool-call formats",
        "",
        f"Generated by `examples/make_template_table.py` from the {len(rows)} chat templates of the installed "
        "`trl` package (`trl/chat_templates`), rendered with the Qwen2.5 fixture tokenizer (text only). Do not "
        "edit by hand. `agentrl check-template` gives the same verdicts for one template "
        "(`run_check_corpus` in `agentrl/chat/check.py` prints one line per template of a folder).",
        "",
        f"- {len(with_calls)} of {len(rows)} templates render assistant tool calls; every one is detected as "
        f"exactly one of the {len(FORMATS)} registered formats (`agentrl/chat/formats/`) by rendering a known call and "
        "reading it back.",
        f"- Round trip (one call, two parallel calls, nested JSON, unicode, quotes and escapes rendered, then parsed "
        f"back identical): {after_ok}/{len(with_calls)} now; {before_ok}/{len(with_calls)} with the substring "
        f"detection and two parsers agentrl had before. Before, {before_wrong} of these templates were detected as "
        f"a format they do not use (now 0), {before_none} were not detected (an error asking for "
        f"`tool_call_format`, which had no value that could read them), and for {before_silent} the parser dropped "
        f"calls without an error. {before_claimed} templates that render no calls were given a format anyway.",
        "- Parallel calls: Llama 3.1/3.2 templates refuse two calls in one turn; gpt-oss renders only the first "
        "(Harmony writes one call per message). Those cases count as not rendered, not as parse failures.",
        "- Prefix-preserving: \"with variant\" names a template that passes where the original fails. Reasoning: "
        "what the template does with a `<think>` block written in assistant content, as rollouts store it.",
        "- Formats that write strings bare (`qwen_xml`, `glm4`, `atem_xml`) type values by the tool schema; without "
        "it, a string such as \"391\" reads back as the number 391.",
        "",
        "| family | template | prefix-preserving | tool-call format | round trip | reasoning handling |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        trip = r.round_trip if r.check.tool_call_format else "-"
        if trip != "-":
            trip = ("yes " if trip.split("/")[0] == trip.split("/")[1] else "no ") + f"({trip})"
        lines.append(f"| {family(r.template)} | `{r.template}` | {prefix_column(r, passed)} | "
                     f"{r.check.tool_call_format or 'renders no calls'} | {trip} | {r.reasoning} |")
    lines += ["", "## Formats", "", "| format | families | syntax | extra stop tokens |", "|---|---|---|---|"]
    for f in FORMATS.values():
        syntax = re.sub(r"\|", r"\\|", f.description)
        stops = ", ".join(f"`{t}`" for t in f.stop_tokens) or "-"
        lines.append(f"| `{f.name}` | {f.families} | `{syntax}` | {stops} |")
    args.out.write_text("\n".join(lines) + "\n" + hand_written_sections(args.out), encoding="utf-8")
    print(f"wrote {args.out}: {len(rows)} templates, {len(with_calls)} with calls, round trip {after_ok} "
          f"(before {before_ok}), mis-detected before {before_wrong} (+{before_none} undetected), silent drops before {before_silent}, "
          f"no-call templates given a format before {before_claimed}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
