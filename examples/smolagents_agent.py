"""smolagents' ``ToolCallingAgent``, as shipped, run inside agentrl's training loop.

``solve`` is ordinary smolagents code: a ``ToolCallingAgent`` with one ``@tool`` (``python``,
the safe arithmetic evaluator of ``openai_agent.py``) over an ``OpenAIServerModel`` pointed at
whatever OpenAI-compatible server it is given (here the attempt's ``base_url`` on the
trainer's endpoint). It imports nothing from agentrl. What a user sets:

- ``api_base``: the attempt's URL, ``str(client.base_url)`` (smolagents builds its own
  client; the one agentrl hands over is used only for its URL).
- A thread: smolagents is synchronous, so ``agent.run`` runs in a thread of the
  environment's own pool (``asyncio``'s default pool has only a few workers; every attempt of
  a step runs at once). An attempt that runs over ``agent.timeout_s`` is recorded as timed
  out, but its thread runs on to ``max_steps``: keep ``max_steps`` small.
- ``rollout.max_total_tokens``: smolagents' system prompt alone is about 1,800 tokens of the
  tiny model's tokenizer, so the context must hold that and the steps (4096 here).

What smolagents sends, and what the endpoint does with it: every step is
``tool_choice: "required"`` (a forced call: the format's call opening is written into the
turn, mask 0, the model samples the rest), the answer is a ``final_answer`` call, and the
next step re-sends the model's call as assistant text (``Calling tools: [...]``) with the
result as a user ``Observation:`` message. That history is not the turn that was sampled, so
each step is a segment of its own (``agent/splits`` about one per step; docs/openai_agents.md,
"Token capture"); every segment carries the attempt's reward.

``SmolagentsArithmeticEnv`` is the environment the trainer sees: the arithmetic tasks and
checker, and ``agent = solve``. The tiny model is not warm-started on smolagents' protocol
(its demonstrations would have to be smolagents' 1,800-token prompt and its ``final_answer``
calls), so ``examples/smolagents_tiny.yaml`` shows the loop runs, not that the model learns::

    pip install smolagents
    agentrl train examples/smolagents_tiny.yaml
"""

from __future__ import annotations

import asyncio
import sys
from concurrent.futures import ThreadPoolExecutor

from smolagents import LogLevel, OpenAIServerModel, ToolCallingAgent, tool

from openai_agent import ArithmeticAgentEnv, calculate

_THREADS = ThreadPoolExecutor(max_workers=256, thread_name_prefix="smolagents")


@tool
def python(code: str) -> str:
    """Run Python code and return what it printed.

    Args:
        code: Python source code to run.
    """
    return calculate(code)


def run_agent(base_url: str, prompt: str, max_steps: int = 3) -> str | None:
    """smolagents as shipped; the final answer, or None when the model gave none in ``max_steps``."""
    model = OpenAIServerModel(model_id="agentrl", api_base=base_url, api_key="agentrl",
                              client_kwargs={"max_retries": 0})
    agent = ToolCallingAgent(tools=[python], model=model, max_steps=max_steps, verbosity_level=LogLevel.OFF)
    result = agent.run(prompt, return_full_result=True)
    return str(result.output) if result.state == "success" else None


async def solve(client, task) -> str | None:
    answer = await asyncio.get_running_loop().run_in_executor(_THREADS, run_agent, str(client.base_url), task.prompt)
    # The checker reads <answer>N</answer>; smolagents' answer is final_answer's argument.
    return None if answer is None else f"<answer>{answer}</answer>"


class SmolagentsArithmeticEnv(ArithmeticAgentEnv):
    """The arithmetic environment, with its attempts run by smolagents' ``ToolCallingAgent``."""

    name = "arithmetic-smolagents"

    async def agent(self, client, task):
        return await solve(client, task)


if __name__ == "__main__":  # the agent against any OpenAI-compatible server
    print(run_agent(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "Compute 4821*367."))
