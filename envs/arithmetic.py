"""Synthetic arithmetic that a tiny model cannot do in its head but can do with a Python tool.

Each task is one integer expression such as ``4821*367`` or ``(512+88)*47``, drawn from a
*family* (a pattern of operand sizes and operators). Train and test sets come from one
seed, are disjoint by expression, and every family appears in both, round-robin, so a
held-out set of 200 covers every family equally.

A family pattern is an expression whose ``{k}`` placeholders stand for random ``k``-digit
numbers: ``"{4}*{3}"`` is a 4-digit times a 3-digit number. Difficulty is set by passing
your own patterns (``families={"mul_5x5": "{5}*{5}"}``).

Answer format: the last assistant turn ends with ``<answer>N</answer>``; commas, spaces and
underscores inside N are ignored (``1,234`` == ``1234``). An answer that appears only in a
tool result scores 0 (the checker reads the last assistant turn only), and so does a turn
with several different tags or N written in other digits than ASCII ``0-9`` (``４２``):
docs/reward_integrity.md.

Example::

    >>> from agentrl.types import Message
    >>> env = ArithmeticEnv(seed=0, num_train=20, num_test=10)
    >>> task = env.tasks("test")[0]
    >>> done = [Message("user", task.prompt), Message("assistant", f"<answer>{task.answer}</answer>")]
    >>> env.score(task, done).reward
    1.0
"""

from __future__ import annotations

import ast
import random
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentrl.env import Score, Split, final_answer, last_assistant_text, select_split
from agentrl.types import Message, Task, ToolCall

if TYPE_CHECKING:
    from agentrl.toolbox import Tool

# Products and mixed expressions with 3- to 8-digit results: far beyond what a ~1M-parameter
# model computes in its head, trivial for one line of Python. Every default pattern is 9
# characters (9 tokens with the digit-level tiny tokenizer), so copying the expression into
# the code is the same positional shift in every family (see ``answer_width``).
DEFAULT_FAMILIES: dict[str, str] = {
    "mul_5x3": "{5}*{3}",
    "mul_4x4": "{4}*{4}",
    "mul_add": "{2}*{3}+{2}",
    "add_mul": "({2}+{1})*{2}",
    "mul_sub": "{3}*{2}-{2}",
}

SYSTEM_PROMPT = "Compute with the python tool, then reply <answer>N</answer>."
SYSTEM_PROMPT_NO_TOOL = "Reply <answer>N</answer>."

_PLACEHOLDER = re.compile(r"\{(\d+)\}")
_NUMBER = re.compile(r"^-?[0-9]+$")  # ASCII digits only: int("４２") == 42, but that is no answer


@dataclass(frozen=True)
class Problem:
    """One generated expression and its exact value."""

    family: str
    expression: str
    value: int


def evaluate(expression: str) -> int:
    """Exact integer value of an expression of integers, ``+ - *`` and parentheses.

    >>> evaluate("(12+3)*4-5")
    55
    """

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
            a, b = ev(node.left), ev(node.right)
            return a + b if isinstance(node.op, ast.Add) else a - b if isinstance(node.op, ast.Sub) else a * b
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise ValueError(f"unsupported expression element {ast.dump(node)!r}; use integers, + - * and ()")

    return ev(ast.parse(expression, mode="eval").body)


def sample_expression(pattern: str, rng: random.Random) -> str:
    """Fill every ``{k}`` of a family pattern with a random ``k``-digit number (no leading 0).

    >>> len(sample_expression("{4}*{3}", random.Random(0)))
    8
    """

    def fill(m: re.Match) -> str:
        k = int(m.group(1))
        if k < 1:
            raise ValueError(f"pattern {pattern!r}: a placeholder needs at least 1 digit, got {{{k}}}")
        return str(rng.randint(10 ** (k - 1), 10**k - 1))

    return _PLACEHOLDER.sub(fill, pattern)


def parse_integer(text: str | None) -> int | None:
    """The integer an answer string denotes, tolerating commas, spaces and underscores.

    >>> parse_integer(" 1,234 "), parse_integer("12a"), parse_integer("４２")
    (1234, None, None)
    """
    if text is None:
        return None
    cleaned = re.sub(r"[\s,_]", "", text)
    if cleaned.endswith("."):
        cleaned = cleaned[:-1]
    return int(cleaned) if _NUMBER.match(cleaned) else None


ANSWER_MODES = ("tag", "last_number")
_LAST_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?", re.ASCII)


def last_number(text: str | None) -> str | None:
    """The last number written in ``text`` (an integral float such as ``31395.0`` as an integer).

    >>> last_number("so 53*59 = 3,127."), last_number("31395.0 it is"), last_number("none")
    ('3127', '31395', None)
    """
    found = _LAST_NUMBER.findall(text or "")
    if not found:
        return None
    raw = found[-1].replace(",", "")
    if "." in raw:
        whole, frac = raw.split(".")
        return whole if set(frac) == {"0"} else raw
    return raw


class ArithmeticEnv:
    """Integer arithmetic tasks scored by exact match; the agent gets a Python tool.

    Args:
        seed: fixes both splits (same seed, same tasks).
        num_train, num_test: split sizes; test is drawn first, train skips its expressions.
        families: name -> pattern (see module docstring); defaults to ``DEFAULT_FAMILIES``.
        use_tool: False gives the control condition: no tools offered, a system prompt
            that does not mention one.
        answer_width: demonstrations print the result zero-padded to this many digits
            (``print(str(x).zfill(8))``) and copy it as is (``<answer>00045408</answer>``,
            which the checker reads as 45408). Why: a ~1M-parameter model learns to copy
            a number in ~100 SFT steps when source and copy are always the same distance
            apart, but needs thousands when the distance varies with the number's
            length. None prints plainly. Only the demonstrations use it; the checker
            accepts any formatting of the right integer.
        system_prompt: replaces the default one (e.g. a one-shot example of the code_block
            format for a real instruct model; see examples/smollm2_tir.yaml).
        prompt_format: the user turn, ``{expression}`` standing for the expression.
        answer: "tag" reads ``<answer>N</answer>``; "last_number" reads the last number of the
            last assistant turn, the way papers score small instruct models that never write
            tags. Either way only the model's own text counts (code_block outputs are not in it).
    """

    name = "arithmetic"

    def __init__(self, seed: int = 0, num_train: int = 5000, num_test: int = 200,
                 families: dict[str, str] | None = None, use_tool: bool = True,
                 answer_width: int | None = 8, system_prompt: str | None = None,
                 prompt_format: str = "{expression}=?", answer: str = "tag"):
        self.families = dict(families if families is not None else DEFAULT_FAMILIES)
        if not self.families:
            raise ValueError("families is empty; pass at least one, e.g. {'mul_4x3': '{4}*{3}'}")
        for name, pattern in self.families.items():
            if not _PLACEHOLDER.search(pattern):
                raise ValueError(f"family {name!r}: pattern {pattern!r} has no {{k}} placeholder")
            evaluate(_PLACEHOLDER.sub("1", pattern))  # fail now on a malformed pattern
        if num_train < 0 or num_test < 0:
            raise ValueError("num_train and num_test must be >= 0")
        self.seed = seed
        self.use_tool = use_tool
        if answer_width is not None and answer_width < 1:
            raise ValueError(f"answer_width={answer_width}; use a positive width or None")
        self.answer_width = answer_width
        self.system_prompt = system_prompt or (SYSTEM_PROMPT if use_tool else SYSTEM_PROMPT_NO_TOOL)
        if "{expression}" not in prompt_format:
            raise ValueError(f"prompt_format={prompt_format!r} must hold {{expression}}, e.g. 'What is {{expression}}?'")
        self.prompt_format = prompt_format
        if answer not in ANSWER_MODES:
            raise ValueError(f"answer={answer!r}: use one of {ANSWER_MODES}")
        self.answer = answer
        test = self._draw(num_test, random.Random(f"arith-test-{seed}"), exclude=set())
        train = self._draw(num_train, random.Random(f"arith-train-{seed}"),
                           exclude={p.expression for p in test})
        self._splits: dict[str, list[Task]] = {
            "test": [self._task("test", i, p) for i, p in enumerate(test)],
            "train": [self._task("train", i, p) for i, p in enumerate(train)],
        }

    # -- Environment protocol ------------------------------------------------------------

    def tools(self) -> list["Tool"]:
        if not self.use_tool:
            return []
        from agentrl.tools.python import python_tool  # lazy: the env imports without the tool

        return [python_tool(mode="fresh")]  # time limit: the ToolBox's (tools.timeout)

    def tasks(self, split: Split) -> list[Task]:
        return select_split(self._splits, split)

    def score(self, task: Task, messages: list[Message]) -> Score:
        got = final_answer(messages) if self.answer == "tag" else last_number(last_assistant_text(messages))
        value = parse_integer(got)
        calls = sum(len(m.tool_calls) for m in messages if m.role == "assistant")
        correct = value is not None and str(value) == task.answer
        return Score(reward=1.0 if correct else 0.0,
                     info={"family": task.family, "has_answer": got is not None,
                           "used_tool": calls > 0, "tool_calls": calls})

    # -- demonstrations for the warm start -----------------------------------------------

    def demonstrations(self, n: int, seed: int) -> list[list[Message]]:
        """``n`` correct conversations in the exact shape a rollout produces.

        system, user, assistant calling ``python(code="print(str(<expr>).zfill(8))")``
        (``print(<expr>)`` when ``answer_width`` is None), the tool's exact stdout,
        assistant ``<answer>N</answer>`` with N copied from it. Drawn from the train split only (never
        a test expression), cycling through the families.

        >>> env = ArithmeticEnv(seed=0, num_train=10, num_test=5)
        >>> [m.role for m in env.demonstrations(1, seed=0)[0]]
        ['system', 'user', 'assistant', 'tool', 'assistant']
        """
        by_family: dict[str, list[Task]] = {f: [] for f in self.families}
        for t in self._splits["train"]:
            by_family[t.family].append(t)
        pools = [pool for pool in by_family.values() if pool]
        if n > 0 and not pools:
            raise ValueError("demonstrations need train tasks; construct the env with num_train > 0")
        rng = random.Random(f"arith-demo-{self.seed}-{seed}")
        out = []
        for i in range(n):
            task = rng.choice(pools[i % len(pools)])
            out.append(self.demonstration(task))
        return out

    def demonstration(self, task: Task) -> list[Message]:
        """The ideal conversation for one task (tool call, exact stdout, copied answer)."""
        expr = task.metadata["expression"]
        head = [Message("system", self.system_prompt), Message("user", task.prompt)]
        shown = task.answer if self.answer_width is None else task.answer.zfill(self.answer_width)
        if not self.use_tool:
            return [*head, Message("assistant", f"<answer>{shown}</answer>")]
        code = f"print({expr})" if self.answer_width is None else f"print(str({expr}).zfill({self.answer_width}))"
        call = ToolCall(name="python", arguments={"code": code})
        return [*head,
                Message("assistant", "", tool_calls=[call]),
                Message("tool", f"{shown}\n", name="python"),
                Message("assistant", f"<answer>{shown}</answer>")]

    # -- generation ----------------------------------------------------------------------

    def _draw(self, n: int, rng: random.Random, exclude: set[str]) -> list[Problem]:
        names = list(self.families)
        seen = set(exclude)
        out: list[Problem] = []
        misses = 0
        while len(out) < n:
            family = names[len(out) % len(names)]  # round-robin: every family in every split
            expr = sample_expression(self.families[family], rng)
            if expr in seen:
                misses += 1
                if misses > 100 * (n + 10):
                    raise ValueError(f"family {family!r} has too few distinct expressions for "
                                     f"{n} tasks; use more digits or fewer tasks")
                continue
            seen.add(expr)
            out.append(Problem(family, expr, evaluate(expr)))
        return out

    def _task(self, split: str, i: int, p: Problem) -> Task:
        return Task(id=f"{split}-{i}", prompt=self.prompt_format.format(expression=p.expression), answer=str(p.value),
                    family=p.family, metadata={"expression": p.expression})
