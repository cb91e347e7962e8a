r"""Math word problems with a Python tool (GSM8K, MATH, or your own JSONL), robustly checked.

Data sources (``train`` and ``test`` arguments):

- ``"builtin"``: 100 generated multi-step word problems shipped with the package
  (``envs/data/math_word_problems.jsonl``, written by ``benchmarks/make_math_problems.py``).
- a path to a JSONL file (one JSON object per line; a ``.json`` list also works) in any of the
  common shapes, detected per record:

  - GSM8K: ``{"question": ..., "answer": "...worked solution...\n#### 72"}``
  - MATH: ``{"problem": ..., "solution": "... \\boxed{\\frac{1}{2}} ..."}`` (an ``answer``
    field, as in MATH-500, wins over the solution)
  - plain: ``{"question" | "problem" | "prompt": ..., "answer": "42"}``

  Optional ``id`` and ``family`` (or MATH's ``type``/``subject``) fields are kept.
- ``"hf:NAME"`` or ``"hf:NAME@SPLIT"``: a Hugging Face dataset via ``datasets`` (with
  ``hf_config``, e.g. ``"main"`` for ``openai/gsm8k``); the split defaults to the side's name.
  Offline, this stops with one message saying how to download a JSONL and pass its path.

With ``test=None`` the test split is ``num_test`` tasks held out of the train source,
stratified by family; a separate test source is used as is, and train tasks whose prompt
also appears in test are dropped so the splits are disjoint.

Answer format: the last assistant turn gives the answer in ``<answer>...</answer>`` (or
``\boxed{}``, a ``#### N`` line, "the answer is N"). Equivalence is decided by
:mod:`agentrl.envs.math_check` (numbers with commas/units/percent, fractions vs decimals,
LaTeX via math-verify), and the decision is explained in ``Score.info`` (``extracted``,
``gold``, ``method``, ``reason``), which the trainer stores in each trajectory's
the trajectory's ``score``. An answer that appears only in a tool result scores 0.

Example::

    >>> from agentrl.types import Message
    >>> env = MathEnv(num_test=10)
    >>> task = env.tasks("test")[0]
    >>> done = [Message("user", task.prompt), Message("assistant", f"<answer>{task.answer}</answer>")]
    >>> s = env.score(task, done)
    >>> s.reward, s.info["method"]
    (1.0, 'numeric')
"""

from __future__ import annotations

import random
import re
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.env import Score, Split, select_split
from agentrl.jsonl import read_objects
from agentrl.envs.math_check import ANSWER_PATTERN, AnswerChecker, gsm8k_gold, last_boxed
from agentrl.types import Message, Task

if TYPE_CHECKING:
    from agentrl.toolbox import Tool

BUILTIN = "builtin"
PROMPT_KEYS = ("question", "problem", "prompt", "input")
FAMILY_KEYS = ("family", "type", "subject")

SYSTEM_PROMPT_TOOL = ("Solve the math problem. You can run Python code with the python tool to "
                      "calculate. End with the final answer inside {fmt}.")
SYSTEM_PROMPT_NO_TOOL = "Solve the math problem step by step. End with the final answer inside {fmt}."


def builtin_path() -> Path:
    return Path(str(resources.files("agentrl.envs").joinpath("data", "math_word_problems.jsonl")))


def record_to_task(rec: dict[str, Any], task_id: str, where: str) -> Task:
    """One dataset record -> Task, detecting the GSM8K / MATH / plain shape.

    >>> record_to_task({"question": "1+1?", "answer": "so 2\\n#### 2"}, "t0", "demo").answer
    '2'
    """
    prompt = next((rec[k] for k in PROMPT_KEYS if isinstance(rec.get(k), str) and rec[k].strip()), None)
    if prompt is None:
        raise ValueError(f"{where}: no problem text; expected one of the fields {', '.join(PROMPT_KEYS)} "
                         f"(found {sorted(rec)})")
    if rec.get("answer") is not None and str(rec["answer"]).strip():
        gold = gsm8k_gold(str(rec["answer"]))
    elif isinstance(rec.get("solution"), str):
        gold = last_boxed(rec["solution"])
        if gold is None:
            raise ValueError(f"{where}: the solution has no \\boxed{{...}} answer; add an 'answer' field")
    else:
        raise ValueError(f"{where}: no gold answer; expected 'answer' (GSM8K '#### N' or plain) or "
                         f"'solution' with \\boxed{{}} (found {sorted(rec)})")
    family = next((str(rec[k]) for k in FAMILY_KEYS if rec.get(k)), "default")
    meta = {"source_id": str(rec["id"])} if rec.get("id") is not None else {}
    return Task(id=task_id, prompt=prompt.strip(), answer=gold, family=family, metadata=meta)


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Records of a JSONL file (or a JSON list); errors name the file and line."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"math data file {p} does not exist; pass a JSONL path, 'builtin' or 'hf:NAME'")
    return [r.value for r in read_objects(p, allow_json_list=True)]


def load_hf(name: str, split: str, config: str | None = None) -> list[dict[str, Any]]:
    """Records of a Hugging Face dataset split; one clear error when that is impossible."""
    fname = re.sub(r"[^\w.-]+", "_", f"{name}_{split}") + ".jsonl"
    fix = (f"Where you have network, run: python -c \"from datasets import load_dataset; "
           f"load_dataset('{name}', {config!r}, split='{split}').to_json('{fname}')\" and pass "
           f"env.args.train (or test) = {fname}")
    try:
        import datasets  # lazy: only this source needs it
    except ImportError as e:
        raise ValueError(f"loading 'hf:{name}' needs the datasets package (pip install datasets). "
                         f"Or use a JSONL file: {fix}") from e
    try:
        ds = datasets.load_dataset(name, config, split=split)
    except Exception as e:  # offline, unknown name, config or split: all end the same way for a user
        first = (str(e).splitlines() or [""])[0][:200]
        raise ValueError(f"cannot load Hugging Face dataset {name!r} (config {config!r}, split {split!r}): "
                         f"{type(e).__name__}: {first}. {fix}") from e
    return [dict(r) for r in ds]


def load_source(source: str, side: Split, hf_config: str | None = None) -> list[Task]:
    """Tasks of one source spec: ``"builtin"``, a JSONL path, or ``"hf:NAME[@SPLIT]"``."""
    if source.startswith("hf:"):
        name, _, split = source[3:].partition("@")
        rows, where = load_hf(name, split or side, hf_config), source
    else:
        path = builtin_path() if source == BUILTIN else Path(source)
        rows, where = read_records(path), str(path)
    if not rows:
        raise ValueError(f"{where}: no problems found")
    return [record_to_task(r, f"{side}-{i}", f"{where} record {i}") for i, r in enumerate(rows)]


def holdout(tasks: list[Task], num_test: int, seed: int) -> tuple[list[Task], list[Task]]:
    """Split off ``num_test`` tasks, round-robin over families so each is represented.

    >>> ts = [Task(id=str(i), prompt=str(i), answer="0", family="ab"[i % 2]) for i in range(10)]
    >>> train, test = holdout(ts, 4, seed=0)
    >>> len(train), sorted(t.family for t in test)
    (6, ['a', 'a', 'b', 'b'])
    """
    if not 0 <= num_test < len(tasks):
        raise ValueError(f"num_test={num_test} must be >= 0 and below the {len(tasks)} available "
                         "tasks; lower num_test or pass a separate test source")
    rng = random.Random(f"math-holdout-{seed}")
    pools: dict[str, list[int]] = {}
    for i, t in enumerate(tasks):
        pools.setdefault(t.family, []).append(i)
    for pool in pools.values():
        rng.shuffle(pool)
    chosen: list[int] = []
    while len(chosen) < num_test:
        for pool in pools.values():
            if pool and len(chosen) < num_test:
                chosen.append(pool.pop())
    picked = set(chosen)
    return [t for i, t in enumerate(tasks) if i not in picked], [tasks[i] for i in chosen]


def _renumber(tasks: list[Task], side: str) -> list[Task]:
    for i, t in enumerate(tasks):
        t.id = f"{side}-{i}"
    return tasks


class MathEnv:
    """Math problems, a Python tool, and an explained equivalence checker.

    Args:
        train: ``"builtin"``, a JSONL path, or ``"hf:NAME[@SPLIT]"`` (see module docstring).
        test: same; None holds ``num_test`` tasks out of ``train``.
        num_test: held-out size when ``test`` is None.
        seed: fixes the held-out split.
        hf_config: dataset config for ``hf:`` sources (``"main"`` for ``openai/gsm8k``).
        max_train, max_test: keep only the first N tasks of a split.
        answer_tag: the answer tag (None: ``\\boxed{}`` is the prompted format).
        use_tool: False gives the no-tool control (no tools, a prompt without one).
        check_timeout: seconds math-verify may spend per parse/comparison.
        use_math_verify: False keeps numeric and string comparison only.
        system_prompt: replaces the default prompt.
    """

    name = "math"

    def __init__(self, train: str = BUILTIN, test: str | None = None, num_test: int = 20, seed: int = 0,
                 hf_config: str | None = None, max_train: int | None = None, max_test: int | None = None,
                 answer_tag: str | None = "answer", use_tool: bool = True,
                 check_timeout: int = 5, use_math_verify: bool = True, system_prompt: str | None = None):
        self.checker = AnswerChecker(tag=answer_tag, use_math_verify=use_math_verify, timeout=check_timeout)
        self.use_tool = use_tool
        fmt = f"<{answer_tag}></{answer_tag}>, e.g. <{answer_tag}>42</{answer_tag}>" if answer_tag \
            else "\\boxed{}, e.g. \\boxed{42}"
        template = SYSTEM_PROMPT_TOOL if use_tool else SYSTEM_PROMPT_NO_TOOL
        self.system_prompt = system_prompt if system_prompt is not None else template.format(fmt=fmt)
        # for rollout.answer_pattern: a turn without a tool call that matches nothing here is void
        self.answer_pattern = ANSWER_PATTERN if answer_tag in (None, "answer") else \
            ANSWER_PATTERN + f"|<{re.escape(answer_tag)}>.*?</{re.escape(answer_tag)}>"

        # files the tasks come from: hidden from the python tool's sandbox (their answers are in them)
        self.data_paths: tuple[str, ...] = tuple(dict.fromkeys(
            str(builtin_path() if s == BUILTIN else Path(s)) for s in (train, test) if s is not None and not s.startswith("hf:")))
        train_tasks = load_source(train, "train", hf_config)
        if test is None:
            train_tasks, test_tasks = holdout(train_tasks, num_test, seed)
        else:
            test_tasks = load_source(test, "test", hf_config)
            seen = {t.prompt for t in test_tasks}
            train_tasks = [t for t in train_tasks if t.prompt not in seen]
        if max_train is not None:
            train_tasks = train_tasks[:max_train]
        if max_test is not None:
            test_tasks = test_tasks[:max_test]
        if not train_tasks:
            raise ValueError("the train split is empty; check the train source and max_train")
        self._splits = {"train": _renumber(train_tasks, "train"), "test": _renumber(test_tasks, "test")}

    def tools(self) -> list["Tool"]:
        if not self.use_tool:
            return []
        from agentrl.envs.hidden_data import python_tool_hiding  # lazy: the env imports without the tool

        # time limit: the ToolBox's (tools.timeout); the data files are out of the code's reach
        return [python_tool_hiding(self.data_paths, mode="fresh")]

    def tasks(self, split: Split) -> list[Task]:
        return select_split(self._splits, split)

    def score(self, task: Task, messages: list[Message]) -> Score:
        verdict = self.checker.check(messages, task.answer)
        calls = sum(len(m.tool_calls) for m in messages if m.role == "assistant")
        info: dict[str, float | int | bool | str] = dict(verdict.info())
        info.update(family=task.family, used_tool=calls > 0, tool_calls=calls)
        return Score(reward=1.0 if verdict.correct else 0.0, info=info)
