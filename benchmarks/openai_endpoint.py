"""The OpenAI endpoint's cost: per request, and with 64 agents at once, on the tiny model.

- **overhead per request**: the same request (one user message, ``--tokens`` sampled tokens)
  sent one at a time, ``--requests`` times, (a) through the endpoint with the ``openai`` SDK
  (HTTP on 127.0.0.1, JSON, request checks, token capture) as Chat Completions, Chat
  Completions streamed, and the Responses API, interleaved, and (b) straight to
  ``engine.agenerate`` with the prompt ids rendered once. Overhead = (a) - (b), in ms.
- **64 concurrent agents**: ``AgentRunner`` with an agent making ``--turns`` requests (each
  extending the last with a user follow-up), 16 tasks x G=4; against the same requests made
  by 64 coroutines calling ``engine.agenerate`` directly (prompts grown the same way).

    python benchmarks/openai_endpoint.py              # ~1 min
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import torch

from agentrl.chat import ChatTemplate
from agentrl.engines.base import SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.models.tiny import ensure_tiny_model
from agentrl.rollout import RolloutConfig
from agentrl.rollout.agent_runner import AgentRunner
from agentrl.serve.server import EndpointServer
from agentrl.serve.service import AttemptBudget, ChatService
from agentrl.types import Message, Task


async def _chat(client, messages, tokens):
    r = await client.chat.completions.create(model="m", messages=messages, max_tokens=tokens, seed=1)
    assert r.usage.completion_tokens <= tokens


async def _chat_streamed(client, messages, tokens):
    stream = await client.chat.completions.create(model="m", messages=messages, max_tokens=tokens, seed=1,
                                                  stream=True)
    async for _ in stream:
        pass


async def _responses(client, messages, tokens):
    r = await client.responses.create(model="m", input=messages[0]["content"], max_output_tokens=tokens)
    assert r.usage.output_tokens <= tokens


APIS = {"chat.completions": _chat, "chat.completions stream": _chat_streamed, "responses": _responses}


async def one_at_a_time(args, engine, chat) -> tuple[dict[str, float], float]:
    """Median ms per request of each API (``APIS``), and of the engine called directly."""
    import openai

    budget = AttemptBudget(max_total_tokens=512, max_sampled_tokens=512, max_new_tokens=args.tokens,
                           temperature=1.0, top_p=1.0)
    service = ChatService(engine, chat, budget)
    messages = [{"role": "user", "content": "What is 6*7?"}]
    ids = chat.encode_prompt([Message("user", "What is 6*7?")])
    params = SamplingParams(max_new_tokens=args.tokens, temperature=1.0, seed=1,
                            stop_token_ids=[], stop_strings=[])
    with EndpointServer(service) as server:
        client = openai.AsyncOpenAI(base_url=server.base_url(), api_key="x", max_retries=0)
        via: dict[str, list[float]] = {name: [] for name in APIS}
        direct = []
        for i in range(args.requests + 5):  # the first 5 of each warm up; the APIs interleaved
            for name, send in APIS.items():
                t = time.perf_counter()
                await send(client, messages, args.tokens)
                via[name].append(time.perf_counter() - t)
            t = time.perf_counter()
            await engine.agenerate(ids, params)
            direct.append(time.perf_counter() - t)
        await client.close()
    return {name: statistics.median(v[5:]) * 1e3 for name, v in via.items()}, statistics.median(direct[5:]) * 1e3


def concurrent_agents(args, engine, chat) -> tuple[float, float, int]:
    tasks = [Task(f"t{i}", f"task number {i}: what is {i}*7?", "") for i in range(16)]

    async def agent(client, task):
        messages = [{"role": "user", "content": task.prompt}]
        for _ in range(args.turns):
            r = await client.chat.completions.create(model="m", messages=messages, max_tokens=args.tokens)
            messages += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "and then?"}]
        return r.choices[0].message.content

    runner = AgentRunner(engine, chat, agent, RolloutConfig(max_new_tokens=args.tokens, max_total_tokens=1024))
    runner.run(tasks[:2], 2, seed=0)  # warm-up
    t = time.perf_counter()
    batch = runner.run(tasks, 4, seed=1)
    via = time.perf_counter() - t
    runner.close()
    requests = sum(tr.turns for tr in batch.trajectories)

    async def direct_agent(task, i):
        msgs = [Message("user", task.prompt)]
        for turn in range(args.turns):
            ids = chat.encode_prompt(msgs)
            g = await engine.agenerate(ids, SamplingParams(max_new_tokens=args.tokens, seed=1000 * i + turn,
                                                           stop_token_ids=list(chat.stop_token_ids)))
            msgs += [Message("assistant", engine.tokenizer.decode(g.token_ids, skip_special_tokens=True)),
                     Message("user", "and then?")]

    async def all_direct():
        await asyncio.gather(*(direct_agent(task, i) for task in tasks for i in range(4)))

    t = time.perf_counter()
    asyncio.run(all_direct())
    direct = time.perf_counter() - t
    return via, direct, requests


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--tokens", type=int, default=16, help="sampled tokens per request")
    ap.add_argument("--turns", type=int, default=3, help="requests per agent in the concurrent run")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    engine = HFEngine.from_pretrained(ensure_tiny_model(), seed=0)
    chat = ChatTemplate(engine.tokenizer)
    via_ms, direct_ms = asyncio.run(one_at_a_time(args, engine, chat))
    via_s, direct_s, requests = concurrent_agents(args, engine, chat)
    print(f"tiny model, {args.tokens} sampled tokens per request, torch threads {args.threads}")
    for name, ms in via_ms.items():
        print(f"one request at a time (median of {args.requests}), {name}: endpoint {ms:.2f} ms, engine directly "
              f"{direct_ms:.2f} ms -> overhead {ms - direct_ms:.2f} ms per request")
    print(f"64 concurrent agents x {args.turns} requests: {requests} requests in {via_s:.2f} s = "
          f"{requests / via_s:.0f} requests/s through the endpoint; the same requests straight to the engine "
          f"{direct_s:.2f} s = {requests / direct_s:.0f}/s (endpoint / direct throughput {direct_s / via_s:.2f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"overhead_ms": {k: v - direct_ms for k, v in via_ms.items()}, "via_ms": via_ms,
                       "direct_ms": direct_ms,
                       "concurrent_requests": requests, "concurrent_s": via_s, "direct_concurrent_s": direct_s}, f)


if __name__ == "__main__":
    main()
