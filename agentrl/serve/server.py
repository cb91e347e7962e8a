"""The OpenAI-compatible HTTP endpoint: Starlette routes over a ``ChatService``, served by
uvicorn on 127.0.0.1 in a background thread.

Routes (``{key}`` attributes a request to an attempt; the plain routes keep nothing):

- ``POST /v1/chat/completions`` and ``POST /attempts/{key}/v1/chat/completions``
- ``POST /v1/responses`` and ``POST /attempts/{key}/v1/responses`` (the Responses API)
- ``GET /v1/models`` and ``GET /attempts/{key}/v1/models``

``stream=true`` answers with server-sent events sent as the turn is sampled (``streaming.py``).
Every failure is an OpenAI-style JSON error with a 4xx status (a bug of ours: 500, still JSON);
bodies over ``max_body_bytes`` are refused with 413 before they are read whole.

Example::

    server = EndpointServer(service).start()
    client = openai.OpenAI(base_url=server.base_url(), api_key="unused")
    client.chat.completions.create(model="agentrl", messages=[{"role": "user", "content": "hi"}])
    server.stop()
"""

from __future__ import annotations

import json
import logging
import threading
import time

from agentrl.serve.protocol import RequestError, completion_body, parse_request
from agentrl.serve.response_body import new_id, response_body, response_events
from agentrl.serve.responses import parse_responses_request
from agentrl.serve.service import ChatService
from agentrl.serve.streaming import LiveTokens, chat_events, start_live

MAX_BODY_BYTES = 8 << 20
log = logging.getLogger(__name__)


def _error(err: RequestError):
    from starlette.responses import JSONResponse

    return JSONResponse(err.body(), status_code=err.status)


async def _read_json(request, limit: int):
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(f"the request body has {int(declared)} bytes, over the limit of {limit}", status=413,
                           code="request_too_large")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise RequestError(f"the request body is over the limit of {limit} bytes", status=413,
                               code="request_too_large")
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(f"the request body is not valid JSON: {e}") from None


def build_app(service: ChatService, *, max_body_bytes: int = MAX_BODY_BYTES):
    """The Starlette application of ``service``."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    budget = service.default_budget

    def streamed(events) -> StreamingResponse:
        return StreamingResponse(events, media_type="text/event-stream", headers={"cache-control": "no-cache"})

    async def completions(request):
        key = request.path_params.get("key")
        try:
            body = await _read_json(request, max_body_bytes)
            req = parse_request(body, max_tokens_limit=budget.max_total_tokens)
            model = req.model or service.model_name
            if req.stream:
                live = LiveTokens()
                task = await start_live(service.complete(key, req, live), live)
                return streamed(chat_events(service.chat, req, model, live, task))
            done = await service.complete(key, req)
        except RequestError as err:
            service.stats.refused += 1
            return _error(err)
        return JSONResponse(completion_body(done, model, req.logprobs))

    async def responses(request):
        key = request.path_params.get("key")
        try:
            body = await _read_json(request, max_body_bytes)
            req = parse_responses_request(body, max_tokens_limit=budget.max_total_tokens)
            model = req.chat.model or service.model_name
            if req.chat.stream:
                live, rid = LiveTokens(), new_id("resp")
                task = await start_live(service.respond(key, req, live, rid), live)
                return streamed(response_events(service.chat, req, model, rid, live, task))
            rid, done = await service.respond(key, req)
        except RequestError as err:
            service.stats.refused += 1
            return _error(err)
        return JSONResponse(response_body(rid, req, done, model))

    async def models(request):
        return JSONResponse({"object": "list", "data": [
            {"id": service.model_name, "object": "model", "created": int(time.time()), "owned_by": "agentrl"}]})

    async def http_error(request, exc: HTTPException):
        return _error(RequestError(f"{request.method} {request.url.path}: {exc.detail}", status=exc.status_code,
                                   code="not_found" if exc.status_code == 404 else None))

    async def server_error(request, exc: Exception):
        log.exception("endpoint error")
        return JSONResponse(RequestError(f"internal error: {type(exc).__name__}: {exc}", status=500,
                                         kind="server_error").body(), status_code=500)

    routes = [Route("/v1/chat/completions", completions, methods=["POST"]),
              Route("/attempts/{key}/v1/chat/completions", completions, methods=["POST"]),
              Route("/v1/responses", responses, methods=["POST"]),
              Route("/attempts/{key}/v1/responses", responses, methods=["POST"]),
              Route("/v1/models", models, methods=["GET"]),
              Route("/attempts/{key}/v1/models", models, methods=["GET"])]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: server_error})


class EndpointServer:
    """uvicorn serving ``build_app(service)`` on 127.0.0.1 (``port`` 0: an ephemeral one) in a
    daemon thread."""

    def __init__(self, service: ChatService, *, host: str = "127.0.0.1", port: int = 0,
                 max_body_bytes: int = MAX_BODY_BYTES):
        try:
            import uvicorn
        except ImportError as e:
            raise ImportError("the OpenAI endpoint needs starlette and uvicorn: pip install 'agentrl[serve]'") from e
        self.service = service
        self.host, self.port = host, port  # port 0: known once started
        # uvicorn binds the socket itself: handed a socket of ours, its connections answered
        # 40 ms late here (Nagle and delayed ACKs), against 1.4 ms when it binds.
        config = uvicorn.Config(build_app(service, max_body_bytes=max_body_bytes), host=host, port=port,
                                log_level="warning", lifespan="off", access_log=False, timeout_keep_alive=30)
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    def base_url(self, key: str | None = None) -> str:
        """The ``base_url`` an OpenAI client takes: the attempt's own, or the plain endpoint's."""
        root = f"http://{self.host}:{self.port}"
        return f"{root}/attempts/{key}/v1" if key else f"{root}/v1"

    def start(self, timeout_s: float = 30.0) -> "EndpointServer":
        self._thread = threading.Thread(target=self._server.run, name="agentrl-endpoint", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the endpoint did not start on {self.host}:{self.port} (port in use?)")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    @property
    def alive(self) -> bool:
        """True while the server thread runs (a stopped or crashed endpoint is replaced by its owner)."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)

    def __enter__(self) -> "EndpointServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
