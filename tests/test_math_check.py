"""The math answer checker: extraction from the last assistant turn only, and equivalence on
answer pairs (numbers with commas, units, percent, fractions vs decimals, LaTeX), explained."""

from __future__ import annotations

import re
import sys
import threading

import pytest

from agentrl.envs.math_check import (
    ANSWER_PATTERN,
    AnswerChecker,
    check_equivalence,
    extract_answer,
    extract_final_answer,
    gsm8k_gold,
    last_boxed,
    parse_number,
)
from agentrl.types import Message, ToolCall

pytest.importorskip("math_verify")

# (model's extracted answer, gold, method that decides)
EQUIVALENT = [
    ("3.1416", "3.14", "numeric"),  # a decimal reference is matched to its own precision
    ("1/3", "0.333", "numeric"),
    ("1,234", "1234", "numeric"),
    ("1234", "1,234", "numeric"),
    ("$1,234.00", "1234", "numeric"),
    ("\\$18", "18", "numeric"),
    ("18 dollars", "18", "numeric"),
    ("18\\text{ dollars}", "18", "numeric"),
    ("5 hours", "5", "numeric"),
    ("12 km/h", "12", "numeric"),
    ("90^\\circ", "90", "numeric"),
    ("3.0", "3", "numeric"),
    ("3.", "3", "numeric"),
    ("0.5", "1/2", "numeric"),
    ("0.75", "\\frac{3}{4}", "numeric"),
    ("\\dfrac{3}{4}", "0.75", "numeric"),
    ("-\\frac{1}{2}", "-0.5", "numeric"),
    ("0.333333", "1/3", "numeric"),
    ("25%", "25", "numeric"),
    ("25\\%", "25", "numeric"),
    ("25 percent", "0.25", "numeric"),
    ("0.25", "25\\%", "numeric"),
    ("50.0\\%", "50", "numeric"),
    ("1\\,000", "1000", "numeric"),
    ("−7", "-7", "numeric"),
    ("$-5", "-5", "numeric"),
    ("\\frac{\\pi}{2}", "\\pi/2", "math_verify"),
    ("\\sqrt{2}", "2^{1/2}", "math_verify"),
    ("2\\sqrt{3}", "\\sqrt{12}", "math_verify"),
    ("x+1", "1+x", "math_verify"),
    ("3^2", "9", "math_verify"),
    ("\\{2, 1\\}", "\\{1, 2\\}", "math_verify"),
    ("x = 2", "2", "math_verify"),
    ("\\frac{1+\\sqrt{5}}{2}", "\\frac{\\sqrt{5}+1}{2}", "math_verify"),
    ("B", "\\text{(B)}", "math_verify"),
    ("north-east", "North-East", "string"),
]

NOT_EQUIVALENT = [
    ("1,235", "1234", "numeric"),
    ("-5", "5", "numeric"),
    ("0.33", "1/3", "numeric"),
    ("1000001", "1000000", "numeric"),  # whole numbers match exactly, however large
    ("1000000.4", "1000000", "numeric"),
    ("3.15", "3.14", "numeric"),  # outside half a unit of the reference's last digit
    ("18", "1.8", "numeric"),
    ("25", "0.25", "numeric"),  # no percent sign: 25 is not a quarter
    ("1234.5", "1234", "numeric"),
    ("2 thousand", "2", "math_verify"),  # a scale word is not a unit
    ("2\\pi", "2", "math_verify"),
    ("2 pi", "2", "math_verify"),
    ("5x", "5", "math_verify"),
    ("\\sqrt{3}", "\\sqrt{2}", "math_verify"),
    ("\\frac{\\pi}{3}", "\\frac{\\pi}{2}", "math_verify"),
    ("x-1", "x+1", "math_verify"),
    ("1,2", "12", "math_verify"),  # a pair, not twelve
    ("\\text{Paris}", "\\text{London}", "math_verify"),
    ("A) blue", "B) red", "string"),  # math-verify parses neither side
]


@pytest.mark.parametrize("answer,gold,method", EQUIVALENT)
def test_equivalent_pairs(answer, gold, method):
    v = check_equivalence(answer, gold)
    assert v.correct, v.reason
    assert v.method == method, v.reason
    assert v.extracted == answer and v.gold == gold and v.reason


@pytest.mark.parametrize("answer,gold,method", NOT_EQUIVALENT)
def test_non_equivalent_pairs(answer, gold, method):
    v = check_equivalence(answer, gold)
    assert not v.correct, v.reason
    assert v.method == method, v.reason


def test_enough_pairs_cover_both_outcomes_and_every_method():
    assert len(EQUIVALENT) + len(NOT_EQUIVALENT) >= 40
    for table in (EQUIVALENT, NOT_EQUIVALENT):
        assert {m for *_, m in table} == {"numeric", "math_verify", "string"}


def test_reason_explains_the_decision():
    v = check_equivalence("1,200 dollars", "1200")
    assert v.reason == "numbers: 1200 == 1200"
    v = check_equivalence("\\frac{\\pi}{3}", "\\pi/2")
    assert "not equivalent" in v.reason and "pi" in v.reason
    info = check_equivalence(None, "3").info()
    assert info == {"extracted": "", "gold": "3", "method": "none", "has_answer": False,
                    "reason": "no answer found in the last assistant turn", "source": "none"}


# -- extraction ----------------------------------------------------------------------------


@pytest.mark.parametrize("text,expected,source", [
    ("so \\boxed{\\frac{1}{\\sqrt{2}}} is it", "\\frac{1}{\\sqrt{2}}", "boxed"),
    ("first \\boxed{1}, no wait: \\boxed{{2}}", None, "ambiguous"),  # different answers: a hedge, none counts
    ("\\boxed{2} so, again, \\boxed{ 2 }", "2", "boxed"),  # one answer repeated counts once
    ("\\fbox{7}", "7", "boxed"),
    ("<answer>\\boxed{7}</answer>", "7", "tag"),
    ("<answer>3</answer> and later \\boxed{4}", "3", "tag"),  # the tag wins over a box
    ("<answer>1</answer> ... <answer> 2 </answer>", None, "ambiguous"),  # two different tags
    ("<answer>2</answer> ... <answer> 2 </answer>", "2", "tag"),
    ("<answer>\\boxed{1} \\boxed{2}</answer>", None, "ambiguous"),  # two boxes inside the tag
    ("#### 3\n#### 4\n", None, "ambiguous"),
    ("Work...\n#### 1,200\n", "1,200", "hash"),
    ("Thus the answer is 3.5. Thanks.", "3.5", "answer_is"),
    ("The final answer is: **42**", "42", "answer_is"),
    ("Answer: $\\frac{1}{2}$", "\\frac{1}{2}", "answer_is"),
    ("I computed 42 with python.", None, "none"),  # no last-number fallback
    ("cut off \\boxed{12", None, "none"),  # an unclosed box is no answer
    ("", None, "none"),
])
def test_extract_answer(text, expected, source):
    got = extract_answer(text)
    assert (got.text, got.source) == (expected, source)


def test_configured_tag_and_disabled_tag():
    assert extract_answer("<final>9</final>", tag="final").text == "9"
    assert extract_answer("<answer>9</answer>", tag=None).text is None
    assert extract_answer("<answer>9</answer> \\boxed{8}", tag=None).text == "8"


def test_last_boxed_balances_nested_braces():
    assert last_boxed("\\boxed{\\{1, 2\\}}") == "\\{1, 2\\}"
    assert last_boxed("\\boxed {x^{2}}") == "x^{2}"
    assert last_boxed("no box") is None


def test_gsm8k_gold_and_parse_number():
    assert gsm8k_gold("48/2 = <<48/2=24>>24\n#### 72") == "72"
    assert gsm8k_gold("#### 1,000,000") == "1000000"
    assert gsm8k_gold("3/4") == "3/4"
    assert parse_number("2 dozen") is None and parse_number("5 x") is None and parse_number("5 m").value == 5
    assert parse_number("7 apples").value == 7 and parse_number("12%").percent


def _tool_turn(code: str) -> Message:
    return Message("assistant", "", tool_calls=[ToolCall(name="python", arguments={"code": code})])


def test_answer_only_in_tool_output_does_not_count():
    checker = AnswerChecker()
    for leaked in ["<answer>42</answer>", "\\boxed{42}", "the answer is 42", "#### 42"]:
        msgs = [Message("user", "6*7?"), _tool_turn(f"print({leaked!r})"),
                Message("tool", leaked + "\n", name="python"),
                Message("assistant", "I ran the code and looked at the output.")]
        v = checker.check(msgs, "42")
        assert not v.correct and v.method == "none" and v.extracted is None, leaked
        # the conversation ends on the tool result: the last assistant turn is the call itself
        assert not checker.check(msgs[:-1], "42").correct
    # the same conversation, with the model stating the answer itself, does count
    ok = msgs[:-1] + [Message("assistant", "<answer>42</answer>")]
    assert checker.check(ok, "42").correct


def test_only_the_last_assistant_turn_counts():
    msgs = [Message("user", "q"), Message("assistant", "<answer>42</answer>"),
            Message("user", "are you sure?"), Message("assistant", "Let me think again.")]
    assert extract_final_answer(msgs).text is None
    msgs[-1] = Message("assistant", "<answer>41</answer>")
    assert not AnswerChecker().check(msgs, "42").correct


def test_void_turn_pattern_accepts_every_extracted_format():
    pat = re.compile(ANSWER_PATTERN, re.DOTALL)
    for text in ["<answer>1</answer>", "x \\boxed{1}", "work\n#### 1", "The answer is 1", "Answer: 1"]:
        assert pat.search(text), text
    for text in ["Let me compute this with python.", "The <answer> is", "1 + 1 = 2"]:
        assert not pat.search(text), text


def test_timeout_in_main_thread_counts_as_not_equivalent():
    # sympy would grind on 9^(9^9) for minutes; math-verify's signal timeout stops it
    v = check_equivalence("9^{9^{9}}", "5", timeout=1)
    assert not v.correct and v.method == "math_verify" and "timed out" in v.reason


def test_check_runs_in_a_worker_thread():
    # math-verify's signal.alarm raises off the main thread; the checker runs without it there
    out: dict[str, object] = {}

    def work():
        try:
            out["v"] = check_equivalence("\\frac{\\pi}{2}", "\\pi/2")
        except BaseException as e:  # pragma: no cover - the failure being tested for
            out["e"] = e

    t = threading.Thread(target=work)
    t.start()
    t.join(60)
    assert "e" not in out, out.get("e")
    v = out["v"]
    assert v.correct and v.method == "math_verify" and "not in the main thread" in v.reason


def test_overlong_answer_is_refused_without_parsing():
    v = check_equivalence("1+" * 600 + "1", "601")
    assert not v.correct and v.method == "none" and "longer than" in v.reason


def test_missing_math_verify_names_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)
    with pytest.raises(ImportError, match="pip install math-verify"):
        AnswerChecker()
    checker = AnswerChecker(use_math_verify=False)  # numbers and strings still work
    assert checker.compare("1,000", "1000").correct
    v = checker.compare("\\frac{\\pi}{2}", "\\pi/2")
    assert not v.correct and v.method == "string"
