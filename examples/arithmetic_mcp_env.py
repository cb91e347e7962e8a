"""Multiply two 3-digit numbers with the ``calculate`` tool of an MCP server.

The environment offers no tool of its own: the run's ``tools.mcp`` gives the agent
mcp-server-calculator's ``calculate`` (examples/arithmetic_mcp_tiny.yaml; docs/mcp.md). Its
demonstrations for the warm start show the exact call and the exact text the server answers
(``calculate(expression="512*734")`` -> ``375808``), so the tiny model learns the call format
before GRPO teaches it to rely on the tool. Every product has 6 digits (both factors are at
least 317), so copying the result is the same shift in every task.

    >>> env = MulMcpEnv(seed=0, num_train=20, num_test=5)
    >>> demo = env.demonstrations(1, seed=0)[0]
    >>> [m.role for m in demo], demo[2].tool_calls[0].name
    (['system', 'user', 'assistant', 'tool', 'assistant'], 'calculate')
    >>> env.score(env.tasks("test")[0], demo[:2] + [demo[4]]).reward   # another task's answer
    0.0
"""

import random

from agentrl.env import Score, final_answer, select_split
from agentrl.types import Message, Task, ToolCall


class MulMcpEnv:
    name = "mul_mcp"
    system_prompt = "Compute with the calculate tool, then reply <answer>N</answer>."

    def __init__(self, seed: int = 0, num_train: int = 2000, num_test: int = 100):
        rng = random.Random(seed)
        pairs = {}  # a dict keeps the draw order and drops repeats: the splits are disjoint
        while len(pairs) < num_train + num_test:
            pairs[rng.randint(317, 999), rng.randint(317, 999)] = None  # every product has 6 digits
        tasks = [Task(id=f"mul-{i}", prompt=f"{a}*{b}=?", answer=str(a * b), metadata={"expression": f"{a}*{b}"})
                 for i, (a, b) in enumerate(pairs)]
        self._splits = {"test": tasks[:num_test], "train": tasks[num_test:]}

    def tasks(self, split):
        return select_split(self._splits, split)

    def score(self, task, messages):
        got = final_answer(messages)  # the last assistant turn's <answer>; tool output never counts
        calls = sum(len(m.tool_calls) for m in messages if m.role == "assistant")
        return Score(reward=float(got == task.answer), info={"has_answer": got is not None, "used_tool": calls > 0})

    def tools(self):
        return []  # the calculator comes from tools.mcp

    def demonstrations(self, n, seed):
        rng = random.Random(seed)
        out = []
        for _ in range(n):
            task = rng.choice(self._splits["train"])  # never a test task
            call = ToolCall(name="calculate", arguments={"expression": task.metadata["expression"]})
            out.append([Message("system", self.system_prompt),
                        Message("user", task.prompt),
                        Message("assistant", "", tool_calls=[call]),
                        Message("tool", task.answer, name="calculate"),  # what mcp-server-calculator answers
                        Message("assistant", f"<answer>{task.answer}</answer>")])
        return out
