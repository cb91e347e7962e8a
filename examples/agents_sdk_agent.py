"""An OpenAI Agents SDK agent, with the SDK's default model class (``OpenAIResponsesModel``:
the Responses API), trained unchanged by agentrl.

``solve`` is ordinary Agents SDK code: an ``Agent`` with instructions and one function tool
(``python``, the safe arithmetic evaluator of ``openai_agent.py``), run by ``Runner.run``
against whatever client it is given (here the trainer's endpoint; in production OpenAI or any
Responses-compatible server). It imports nothing from agentrl. Two settings, both the SDK's
own:

- ``model="agentrl"``, a name of its own: for its default model name (a gpt-5) the SDK adds
  ``text.verbosity: "low"`` to every request, which the endpoint refuses (400: the chat
  template is rendered as in training, without a verbosity setting). Any name that is not a
  gpt-5 one does; the endpoint answers every name with the run's model.
- ``set_tracing_disabled(True)``: else the SDK exports traces to OpenAI, with a warning for
  every run when there is no ``OPENAI_API_KEY``.

``AgentsSDKArithmeticEnv`` is the environment the trainer sees: the arithmetic tasks,
checker and warm-start demonstrations of ``openai_agent.py``, with the tool's schema exactly
as the SDK sends it (the warm start teaches the tiny model that prompt), and ``agent = solve``.
Train it with (``pip install 'agentrl[agents]'``)::

    agentrl train examples/agents_sdk_tiny.yaml

Run the agent against a checkpoint instead (``agentrl serve runs/agents-sdk-tiny/final`` in
another shell)::

    python examples/agents_sdk_agent.py http://127.0.0.1:8000/v1
"""

from __future__ import annotations

import asyncio
import sys

import agents

from openai_agent import SYSTEM, ArithmeticAgentEnv, calculate

agents.set_tracing_disabled(True)


@agents.function_tool
def python(code: str) -> str:
    """Run Python code and return what it printed.

    Args:
        code: Python source code to run.
    """
    return calculate(code)


async def solve(client, task, max_turns: int = 3) -> str | None:
    """Run the agent on the task's prompt; its final output, or None when the model did not
    finish: it ran out of turns, or the SDK refused what it wrote (``ModelBehaviorError``: a
    reply cut at the token limit, a call to an unknown tool). Those are the model's failures,
    not the agent's: the endpoint's last reply stands and the checker scores it (no answer:
    reward 0), where raising would count the attempt as an agent error (``agent/errors``)."""
    model = agents.OpenAIResponsesModel(model="agentrl", openai_client=client)
    solver = agents.Agent(name="solver", instructions=SYSTEM, tools=[python], model=model)
    try:
        result = await agents.Runner.run(solver, task.prompt, max_turns=max_turns)
    except (agents.MaxTurnsExceeded, agents.ModelBehaviorError):
        return None
    return result.final_output


class AgentsSDKArithmeticEnv(ArithmeticAgentEnv):
    """The arithmetic environment, with its attempts run by the Agents SDK agent ``solve``."""

    name = "arithmetic-agents-sdk"

    async def agent(self, client, task):
        return await solve(client, task)

    def tools(self):
        """What the warm start renders into the demonstrations' prompts: the ``python`` tool
        with the schema and description the SDK sends (``params_json_schema``)."""
        from agentrl.toolbox import Tool

        return [Tool(calculate, name=python.name, description=python.description, parameters=python.params_json_schema)]


if __name__ == "__main__":  # the agent against any Responses-compatible server
    import openai

    class _Task:
        prompt = sys.argv[2] if len(sys.argv) > 2 else "Compute 4821*367."

    print(asyncio.run(solve(openai.AsyncOpenAI(base_url=sys.argv[1], api_key="unused"), _Task())))
