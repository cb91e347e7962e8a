"""An agent written against the OpenAI API, trained unchanged by agentrl.

``solve`` is ordinary agent code: it talks to whatever ``client`` it is given (here the
trainer's endpoint; in production any OpenAI-compatible server), offers one function tool
of its own (``calculate``, a safe arithmetic evaluator, run in-process by the agent), loops
until the model answers, and returns the answer. It imports nothing from agentrl.

``ArithmeticAgentEnv`` is the environment the trainer sees: the arithmetic tasks and
checker, the warm-start demonstrations (they teach the tiny model the call format the agent
offers), and ``agent = solve``. Train it with::

    agentrl train examples/openai_agent_tiny.yaml

Run the agent against a checkpoint instead (``agentrl serve runs/openai-agent-tiny/final``
in another shell)::

    python examples/openai_agent.py http://127.0.0.1:8000/v1
"""

from __future__ import annotations

import ast
import asyncio
import json
import operator
import sys

SYSTEM = "Compute with the python tool, then reply <answer>N</answer>."
# The tool the agent offers, in the OpenAI format. Its name and parameter match the
# arithmetic environment's python tool, which the warm-start demonstrations call.
TOOLS = [{"type": "function", "function": {
    "name": "python",
    "description": "Run Python code and return what it printed.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "Python source code to run."}},
                   "required": ["code"], "additionalProperties": False}}}]

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Mod: operator.mod, ast.USub: operator.neg, ast.UAdd: operator.pos}


def calculate(code: str) -> str:
    """The agent's own tool: ``print(<integer expression>)``, optionally
    ``print(str(<expr>).zfill(k))``, evaluated without running arbitrary code.

    >>> calculate("print(str(12*34).zfill(8))")
    '00000408\\n'

    Args:
        code: Python source code to run.
    """

    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "str" and len(node.args) == 1:
            return str(value(node.args[0]))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "zfill"
                and len(node.args) == 1):
            return str(value(node.func.value)).zfill(value(node.args[0]))
        raise ValueError(f"unsupported: {ast.unparse(node)[:60]}")

    try:
        tree = ast.parse(code.strip(), mode="exec")
        out = []
        for stmt in tree.body:
            call = stmt.value if isinstance(stmt, ast.Expr) else None
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "print"):
                raise ValueError("only print(...) statements are supported")
            out.append(" ".join(str(value(a)) for a in call.args))
        return "".join(line + "\n" for line in out)
    except (SyntaxError, ValueError, TypeError, ZeroDivisionError, RecursionError, OverflowError) as e:
        return f"Error: {type(e).__name__}: {e}"


async def solve(client, task, max_rounds: int = 3) -> str | None:
    """Ask, run the tool calls the model makes, repeat; return the final answer text."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task.prompt}]
    for _ in range(max_rounds):
        reply = await client.chat.completions.create(model="agentrl", messages=messages, tools=TOOLS)
        msg = reply.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            return msg.content
        for call in msg.tool_calls:
            args = json.loads(call.function.arguments or "{}")
            result = calculate(args.get("code", "")) if call.function.name == "python" else "Error: unknown tool"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return None


class ArithmeticAgentEnv:
    """The arithmetic environment, with its attempts run by ``solve`` (see the module docstring)."""

    name = "arithmetic-openai-agent"

    def __init__(self, **args):
        from agentrl.envs.arithmetic import ArithmeticEnv

        self._env = ArithmeticEnv(**args)
        self.system_prompt = self._env.system_prompt
        self.answer_pattern = r"<answer>.*?</answer>"

    async def agent(self, client, task):
        return await solve(client, task)

    def tools(self):
        """What the warm start renders into the demonstrations' prompts: ``calculate`` as the
        ``python`` tool, with exactly the schema the agent sends (``TOOLS``)."""
        from agentrl.toolbox import tool

        return [tool(calculate, name="python", description=TOOLS[0]["function"]["description"])]

    def tasks(self, split):
        return self._env.tasks(split)

    def score(self, task, messages):
        return self._env.score(task, messages)

    def demonstrations(self, n: int, seed: int):
        return self._env.demonstrations(n, seed)


if __name__ == "__main__":  # the agent against any OpenAI-compatible server
    import openai

    class _Task:
        prompt = sys.argv[2] if len(sys.argv) > 2 else "Compute 4821*367."

    print(asyncio.run(solve(openai.AsyncOpenAI(base_url=sys.argv[1], api_key="unused"), _Task())))
