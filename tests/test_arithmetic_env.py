"""The arithmetic environment: splits, families, checker, demonstrations."""

from __future__ import annotations

import random

import pytest

from agentrl.envs.arithmetic import DEFAULT_FAMILIES, ArithmeticEnv, evaluate, parse_integer, sample_expression
from agentrl.types import Message, ToolCall


def test_splits_are_disjoint_and_deterministic():
    a = ArithmeticEnv(seed=3, num_train=500, num_test=200)
    b = ArithmeticEnv(seed=3, num_train=500, num_test=200)
    c = ArithmeticEnv(seed=4, num_train=500, num_test=200)
    train = {t.metadata["expression"] for t in a.tasks("train")}
    test = {t.metadata["expression"] for t in a.tasks("test")}
    assert len(train) == 500 and len(test) == 200  # no duplicates inside a split either
    assert not train & test
    assert [t.prompt for t in a.tasks("test")] == [t.prompt for t in b.tasks("test")]
    assert [t.prompt for t in a.tasks("train")] == [t.prompt for t in b.tasks("train")]
    assert [t.prompt for t in a.tasks("test")] != [t.prompt for t in c.tasks("test")]


def test_test_set_size_does_not_change_train_order_beyond_exclusions():
    # the test split is drawn from its own stream, so growing train never changes test
    small = ArithmeticEnv(seed=0, num_train=10, num_test=50)
    big = ArithmeticEnv(seed=0, num_train=1000, num_test=50)
    assert [t.prompt for t in small.tasks("test")] == [t.prompt for t in big.tasks("test")]


def test_every_family_in_test_set_and_answers_exact():
    env = ArithmeticEnv(seed=0, num_train=50, num_test=200)
    test = env.tasks("test")
    counts = {f: sum(t.family == f for t in test) for f in DEFAULT_FAMILIES}
    assert set(counts) == set(DEFAULT_FAMILIES) and min(counts.values()) == 40
    for t in test:
        assert t.answer == str(eval(t.metadata["expression"]))  # Python as the oracle
        assert t.metadata["expression"] in t.prompt


def test_custom_families_set_difficulty():
    env = ArithmeticEnv(seed=0, num_train=20, num_test=20, families={"mul_5x5": "{5}*{5}"})
    for t in env.tasks("train"):
        a, b = t.metadata["expression"].split("*")
        assert len(a) == len(b) == 5 and t.family == "mul_5x5"


def test_bad_configuration_errors_name_the_fix():
    with pytest.raises(ValueError, match="placeholder"):
        ArithmeticEnv(families={"x": "1+2"})
    with pytest.raises(ValueError, match="too few distinct"):
        ArithmeticEnv(num_train=100, num_test=0, families={"tiny": "{1}+{1}"})
    with pytest.raises(ValueError, match="unknown split"):
        ArithmeticEnv(num_train=1, num_test=1).tasks("dev")


def test_evaluate_and_parse():
    assert evaluate("(12+3)*4-5*6") == 30
    assert evaluate("-3*2") == -6
    with pytest.raises(ValueError):
        evaluate("2**10")
    with pytest.raises(ValueError):
        evaluate("__import__('os')")
    assert parse_integer("1,234,567") == 1234567
    assert parse_integer(" -42 ") == -42
    assert parse_integer("42.") == 42
    assert parse_integer("4 2") == 42
    assert parse_integer("42.5") is None
    assert parse_integer("") is None
    assert parse_integer(None) is None
    expr = sample_expression("({3}+{3})*{2}", random.Random(1))
    assert expr.startswith("(") and len(expr) == len("(123+456)*78")


def _conv(task, final: str, tool_result: str | None = None) -> list[Message]:
    msgs = [Message("system", "s"), Message("user", task.prompt)]
    if tool_result is not None:
        msgs.append(Message("assistant", "", tool_calls=[ToolCall("python", {"code": "print(1)"})]))
        msgs.append(Message("tool", tool_result, name="python"))
    msgs.append(Message("assistant", final))
    return msgs


@pytest.mark.parametrize(
    "final, reward, has_answer",
    [
        ("<answer>{a}</answer>", 1.0, True),
        ("The result is <answer> {c} </answer>", 1.0, True),  # commas and spaces tolerated
        ("<answer>{w}</answer>", 0.0, True),
        ("{a}", 0.0, False),  # missing tag
        # several different tags are a hedge, not an answer (docs/reward_integrity.md)
        ("<answer>{w}</answer> then <answer>{a}</answer>", 0.0, False),
        ("<answer>{a}</answer> no, <answer>{w}</answer>", 0.0, False),
        ("<answer>{a}</answer> so <answer> {a} </answer>", 1.0, True),  # one answer repeated
        ("<answer>{f}</answer>", 0.0, True),  # full-width digits are not ASCII 0-9
        ("<answer>{a}0</answer>", 0.0, True),
    ],
)
def test_checker_cases(final, reward, has_answer):
    env = ArithmeticEnv(seed=0, num_train=5, num_test=5)
    task = env.tasks("test")[0]
    a = task.answer
    text = final.format(a=a, c=f"{int(a):,}", w=str(int(a) + 1), f="".join(chr(0xFF10 + int(d)) for d in a))
    s = env.score(task, _conv(task, text))
    assert s.reward == reward
    assert s.info["has_answer"] is has_answer
    assert s.info["family"] == task.family
    assert s.info["used_tool"] is False


def test_answer_only_in_tool_output_scores_zero():
    env = ArithmeticEnv(seed=0, num_train=5, num_test=5)
    task = env.tasks("test")[0]
    msgs = _conv(task, "I am done.", tool_result=f"<answer>{task.answer}</answer>\n")
    s = env.score(task, msgs)
    assert s.reward == 0.0 and s.info["has_answer"] is False and s.info["used_tool"] is True
    # an earlier assistant turn's answer does not count either: only the last turn is read
    msgs = [Message("user", task.prompt), Message("assistant", f"<answer>{task.answer}</answer>"),
            Message("tool", "x"), Message("assistant", "<answer>0</answer>")]
    assert env.score(task, msgs).reward == 0.0


def test_used_tool_counts_calls():
    env = ArithmeticEnv(seed=0, num_train=5, num_test=5)
    task = env.tasks("test")[1]
    s = env.score(task, _conv(task, f"<answer>{task.answer}</answer>", tool_result=task.answer))
    assert s.reward == 1.0 and s.info["used_tool"] is True and s.info["tool_calls"] == 1


def test_control_condition_has_no_tools():
    env = ArithmeticEnv(seed=0, num_train=5, num_test=5, use_tool=False)
    assert env.tools() == []
    assert "python" not in env.system_prompt
    demo = env.demonstrations(2, seed=0)[0]
    assert [m.role for m in demo] == ["system", "user", "assistant"]


def test_demonstrations_are_correct_train_only_and_cover_families():
    env = ArithmeticEnv(seed=0, num_train=200, num_test=50)
    demos = env.demonstrations(25, seed=1)
    assert demos == env.demonstrations(25, seed=1)
    test_prompts = {t.prompt for t in env.tasks("test")}
    train = {t.prompt: t for t in env.tasks("train")}
    families = set()
    for d in demos:
        assert [m.role for m in d] == ["system", "user", "assistant", "tool", "assistant"]
        task = train[d[1].content]
        assert d[1].content not in test_prompts
        families.add(task.family)
        code = d[2].tool_calls[0].arguments["code"]
        assert d[2].tool_calls[0].name == "python"
        assert code == f"print(str({task.metadata['expression']}).zfill(8))"
        assert d[3].content == task.answer.zfill(8) + "\n" and d[4].content == f"<answer>{task.answer.zfill(8)}</answer>"
        assert env.score(task, d).reward == 1.0  # leading zeros still denote the right integer
    assert families == set(DEFAULT_FAMILIES)


def test_default_families_have_one_width_so_copying_is_one_shift():
    env = ArithmeticEnv(seed=0, num_train=100, num_test=50)
    widths = {len(t.metadata["expression"]) for t in env.tasks("train") + env.tasks("test")}
    assert widths == {9}
    assert max(len(t.answer) for t in env.tasks("train")) <= env.answer_width


def test_plain_answer_width_and_real_tool_output_match_the_demonstration():
    import asyncio

    from agentrl.toolbox import ToolBox

    for width in (None, 8):
        env = ArithmeticEnv(seed=0, num_train=20, num_test=5, answer_width=width)
        demo = env.demonstrations(1, seed=0)[0]
        box = ToolBox(env.tools())
        ctx = box.new_context("t")
        call = demo[2].tool_calls[0]
        out = asyncio.run(box.execute(call.name, call.arguments, ctx))
        asyncio.run(box.close(ctx))
        assert out.error is None and out.content == demo[3].content  # the demo shows the real stdout
    assert demo[2].tool_calls[0].arguments["code"] == f"print(str({demo[1].content[:-2]}).zfill(8))"
    with pytest.raises(ValueError, match="answer_width"):
        ArithmeticEnv(answer_width=0)
