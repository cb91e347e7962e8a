"""Prefix-preservation check over every fixture chat template, and the check-template CLI body."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.chat.check import check_prefix_preservation, run_check_corpus, run_check_template
from fixture_paths import QWEN25, QWEN3, TEMPLATES

ONE_CALL_PER_TURN = "one call per turn"
CALLS_NOT_RENDERED = "does not render the assistant's tool calls"

# template -> (passed, failing stage, text expected in notes). Recorded with transformers 5.19.
EXPECTED = {
    "Qwen-Qwen2.5-7B-Instruct.jinja": (True, "", ""),
    "Qwen-Qwen3-0.6B.jinja": (False, "tool message after a tool-call turn", ""),
    "Qwen-Qwen3-0.6B.2025-05-llamacpp.jinja": (False, "tool message after a tool-call turn", ""),
    "meta-llama-Llama-3.1-8B-Instruct.jinja": (True, "", ONE_CALL_PER_TURN),
    "meta-llama-Llama-3.2-3B-Instruct.jinja": (True, "", ONE_CALL_PER_TURN),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": (True, "", ""),
    # transformers passes content "" (never None), so the template renders no tool call at all
    # (it writes calls only when content is None); tool results and the rest are prefix-stable.
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": (True, "", CALLS_NOT_RENDERED),
    # assistant turns with tool calls have content "" (this template rejects content + calls).
    "mistralai-mistral-common-v3_spm.jinja": (True, "", ""),
    "hermes": (True, "", ""),
    "hermes_compact": (True, "", ""),
    "qwen3_training": (True, "", ""),
}


@pytest.fixture(scope="module")
def qwen25():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(QWEN25)


def test_every_fixture_template_is_listed():
    assert {p.name for p in TEMPLATES.glob("*.jinja")} | {"hermes", "hermes_compact", "qwen3_training"} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_template(qwen25, name):
    # The check renders text only; the Qwen2.5 tokenizer supplies bos/eos strings for all templates.
    template = str(TEMPLATES / name) if name.endswith(".jinja") else name
    check = check_prefix_preservation(qwen25, template)
    passed, stage, note = EXPECTED[name]
    assert (check.passed, check.stage) == (passed, stage), check.diff
    assert note in check.notes and (note or not check.notes)
    if passed:
        assert check.diff == "" and check.fix == ""
    else:
        assert "qwen3_training" in check.fix
        assert "-<think>" in check.diff and "renderings diverge at character" in check.diff


TOY_POSITIONAL = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if loop.last and m.role == 'assistant' %}"
                  "[LAST]{% endif %}{{ m.content }}{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }}"
                  "</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
                  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TOY_DROPS_RESULTS = ("{% for m in messages if m.role != 'tool' %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                     "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TOY_NO_TOOL_ROLE = ("{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tool role') }}{% endif %}"
                    "{{ m.content }}<|im_end|>{% endfor %}")


def test_non_preserving_toy_template_fails_with_diff(qwen25):
    check = check_prefix_preservation(qwen25, TOY_POSITIONAL)
    assert not check.passed and check.stage == "tool message after a tool-call turn"
    assert "-[LAST]<tool_call>calculator" in check.diff and "+<|im_start|>tool" in check.diff
    assert "--template" in check.fix


def test_template_that_drops_tool_results_fails(qwen25):
    check = check_prefix_preservation(qwen25, TOY_DROPS_RESULTS)
    assert not check.passed and "do not appear" in check.diff and "drops tool results" in check.fix


def test_template_that_cannot_render_tools_fails_clearly(qwen25):
    check = check_prefix_preservation(qwen25, TOY_NO_TOOL_ROLE)
    assert not check.passed and "no tool role" in check.diff and "cannot render" in check.fix


def test_cli_body(capsys):
    assert run_check_template(str(QWEN25), None) == 0
    assert capsys.readouterr().out.startswith("PASS")
    assert run_check_template(str(QWEN3), None) == 1
    out = capsys.readouterr().out
    assert out.startswith("FAIL") and "--template qwen3_training" in out and "stage: tool message" in out
    assert run_check_template(str(QWEN3), "qwen3_training") == 0
    assert "PASS" in capsys.readouterr().out


def test_cli_body_missing_tokenizer(capsys, tmp_path):
    assert run_check_template(str(tmp_path / "absent"), None) == 1
    out = capsys.readouterr().out
    assert "no such directory" in out and "local directory" in out
    assert run_check_template(str(tmp_path), None) == 1  # exists, holds no tokenizer
    out = capsys.readouterr().out
    assert out.startswith("error: cannot load a tokenizer from directory") and out.count("\n") == 1


# --- notes that say what happened ---------------------------------------------------------------

_CALLS = ("{% for c in m.tool_calls or [] %}<tool_call>{{ {'name': c.function.name, 'arguments': c.function.arguments}"
          " | tojson }}</tool_call>{% endfor %}")
_TOY = ("{% for m in messages %}CHECK<|im_start|>{{ m.role }}\n{{ m.content }}" + _CALLS + "<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _toy(check: str) -> str:
    return _TOY.replace("CHECK", check)


def test_system_role_rejection_is_named_not_blamed_on_parallel_calls(qwen25):
    check = check_prefix_preservation(qwen25, _toy("{% if m.role == 'system' %}{{ raise_exception('no system role') }}"
                                                   "{% endif %}"))
    assert check.passed and check.tool_call_format == "hermes"
    assert "rejects a system message" in check.notes and "no system role" in check.notes
    assert ONE_CALL_PER_TURN not in check.notes


def test_parallel_rejection_note_quotes_the_error(qwen25):
    check = check_prefix_preservation(qwen25, _toy("{% if (m.tool_calls or []) | length > 1 %}"
                                                   "{{ raise_exception('one call only, please') }}{% endif %}"))
    assert check.passed and ONE_CALL_PER_TURN in check.notes and "one call only, please" in check.notes


def test_json_string_arguments_are_retried(qwen25):
    # DeepSeek-V3's original template concatenates the arguments as a string
    source = _toy("").replace("| tojson }}</tool_call>", "| tojson }}</tool_call>{{ '' + c.function.arguments }}")
    check = check_prefix_preservation(qwen25, source)
    assert check.passed and "as JSON strings" in check.notes and "deepseekv3_training" in check.notes


def test_trailing_eos_is_diagnosed_as_such(qwen25):
    source = _TOY.replace("{% endfor %}{% if add", "{% if loop.last and m.role == 'assistant' %}{{ eos_token }}"
                                                   "{% endif %}{% endfor %}{% if add").replace("CHECK", "")
    check = check_prefix_preservation(qwen25, source)
    assert not check.passed and "eos_token ('<|im_end|>')" in check.fix and "Phi-3" in check.fix


def test_non_json_calls_are_reported_as_rendered(qwen25):
    gemma_like = _toy("").replace(_CALLS, "{% for c in m.tool_calls or [] %}<|tool_call>call:{{ c.function.name }}"
                                          "{}<tool_call|>{% endfor %}")
    check = check_prefix_preservation(qwen25, gemma_like)
    assert check.passed and check.tool_call_format == "" and CALLS_NOT_RENDERED not in check.notes
    assert "no registered format reads" in check.notes  # arguments dropped: rendered, but not readable back


def test_corpus_mode_prints_one_line_per_template(capsys, tmp_path):
    (tmp_path / "good.jinja").write_text((TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text())
    (tmp_path / "qwen3.jinja").write_text((TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text())
    assert run_check_corpus(str(tmp_path), str(QWEN25)) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[-1].startswith("1/2 prefix-preserving; 2 with a detected tool-call format")
    assert lines[0].startswith("good.jinja") and " PASS " in lines[0] and "hermes" in lines[0]
    assert "round-trip 5/5" in lines[0] and "reasoning: kept in every turn" in lines[0]
    assert lines[1].startswith("qwen3.jinja") and "FAIL (tool message after a tool-call turn)" in lines[1]
    assert "reasoning: dropped from earlier turns; adds an empty <think> block" in lines[1]
    assert run_check_corpus(str(tmp_path / "absent"), str(QWEN25)) == 1
    assert "no such directory" in capsys.readouterr().out


def test_cli_corpus_mode_prints_one_line_per_template(tmp_path, capsys):
    from agentrl.cli import main

    for name in ("Qwen-Qwen2.5-7B-Instruct.jinja", "Qwen-Qwen3-0.6B.jinja"):
        (tmp_path / name).write_text((TEMPLATES / name).read_text())
    code = main(["check-template", str(QWEN3), "--corpus", str(tmp_path)])
    lines = [line for line in capsys.readouterr().out.splitlines() if ".jinja" in line]
    assert len(lines) == 2, lines
    qwen25, qwen3 = sorted(lines)
    assert "PASS" in qwen25 and "hermes" in qwen25 and "round-trip 5/5" in qwen25
    assert "FAIL (tool message after a tool-call turn)" in qwen3
    assert code == 1  # Qwen3's original is not prefix-preserving: the exit code says so
