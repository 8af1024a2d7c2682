"""The FastAPI application: OpenAI's routes over an ``AsyncLLMEngine``.

``build_app(engine, model_name, ...)`` returns an ASGI app; the engine thread starts with the app's lifespan
and stops with it. Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``,
``POST /tokenize``, ``POST /detokenize`` (these five need the API key when one is set: ``Authorization:
Bearer KEY``), ``GET /health`` (200, or 503 once the engine is dead), ``GET /version``, ``GET /metrics``.
Every error is OpenAI's error JSON with its status code.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import time
from importlib import metadata

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect

from jaxinfer.server.async_engine import AsyncLLMEngine
from jaxinfer.server.chat_template import ChatTemplate
from jaxinfer.server.metrics import CONTENT_TYPE, ServerMetrics
from jaxinfer.server.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    parse,
)
from jaxinfer.server.serving import OpenAIServing

logger = logging.getLogger("jaxinfer.server")


def jaxinfer_version() -> str:
    try:
        return metadata.version("jaxinfer")
    except metadata.PackageNotFoundError:
        return "unknown"


def build_app(engine: AsyncLLMEngine, model_name: str, *, api_key: str | None = None,
              chat_template: ChatTemplate | None = None, model_path: str | None = None) -> FastAPI:
    metrics = ServerMetrics(model_name)
    metrics.attach(engine)
    serving = OpenAIServing(engine, model_name, chat_template)
    created = int(time.time())

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

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):
        logger.exception("unhandled error in %s %s", request.method, request.url.path)
        return JSONResponse(APIError(500, f"internal error: {type(exc).__name__}: {exc}").body(), status_code=500)

    async def body(request: Request) -> bytes:
        try:
            return await request.body()
        except ClientDisconnect:
            raise APIError(499, "the client disconnected before sending its request") from None

    def respond(result):
        if isinstance(result, dict):
            return JSONResponse(result)
        return StreamingResponse(result, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.post("/v1/completions")
    async def completions(request: Request):
        authorize(request)
        req = parse(CompletionRequest, await body(request))
        return respond(await serving.completions(req, request))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        authorize(request)
        req = parse(ChatCompletionRequest, await body(request))
        return respond(await serving.chat(req, request))

    @app.get("/v1/models")
    async def models(request: Request):
        authorize(request)
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": created, "owned_by": "jaxinfer",
            "root": model_path or model_name, "max_model_len": engine.max_model_len}]}

    @app.post("/tokenize")
    async def tokenize(request: Request):
        authorize(request)
        req = parse(TokenizeRequest, await body(request))
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
        req = parse(DetokenizeRequest, await body(request))
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

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    return app
