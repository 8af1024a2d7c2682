"""The FastAPI application: OpenAI's routes over an ``AsyncLLMEngine``.

``build_app(engine, model_name, ...)`` returns an ASGI app; the engine thread starts with the app's lifespan
and stops with it. Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``POST /v1/responses``
``GET`` / ``DELETE /v1/responses/{id}`` (``jaxinfer.server.responses``), ``GET /v1/models``, ``GET /v1/models/{id}``,
``POST /tokenize``, ``POST /detokenize`` (these need the API key when one is set: ``Authorization:
Bearer KEY``), ``GET /health`` (200, or 503 once the engine is dead), ``GET /version``, ``GET /metrics``.
Every error, unknown routes (404) and wrong methods (405) included, is OpenAI's error JSON with its status
code. Request bodies larger than ``ServerOptions.max_body_bytes`` are refused with a 413 before they are
read; a body's ignored fields (``jaxinfer.server.protocol``'s field policy) are logged once per name and
listed in the ``x-jaxinfer-ignored-fields`` response header.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import time
from importlib import metadata

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from jaxinfer.server.async_engine import AsyncLLMEngine
from jaxinfer.server.chat_template import ChatTemplate
from jaxinfer.server.metrics import CONTENT_TYPE, ServerMetrics
from jaxinfer.server.options import ServerOptions
from jaxinfer.server.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    parse,
)
from jaxinfer.server.responses import add_responses_routes
from jaxinfer.server.serving import OpenAIServing

logger = logging.getLogger("jaxinfer.server")
IGNORED_FIELDS_HEADER = "x-jaxinfer-ignored-fields"


def jaxinfer_version() -> str:
    try:
        return metadata.version("jaxinfer")
    except metadata.PackageNotFoundError:
        return "unknown"


class _FieldLog:
    """Logs each ignored field name once (per app)."""

    def __init__(self):
        self._seen: set[str] = set()

    def note(self, route: str, fields: list[str]) -> None:
        new = [f for f in fields if f not in self._seen]
        if new:
            self._seen.update(new)
            logger.info("%s: ignoring request fields %s (they cannot change the output; logged once per name)",
                        route, ", ".join(new))


def build_app(engine: AsyncLLMEngine, model_name: str, *, api_key: str | None = None,
              chat_template: ChatTemplate | None = None, model_path: str | None = None,
              options: ServerOptions = ServerOptions()) -> FastAPI:
    metrics = ServerMetrics(model_name)
    metrics.attach(engine)
    serving = OpenAIServing(engine, model_name, chat_template, options)
    created = int(time.time())
    field_log = _FieldLog()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        yield
        engine.shutdown()

    app = FastAPI(title="jaxinfer", version=jaxinfer_version(), lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.engine, app.state.metrics, app.state.serving = engine, metrics, serving

    def authorize(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            raise APIError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'",
                           code="invalid_api_key")

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        if exc.status_code == 404:
            error = APIError(404, f"no route {request.url.path!r}: see /v1/models, /v1/completions, "
                                  "/v1/chat/completions, /v1/responses", code="not_found")
        elif exc.status_code == 405:
            error = APIError(405, f"method {request.method} is not allowed on {request.url.path!r}",
                             code="method_not_allowed")
        else:
            error = APIError(exc.status_code, str(exc.detail))
        return JSONResponse(error.body(), status_code=error.status, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):
        logger.exception("unhandled error in %s %s", request.method, request.url.path)
        return JSONResponse(APIError(500, f"internal error: {type(exc).__name__}: {exc}").body(), status_code=500)

    def too_large() -> APIError:
        return APIError(413, f"the request body is larger than {options.max_body_bytes} bytes (--max-body-bytes)",
                        code="request_too_large")

    async def body(request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > options.max_body_bytes:
            raise too_large()
        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > options.max_body_bytes:
                    raise too_large()
                chunks.append(chunk)
        except ClientDisconnect:
            raise APIError(499, "the client disconnected before sending its request") from None
        return b"".join(chunks)

    async def read(request: Request, model):
        """The parsed body of ``request`` (the field policy applied) and its ignored fields, logged."""
        req, ignored = parse(model, await body(request), options.strict_fields)
        field_log.note(request.url.path, ignored)
        return req, ignored

    def respond(result, ignored=()):
        headers = {IGNORED_FIELDS_HEADER: ",".join(ignored)} if ignored else {}
        if isinstance(result, dict):
            return JSONResponse(result, headers=headers)
        return StreamingResponse(result, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers})

    @app.post("/v1/completions")
    async def completions(request: Request):
        authorize(request)
        req, ignored = await read(request, CompletionRequest)
        return respond(await serving.completions(req, request), ignored)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        authorize(request)
        req, ignored = await read(request, ChatCompletionRequest)
        return respond(await serving.chat(req, request), ignored)

    add_responses_routes(app, serving, authorize, read, respond)

    def model_card() -> dict:
        return {"id": model_name, "object": "model", "created": created, "owned_by": "jaxinfer",
                "root": model_path or model_name, "max_model_len": engine.max_model_len}

    @app.get("/v1/models")
    async def models(request: Request):
        authorize(request)
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(request: Request, model_id: str):
        authorize(request)
        serving.check_model(model_id)
        return model_card()

    @app.post("/tokenize")
    async def tokenize(request: Request):
        authorize(request)
        req, _ = await read(request, TokenizeRequest)
        serving.check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise APIError(400, "give exactly one of 'prompt' or 'messages'")
        if serving.tokenizer is None:
            raise APIError(400, "this model has no tokenizer")
        if req.messages is not None:
            chat = ChatCompletionRequest(messages=req.messages)
            try:
                chat.check_messages()
            except ValueError as exc:
                raise APIError(400, str(exc)) from None
            ids = serving.render_chat(chat.dicts(), req.add_generation_prompt)
        else:
            ids = serving.tokenizer.encode(req.prompt, add_special_tokens=req.add_special_tokens)
        return {"count": len(ids), "max_model_len": engine.max_model_len, "tokens": ids}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        authorize(request)
        req, _ = await read(request, DetokenizeRequest)
        serving.check_model(req.model)
        if serving.tokenizer is None:
            raise APIError(400, "this model has no tokenizer")
        vocab = serving.tokenizer.vocab_size
        bad = [t for t in req.tokens if not 0 <= t < vocab]
        if bad:
            raise APIError(400, f"token ids out of range [0, {vocab}): {bad[:5]}")
        return {"prompt": serving.tokenizer.decode(req.tokens)}

    @app.get("/health")
    async def health():
        if engine.is_dead:
            return JSONResponse(APIError(503, str(engine.dead_error), code="engine_dead").body(), status_code=503)
        return Response(status_code=200)

    @app.get("/version")
    async def version():
        return {"version": jaxinfer_version()}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache(request: Request):
        """vLLM's route: forget every cached prefix block (KV-cache events publish AllBlocksCleared); refused
        with a 409 while requests hold KV blocks (nothing changes then)."""
        authorize(request)
        if not await engine.reset_prefix_cache():
            raise APIError(409, "the prefix cache was not reset: running requests hold KV blocks; retry when idle",
                           code="busy")
        return {"success": True}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    return app
