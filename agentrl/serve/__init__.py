"""The OpenAI-compatible endpoint over the rollout engine: it serves an agent's Chat Completions
requests from the engine and captures every request's tokens into trajectories
(``docs/openai_agents.md``). The runner that drives such agents in training is
``agentrl.rollout.agent_runner``; ``agentrl serve`` is ``agentrl.run.serve_cli``.

- ``protocol.py``: the Chat Completions request/response format, OpenAI-style errors;
- ``capture.py``: one attempt's requests merged into (or split across) trajectories;
- ``service.py``: requests served from the engine, attributed to attempts;
- ``server.py``: the HTTP endpoint (Starlette + uvicorn, 127.0.0.1, ephemeral port).
"""
