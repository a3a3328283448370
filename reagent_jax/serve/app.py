"""The OpenAI-compatible HTTP API (FastAPI) over one or more `ModelService`s.

    app = make_app([ModelService(engine, tok, "my-agent")], api_key=None)
    GET  /health                    liveness + engine counters (no auth)
    GET  /metrics                   Prometheus text format (no auth): requests, latency, tokens, slots
    GET  /v1/models, /v1/models/{id}
    POST /v1/chat/completions       messages, tools, temperature/top_p/max_tokens/stop/seed/n, stream
    POST /v1/completions            prompt (text or token ids), same sampling fields, echo

Why FastAPI + uvicorn (not stdlib http.server): an asyncio server holds hundreds of open
connections and server-sent-event streams without a thread each, and both packages are already
project dependencies (the retrieval server uses them). Engine calls block, so each request's
generation runs in a worker thread; a cap on requests in flight (`ServerLimits.max_concurrent`,
429 beyond it) bounds those threads. A client that disconnects frees its engine sessions, streamed
or not (a blocking request checks every `service.CHECK_S`). Every failure becomes an OpenAI-format
JSON error (see `serve.errors`); an exception in one request never stops the server. A stream that
fails after it started ends with a `data: {"error": {...}}` event, as OpenAI does.
"""
# No `from __future__ import annotations`: FastAPI inspects the handlers' annotations at runtime.
import hmac
import json
import logging
import threading
from typing import Any, Callable, Iterator, Optional, Sequence

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from reagent_jax.serve import protocol
from reagent_jax.serve.errors import APIError, bad_request
from reagent_jax.serve.metrics import CONTENT_TYPE, ServerMetrics, TimedRequests
from reagent_jax.serve.service import ModelService

log = logging.getLogger(__name__)
_END = object()


class _EventStream(StreamingResponse):
    """Frees the request's in-flight slot even when the client leaves before the stream starts."""

    def __init__(self, content, on_close: Callable[[], None], **kw):
        super().__init__(content, **kw)
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


class _InFlight:
    """Counts requests being served; refuses one more than `limit` with 429."""

    def __init__(self, limit: int):
        self.limit, self.count, self.peak, self._lock = limit, 0, 0, threading.Lock()

    def acquire(self) -> Callable[[], None]:
        with self._lock:
            if self.count >= self.limit:
                raise APIError(429, f"the server is at its limit of {self.limit} requests in flight; retry shortly",
                               code="too_many_requests", headers={"Retry-After": "1"})
            self.count += 1
            self.peak = max(self.peak, self.count)
        done = threading.Event()

        def release() -> None:
            if not done.is_set():
                done.set()
                with self._lock:
                    self.count -= 1
        return release


def make_app(services: ModelService | Sequence[ModelService], *, api_key: Optional[str] = None,
             max_concurrent: Optional[int] = None, max_body_bytes: Optional[int] = None) -> FastAPI:
    """The ASGI app. `api_key`: when set, /v1 routes need `Authorization: Bearer <api_key>`.
    max_concurrent / max_body_bytes default to the first service's limits."""
    services = [services] if isinstance(services, ModelService) else list(services)
    if not services:
        raise ValueError("make_app: no model services given")
    by_name: dict[str, ModelService] = {}
    for svc in services:
        for name in svc.names:
            if name in by_name:
                raise ValueError(f"make_app: two services are both named {name!r}")
            by_name[name] = svc
    limits = services[0].limits
    inflight = _InFlight(max_concurrent or limits.max_concurrent)
    body_limit = max_body_bytes or limits.max_body_bytes
    workers = anyio.CapacityLimiter(inflight.limit + 8)
    app = FastAPI(title="reagent-jax OpenAI-compatible server", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.inflight = inflight
    app.state.metrics = ServerMetrics(services, lambda: inflight.count)
    app.add_middleware(TimedRequests, metrics=app.state.metrics)

    def error_response(e: APIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError):
        return error_response(e)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        what = {404: f"no route {request.method} {request.url.path}",
                405: f"method {request.method} is not allowed on {request.url.path}"}.get(e.status_code, str(e.detail))
        return error_response(APIError(e.status_code, what))

    @app.exception_handler(Exception)
    async def _crash(request: Request, e: Exception):  # Starlette logs the traceback after this reply
        return error_response(APIError(500, f"internal error: {type(e).__name__}: {e}"))

    def check_auth(request: Request) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization", "")
        given = header[7:].strip() if header.lower().startswith("bearer ") else ""
        if not given or not hmac.compare_digest(given.encode(), api_key.encode()):
            raise APIError(401, "missing or invalid API key (send 'Authorization: Bearer <key>')",
                           code="invalid_api_key")

    async def read_json(request: Request) -> Any:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > body_limit:
            raise APIError(413, f"the request body has {length} bytes; this server accepts at most {body_limit}")
        chunks, size = [], 0
        async for chunk in request.stream():  # stop reading as soon as the limit is passed
            size += len(chunk)
            if size > body_limit:
                raise APIError(413, f"the request body has more than {body_limit} bytes, this server's limit")
            chunks.append(chunk)
        raw = b"".join(chunks)
        try:
            return json.loads(raw)
        except (ValueError, RecursionError) as e:  # also: too deep, or an integer of over 4300 digits
            raise bad_request(f"the request body is not valid JSON: {str(e)[:200]}") from None

    def service_for(body: Any) -> ModelService:
        model = body.get("model") if isinstance(body, dict) else None
        if model is None:
            return services[0]
        if not isinstance(model, str):
            raise bad_request(f"'model' must be a string, got {model!r:.100}", "model")
        if model not in by_name:
            raise APIError(404, f"the model {model!r} does not exist; this server serves {sorted(by_name)}",
                           param="model", code="model_not_found")
        return by_name[model]

    async def in_thread(fn: Callable, *args):
        return await anyio.to_thread.run_sync(fn, *args, limiter=workers)

    async def handle(request: Request, parse: Callable[[Any, ModelService], Any], prepare_name: str):
        check_auth(request)
        body = await read_json(request)
        svc = service_for(body)
        req = parse(body, svc)
        release = inflight.acquire()
        streaming = False
        prepare = getattr(svc, prepare_name)
        try:
            if not req.sampling.stream:  # one thread hop: prepare and generate
                return JSONResponse(await in_thread(lambda: svc.run(watched(prepare(req), request))))
            prep = await in_thread(prepare, req)  # a bad request is refused before the stream starts
            streaming = True  # from here on the stream's own `finally` releases the slot
        finally:
            if not streaming:
                release()
        return _EventStream(sse(svc.stream(prep), release), release, media_type="text/event-stream",
                            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    def watched(prep, request: Request):
        """`prep` whose blocking run stops when its client disconnects."""
        def client_gone() -> bool:  # called from the worker thread
            try:
                return anyio.from_thread.run(request.is_disconnected)
            except RuntimeError:  # the event loop is gone (shutting down): nobody will read the reply
                return True
        prep.client_gone = client_gone
        return prep

    async def sse(chunks: Iterator[dict], release: Callable[[], None]):
        try:
            while True:
                chunk = await in_thread(next, chunks, _END)
                if chunk is _END:
                    break
                yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
            yield "data: [DONE]\n\n"
        except APIError as e:
            yield f"data: {json.dumps(e.body())}\n\n"
        except Exception as e:  # noqa: BLE001 - the stream ends with an error event, the server lives on
            log.exception("stream failed")
            yield f"data: {json.dumps(APIError(500, f'internal error: {type(e).__name__}: {e}').body())}\n\n"
        finally:
            with anyio.CancelScope(shield=True):  # the client may have gone: still free its sessions
                await in_thread(chunks.close)
            release()

    @app.get("/health")
    async def health():
        return {"status": "ok", "models": sorted(by_name), "in_flight": inflight.count,
                "engines": {s.name: _jsonable(s.engine.stats()) for s in services}}

    @app.get("/metrics")
    async def metrics():
        return Response(app.state.metrics.exposition(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def list_models(request: Request):
        check_auth(request)
        return {"object": "list", "data": [card for s in services for card in s.model_cards()]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str, request: Request):
        check_auth(request)
        svc = service_for({"model": model_id})
        return next(c for c in svc.model_cards() if c["id"] == model_id)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await handle(request, lambda body, svc: protocol.parse_chat(body, svc.limits), "prepare_chat")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handle(request, lambda body, svc: protocol.parse_completion(
            body, svc.limits, svc.engine.cfg.vocab_size), "prepare_completion")

    return app


def _jsonable(stats: dict) -> dict:
    return {k: v for k, v in stats.items() if isinstance(v, (int, float, str, list))}
