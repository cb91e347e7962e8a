"""Hidden-test checker: does a candidate program pass a problem's unit tests?

The tests and the solution run in two separate sandboxed processes (separate uids, separate
pid namespaces where bubblewrap is available), joined by a pipe:

- the *candidate* process executes the program and answers calls to its entry point;
- the *harness* process executes the problem's prompt (for helpers the tests use) and its
  tests, with the entry point replaced by a stub that forwards each call through the pipe.
  Only plain values cross (None, bool, int, float, str, bytes, complex, and lists, tuples,
  sets, dicts of them; exact types, subclasses refused), rebuilt fresh in the harness, so
  the comparisons in the tests see real builtins: an object whose ``__eq__`` always returns
  True cannot cross, and a monkeypatch in the candidate's process (of ``builtins``,
  ``AssertionError``, the test module...) never reaches the tests.
- The parent generates a random completion token per check and hands it only to the harness,
  which prints it after ``check(candidate)`` returned. A run passes only if the harness
  exited with status 0 *and* printed the token: ``exit(0)``, ``os._exit(0)``, a killed
  harness, or a program printing "all tests passed" cannot pass.
- An exception the solution raises reaches the tests as the builtin of that name; a
  ``StopIteration`` (which would silently end a ``map``/``filter`` the tests iterate) arrives as
  a ``RuntimeError`` (:func:`guarded_tests`).
- :class:`~agentrl.envs.humaneval.HumanEvalEnv` hides its problems' file from both processes
  (:mod:`agentrl.envs.hidden_data`): the solution cannot read its tests or the canonical
  solution. ``agentrl audit-env humaneval`` tries all of these (docs/reward_integrity.md).

Limits: arguments and results must be plain values as above (true of HumanEval); a test that
relies on the solution mutating its argument in place cannot see that mutation.

Problem shape (HumanEval's; also what :func:`agentrl.envs.humaneval.load_problems` reads):
``task_id``, ``prompt``, ``test`` (defining ``check(candidate)``), ``entry_point``, and
optionally ``canonical_solution`` (a completion of the prompt).

Example::

    from agentrl.envs.code_check import CodeChecker, CodeProblem
    p = CodeProblem("t/0", prompt="def add(a, b):\\n", entry_point="add",
                    test="def check(candidate):\\n    assert candidate(2, 3) == 5\\n")
    checker = CodeChecker()
    assert checker.check(p, "def add(a, b):\\n    return a + b\\n").passed
    assert not checker.check(p, "import sys\\nsys.exit(0)\\n").passed
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass

from agentrl.tools.sandbox.config import SandboxConfig
from agentrl.tools.sandbox.local import LocalExecutor
from agentrl.tools.sandbox.process import pump


@dataclass(frozen=True)
class CodeProblem:
    """One problem with hidden tests (HumanEval's fields)."""

    task_id: str
    prompt: str
    test: str
    entry_point: str
    canonical_solution: str = ""


@dataclass
class CheckResult:
    """The verdict. ``reason``: passed | failed | timeout | output_limit. ``detail`` is the end
    of the test process's output (the failing assertion), for logs, never for the model."""

    passed: bool
    reason: str
    detail: str
    duration_s: float


# The checker's own default limits: tests of one problem are small; a wrong solution that
# loops should fail fast.
CHECK_CONFIG = SandboxConfig(timeout=10.0, max_output_chars=2000)


class CodeChecker:
    """Runs hidden tests in the sandbox. Thread-safe; concurrency is bounded by the pool."""

    def __init__(self, config: SandboxConfig | None = None, executor: LocalExecutor | None = None) -> None:
        self.executor = executor or LocalExecutor(config or CHECK_CONFIG)

    @property
    def isolation_level(self) -> str:
        return self.executor.isolation_level

    def check(self, problem: CodeProblem, program: str) -> CheckResult:
        """Run ``problem.test``'s ``check`` against the ``entry_point`` that ``program`` defines."""
        ex = self.executor
        cfg = ex.config
        token = secrets.token_hex(16)
        limits = ex.isolation.limits(cfg.cpu_seconds_per_call)
        undumpable = ex.isolation.leases is None and ex.isolation.level == "rlimits"
        req_r, req_w = os.pipe()  # harness -> candidate: calls
        resp_r, resp_w = os.pipe()  # candidate -> harness: results
        with ex.pool.slot(), ex.lease_uid() as cand_uid, ex.lease_uid() as test_uid:
            cand_job = {"program": program, "entry_point": problem.entry_point, "req_fd": req_r, "resp_fd": resp_w}
            test_job = {
                "prelude": prelude(problem.prompt), "tests": guarded_tests(problem), "entry_point": problem.entry_point,
                "token": token, "req_fd": req_w, "resp_fd": resp_r, "undumpable": undumpable,
            }
            started = []
            try:
                started.append(ex.start(["candidate", limits], cand_uid, _job(cand_job), (req_r, resp_w)))
                started.append(ex.start(["harness", limits], test_uid, _job(test_job), (req_w, resp_r)))
            finally:
                for fd in (req_r, req_w, resp_r, resp_w):
                    os.close(fd)  # the children hold their ends; a dead peer then reads EOF
            harness = started[-1][0] if len(started) == 2 else None
            reason = "error"
            try:
                if harness is not None:
                    reason = pump([p for p, _ in started], lambda: harness.exited, cfg.timeout, cfg.max_output_bytes)
            finally:
                results = [ex.finish(p, launch, reason, cfg.timeout) for p, launch in started]
        if harness is None:
            raise RuntimeError("could not start the checker's processes")
        test_result = results[-1]
        passed = reason == "done" and test_result.exit_code == 0 and f"\n{token}\n".encode() in harness.capture.raw()
        verdict = "passed" if passed else {"timeout": "timeout", "output": "output_limit"}.get(reason, "failed")
        detail = test_result.output.replace(token, "<token>")
        return CheckResult(passed=passed, reason=verdict, detail=detail[-1000:], duration_s=test_result.duration_s)


# Appended to the tests: a solution that raises StopIteration inside ``map``/``filter``/an
# iterator the tests drive would end that iteration early (``all(map(candidate, xs))`` is then
# True); seen by the tests, it becomes a RuntimeError.
_GUARD = """

def _agentrl_guard(fn):
    def guarded(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (StopIteration, StopAsyncIteration) as exc:
            raise RuntimeError("the solution raised " + type(exc).__name__) from None
    return guarded


{entry} = _agentrl_guard({entry})
_agentrl_check = check


def check(candidate):
    return _agentrl_check(_agentrl_guard(candidate))
"""


def guarded_tests(problem: CodeProblem) -> str:
    """``problem.test`` with the solution's StopIteration turned into an error (see ``_GUARD``).

    >>> "_agentrl_guard(add)" in guarded_tests(CodeProblem("t", "def add(a, b):\\n", "def check(c):\\n    pass\\n", "add"))
    True
    """
    if not problem.entry_point.isidentifier():
        return problem.test
    return problem.test.rstrip() + "\n" + _GUARD.format(entry=problem.entry_point)


def prelude(prompt: str) -> str:
    """The prompt as the harness executes it (for helpers and imports the tests use): as is
    when it compiles, else with ``pass`` as the body of its unfinished last function, else
    nothing.

    >>> prelude("import math\\ndef f(x):\\n")
    'import math\\ndef f(x):\\n    pass\\n'
    """
    for text in (prompt, prompt.rstrip() + "\n    pass\n"):
        try:
            compile(text, "<prompt>", "exec")
            return text
        except (SyntaxError, ValueError):
            continue
    return ""


def _job(payload: dict[str, object]) -> bytes:
    return json.dumps(payload).encode("utf-8", "surrogatepass")
