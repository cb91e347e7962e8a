"""Train agents written against the OpenAI API: an OpenAI-compatible endpoint over the rollout
engine that captures every request's tokens into trajectories (``docs/openai_agents.md``).

- ``protocol.py``: the Chat Completions request/response format, OpenAI-style errors;
- ``capture.py``: one attempt's requests merged into (or split across) trajectories;
- ``service.py``: requests served from the engine, attributed to attempts;
- ``server.py``: the HTTP endpoint (Starlette + uvicorn, 127.0.0.1, ephemeral port);
- ``agent_runner.py``: rollouts whose agent is user code (``RolloutRunner``'s stand-in).
"""
