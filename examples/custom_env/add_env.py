"""A custom environment: add two 5-digit numbers with an ``add`` tool.

The walk-through is docs/custom_env.md; train it with ``agentrl train examples/custom_env.yaml``
from the repository root.
"""

import random

from agentrl import tool
from agentrl.env import Score, final_answer, select_split
from agentrl.types import Message, Task, ToolCall


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: first number
        b: second number
    """
    return a + b


class AddEnv:
    name = "add"
    system_prompt = "Add with the add tool, then reply <answer>N</answer>."

    def __init__(self, seed: int = 0, num_train: int = 2000, num_test: int = 100):
        rng = random.Random(seed)
        pairs = {}  # a dict keeps the draw order and drops repeats: the splits are disjoint
        while len(pairs) < num_train + num_test:
            pairs[rng.randint(50000, 99999), rng.randint(50000, 99999)] = None  # every sum has 6 digits
        tasks = [Task(id=f"add-{i}", prompt=f"{a}+{b}=?", answer=str(a + b), metadata={"a": a, "b": b})
                 for i, (a, b) in enumerate(pairs)]
        self._splits = {"test": tasks[:num_test], "train": tasks[num_test:]}

    def tasks(self, split):
        return select_split(self._splits, split)  # a copy; a clear error for an unknown split

    def score(self, task, messages):
        got = final_answer(messages)  # inside the last <answer></answer> of the last assistant turn
        return Score(reward=float(got == task.answer), info={"has_answer": got is not None})

    def tools(self):
        return [add]

    def demonstrations(self, n, seed):
        rng = random.Random(seed)
        out = []
        for _ in range(n):
            task = rng.choice(self._splits["train"])  # never a test task
            a, b = task.metadata["a"], task.metadata["b"]
            out.append([Message("system", self.system_prompt),
                        Message("user", task.prompt),
                        Message("assistant", "", tool_calls=[ToolCall(name="add", arguments={"a": a, "b": b})]),
                        Message("tool", str(add(a, b)), name="add"),  # exactly what the tool returns
                        Message("assistant", f"<answer>{task.answer}</answer>")])
        return out
