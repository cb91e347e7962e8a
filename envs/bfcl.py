"""The Berkeley Function Calling Leaderboard (BFCL v4), single-turn Python categories.

Each task is one BFCL question with its own functions: ``simple_python`` (one function, one
call), ``multiple`` (several functions, call the right one), ``parallel`` (one function, several
calls), ``parallel_multiple`` (several functions, several calls) and ``irrelevance`` (no
function fits: the answer is no call). The model's function calls *are* the answer; nothing is
executed. The reward is 1 when BFCL's AST checker would accept the calls of the model's reply
(re-implemented in :mod:`agentrl.envs.bfcl_check`, cross-checked against BFCL's own in
docs/bfcl.md), else 0.

Why the attempts are run by an agent (``HasAgent``): every task comes with its own function
schemas, while ``Environment.tools()`` is one list for the whole run. The OpenAI API carries
tools per request, so :meth:`BFCLEnv.agent` sends the task's question with the task's
functions as ``tools=`` to the trainer's endpoint, once, exactly as BFCL queries a
function-calling model, and returns: the attempt is that one reply, which the endpoint parses
into tool calls with the model's own chat template. No tool runs, no ``max_turns`` is needed,
and the checker reads the calls of the last (only) assistant message.

The functions are shown as BFCL shows them to OpenAI-style models (``convert_to_tool``): dots in
names become underscores (``math.factorial`` -> ``math_factorial``; the checker maps them back),
BFCL's types become JSON schema types (``dict`` -> ``object``, ``float`` -> ``number`` with
``"format": "float"``, ``tuple`` -> ``array``, ``any`` -> ``string``) and each description
ends with "Note that the provided function is in Python 3 syntax."

Data: the ``bfcl-eval`` package's files (``pip install --no-deps bfcl-eval==2026.3.23``; its
dependencies serve its own model runners and are not needed), or ``data_dir``: a folder with
``BFCL_v4_<category>.json`` and ``possible_answer/BFCL_v4_<category>.json`` (JSON Lines).
The split is seeded and stratified: each category gives ``test_fraction`` of its questions to
``test``, the rest to ``train``.

Example (with bfcl-eval installed)::

    >>> from agentrl.types import Message, ToolCall
    >>> env = BFCLEnv(categories=["simple_python"], seed=0)   # doctest: +SKIP
    >>> task = env.tasks("test")[0]                             # doctest: +SKIP
    >>> task.id, [t["function"]["name"] for t in task.metadata["tools"]]   # doctest: +SKIP
    ('simple_python_229', ['get_bigfive_scores'])
    >>> call = ToolCall("get_bigfive_scores", {"characteristics": ["efficient", "organized", "easy going",
    ...                                                           "compassionate"]})
    >>> env.score(task, [Message("user", task.prompt), Message("assistant", "", tool_calls=[call])]).reward   # doctest: +SKIP
    1.0
"""

from __future__ import annotations

import copy
import importlib.util
import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.env import Score, Split, select_split
from agentrl.envs.bfcl_check import check, tool_name
from agentrl.types import ConfigError, Message, Task

if TYPE_CHECKING:
    from agentrl.toolbox import Tool

CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance")
_ALIASES = {"simple": "simple_python"}
INSTALL_HINT = ("pip install --no-deps bfcl-eval==2026.3.23 (--no-deps: its dependencies are for its own model "
                "runners), or set env.args.data_dir to a folder holding BFCL_v4_<category>.json and possible_answer/")

# BFCL's GORILLA_TO_OPENAPI for the Python categories: its type names -> JSON schema types
_JSON_TYPES = {"integer": "integer", "number": "number", "float": "number", "string": "string",
               "boolean": "boolean", "bool": "boolean", "array": "array", "list": "array", "dict": "object",
               "object": "object", "tuple": "array", "any": "string"}
_PYTHON_HINT = " Note that the provided function is in Python 3 syntax."


def default_data_dir() -> Path:
    """The data folder of the installed ``bfcl-eval`` package (found without importing it: its
    ``__init__`` would need the dependencies a ``--no-deps`` install leaves out)."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or spec.origin is None:
        raise ConfigError(f"the bfcl environment reads BFCL's data from the bfcl-eval package, which is not installed: "
                          f"{INSTALL_HINT}")
    return Path(spec.origin).parent / "data"


def to_tool_schema(function: dict) -> dict:
    """A BFCL function document as an OpenAI tool schema, the way BFCL converts it for
    function-calling models (see the module docstring).

    >>> to_tool_schema({"name": "math.hypot", "description": "Norm.", "parameters": {"type": "dict",
    ...     "properties": {"x": {"type": "float", "description": "x."}}, "required": ["x"]}})["function"]
    {'name': 'math_hypot', 'description': 'Norm. Note that the provided function is in Python 3 syntax.', \
'parameters': {'type': 'object', 'properties': {'x': {'type': 'number', 'description': 'x. This is a float type \
value.', 'format': 'float'}}, 'required': ['x']}}
    """
    fn = copy.deepcopy(function)
    params = fn.get("parameters", {})
    params["type"] = "object"
    params["properties"] = _cast_properties(params.get("properties", {}))
    return {"type": "function", "function": {"name": tool_name(fn["name"]),
                                             "description": fn.get("description", "") + _PYTHON_HINT,
                                             "parameters": params}}


def _cast_properties(props: dict) -> dict:
    """BFCL's ``_cast_to_openai_type``: types mapped (unknown ones to string), nested
    properties and item types too."""
    for prop in props.values():
        kind = prop.get("type")
        if kind == "float":
            prop["format"] = "float"
            prop["description"] = prop.get("description", "") + " This is a float type value."
        prop["type"] = _JSON_TYPES.get(kind, "string")
        if prop["type"] in ("array", "object"):
            if "properties" in prop:
                prop["properties"] = _cast_properties(prop["properties"])
            elif "items" in prop:
                items = prop["items"]
                items["type"] = _JSON_TYPES.get(items.get("type"), "string")
                if items["type"] == "array" and "items" in items:
                    items["items"]["type"] = _JSON_TYPES.get(items["items"].get("type"), "string")
                elif items["type"] == "object" and "properties" in items:
                    items["properties"] = _cast_properties(items["properties"])
    return props


def _round_robin(lists: list[list[Task]]) -> list[Task]:
    """One of each list in turn, until all are used up."""
    out: list[Task] = []
    for i in range(max(map(len, lists), default=0)):
        out += [tasks[i] for tasks in lists if i < len(tasks)]
    return out


def _read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_category(data_dir: Path, category: str) -> list[dict]:
    """The rows of one category, each with its ``ground_truth`` (None for irrelevance)."""
    questions = data_dir / f"BFCL_v4_{category}.json"
    if not questions.is_file():
        raise ConfigError(f"no BFCL data for category {category!r}: {questions} does not exist; {INSTALL_HINT}")
    rows = _read_jsonl(questions)
    if category == "irrelevance":
        return [dict(r, ground_truth=None) for r in rows]
    answers_path = data_dir / "possible_answer" / f"BFCL_v4_{category}.json"
    if not answers_path.is_file():
        raise ConfigError(f"BFCL category {category!r} has no possible answers at {answers_path}")
    answers = {a["id"]: a["ground_truth"] for a in _read_jsonl(answers_path)}
    missing = [r["id"] for r in rows if r["id"] not in answers]
    if missing:
        raise ConfigError(f"{answers_path} has no possible answer for {len(missing)} questions, e.g. {missing[0]!r}")
    return [dict(r, ground_truth=answers[r["id"]]) for r in rows]


class BFCLEnv:
    """BFCL v4 single-turn tasks, scored by BFCL's AST-matching rules (module docstring).

    Args:
        categories: any of ``CATEGORIES`` (``simple`` is ``simple_python``); default all five.
        data_dir: a folder of BFCL files; default the installed ``bfcl-eval`` package's.
        seed: fixes the split.
        test_fraction: the share of each category's questions held out in ``test``.
        system_prompt: sent before the question ("": none, as BFCL sends function-calling models).
    """

    name = "bfcl"

    def __init__(self, categories: list[str] | None = None, data_dir: str | None = None, seed: int = 0,
                 test_fraction: float = 0.2, system_prompt: str = ""):
        chosen = [_ALIASES.get(c, c) for c in (categories or CATEGORIES)]
        unknown = [c for c in chosen if c not in CATEGORIES]
        if unknown:
            raise ConfigError(f"unknown BFCL categories {unknown}; choose from {', '.join(CATEGORIES)} "
                              "(the single-turn Python ones)")
        if not 0 <= test_fraction <= 1:
            raise ConfigError(f"test_fraction={test_fraction}: use a share in [0, 1]")
        self.categories = list(dict.fromkeys(chosen))
        self.system_prompt = system_prompt
        root = Path(data_dir) if data_dir is not None else default_data_dir()
        per_split: dict[str, list[list[Task]]] = {"train": [], "test": []}
        for category in self.categories:
            rows = load_category(root, category)
            random.Random(f"bfcl-{seed}-{category}").shuffle(rows)
            n_test = round(test_fraction * len(rows))
            per_split["test"].append([self._task(category, r) for r in rows[:n_test]])
            per_split["train"].append([self._task(category, r) for r in rows[n_test:]])
        # categories interleaved: the first eval.num_tasks of test cover every category
        self._splits = {split: _round_robin(lists) for split, lists in per_split.items()}

    # -- Environment protocol ------------------------------------------------------------

    def tools(self) -> list["Tool"]:
        """None for the run as a whole: each task's functions travel with its request (``agent``)."""
        return []

    def tasks(self, split: Split) -> list[Task]:
        return select_split(self._splits, split)

    async def agent(self, client: Any, task: Task) -> None:
        """One request: the question and the task's functions as ``tools``. The endpoint's reply
        is the attempt (None: the captured reply stands as the last assistant message)."""
        head = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        await client.chat.completions.create(model="agentrl", messages=head + task.metadata["messages"],
                                             tools=task.metadata["tools"])
        return None

    def score(self, task: Task, messages: list[Message]) -> Score:
        """BFCL's verdict on the tool calls of the last assistant message (the model's reply)."""
        reply = next((m for m in reversed(messages) if m.role == "assistant"), None)
        calls = [(c.name, c.arguments) for c in reply.tool_calls] if reply is not None else []
        meta = task.metadata
        result = check(meta["category"], meta["functions"], meta["possible_answer"], calls)
        return Score(reward=1.0 if result.valid else 0.0,
                     info={"category": meta["category"], "valid": result.valid, "error_type": result.error_type,
                           "calls": len(calls)})

    # -- data ----------------------------------------------------------------------------

    @staticmethod
    def _task(category: str, row: dict) -> Task:
        turn = row["question"][0]  # single-turn: one list of messages (one user message in v4)
        prompt = "\n".join(m["content"] for m in turn if m["role"] == "user")
        return Task(id=row["id"], prompt=prompt, answer=json.dumps(row["ground_truth"]), family=category,
                    metadata={"category": category, "functions": row["function"],
                              "tools": [to_tool_schema(f) for f in row["function"]],
                              "possible_answer": row["ground_truth"], "messages": turn})
