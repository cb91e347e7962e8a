"""The task and the tool shared by ``tool_step.py`` (agentrl) and ``trl_tool_step.py`` (TRL).

One plain in-process Python function, ``multiply``, is the tool on both sides: TRL gets the
function itself (``GRPOTrainer(tools=[multiply])``), agentrl wraps the same function in a
:class:`agentrl.toolbox.Tool` whose JSON schema is the one transformers derives from it
(``transformers.utils.get_json_schema``, what TRL's chat template renders), so both sides
show the model byte-identical prompts. No sandbox, no sleep.

Task: "What is A times B?" with A, B in 10..999; the ideal answer calls ``multiply(a=A, b=B)``
and copies the result into ``<answer>A*B</answer>``. This module imports neither torch nor
agentrl at import time (the TRL process imports it too).
"""

from __future__ import annotations

import random
import re

# No tag strings in the system prompt: agentrl encodes message text literally while TRL's
# tokenizer call would turn "<answer>" into the added tag token; without them the prompt ids
# are the same on both sides.
SYSTEM_PROMPT = "Call the multiply tool on the two numbers, then give its result as the final answer."
USER_FORMAT = "What is {a} times {b}?"
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def multiply(a: int, b: int):
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return str(int(a) * int(b))


def make_tasks(n: int, seed: int) -> list[dict]:
    """``n`` deterministic tasks: ``{"id", "a", "b", "prompt", "answer"}``."""
    rng = random.Random(f"tool-step-{seed}")
    out = []
    for i in range(n):
        a, b = rng.randint(10, 999), rng.randint(10, 999)
        out.append({"id": f"m{seed}-{i}", "a": a, "b": b, "prompt": USER_FORMAT.format(a=a, b=b),
                    "answer": str(a * b)})
    return out


def answer_of(text: str | None) -> str | None:
    """The text inside the last ``<answer>...</answer>``, stripped (agentrl's ``final_answer``)."""
    found = _ANSWER.findall(text or "")
    return found[-1].strip() if found else None


class MultiplyEnv:
    """agentrl environment over :func:`make_tasks` (``env.name: tool_task:MultiplyEnv``)."""

    name = "multiply"
    system_prompt = SYSTEM_PROMPT
    answer_pattern = r"<answer>.*?</answer>"

    def __init__(self, seed: int = 0, num_train: int = 400, num_test: int = 16):
        from agentrl.types import Task

        tasks = [Task(id=t["id"], prompt=t["prompt"], answer=t["answer"], metadata={"a": t["a"], "b": t["b"]})
                 for t in make_tasks(num_train + num_test, seed)]
        self._splits = {"train": tasks[:num_train], "test": tasks[num_train:]}
        self.seed = seed

    def tools(self):
        from transformers.utils import get_json_schema

        from agentrl.toolbox import Tool

        fn = get_json_schema(multiply)["function"]
        return [Tool(multiply, description=fn["description"], parameters=fn["parameters"])]

    def tasks(self, split: str):
        return list(self._splits[split])

    def score(self, task, messages):
        from agentrl.env import Score, final_answer

        calls = sum(len(m.tool_calls) for m in messages if m.role == "assistant")
        return Score(reward=float(final_answer(messages) == task.answer), info={"tool_calls": calls})

    def demonstrations(self, n: int, seed: int):
        """Correct conversations: system, user, assistant tool call, tool result, answer."""
        from agentrl.types import Message, ToolCall

        rng = random.Random(f"tool-step-demo-{self.seed}-{seed}")
        out = []
        for _ in range(n):
            t = rng.choice(self._splits["train"])
            a, b = t.metadata["a"], t.metadata["b"]
            out.append([Message("system", self.system_prompt), Message("user", t.prompt),
                        Message("assistant", "", tool_calls=[ToolCall(name="multiply", arguments={"a": a, "b": b})]),
                        Message("tool", multiply(a, b), name="multiply"),
                        Message("assistant", f"<answer>{t.answer}</answer>")])
        return out
