"""``jaxinfer serve``: build the engine, then serve the app with uvicorn until SIGTERM / Ctrl-C.

The engine is built (and, with ``compilation="eager"``, every step shape compiled) before the port opens,
so the first request is served at full speed and ``/health`` answers only once the server can serve.
SIGTERM (or SIGINT): uvicorn stops accepting connections, lets in-flight requests finish for up to
``--graceful-shutdown-timeout`` seconds (then cancels them, which aborts them in the engine), stops the
engine thread, and the process exits with status 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import signal
from pathlib import Path
from typing import Any

from jaxinfer.config.engine import EngineConfig
from jaxinfer.server.options import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_N, DEFAULT_REQUEST_CONTEXTS, ServerOptions

DEFAULT_MODEL_NAME = "jaxinfer-default"
# EngineConfig fields `serve` does not expose as flags (model is the positional argument)
_NOT_FLAGS = {"model"}


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """One flag per EngineConfig field (``--max-num-seqs``, ``--enable-prefix-caching`` / ``--no-...``, ...),
    typed from its annotation; a flag left out keeps EngineConfig's default."""
    g = p.add_argument_group("engine (EngineConfig)")
    for f in dataclasses.fields(EngineConfig):
        if f.name in _NOT_FLAGS:
            continue
        flag = "--" + f.name.replace("_", "-")
        kind = str(f.type)
        default_help = f"default {f.default!r}"
        if kind.startswith("bool"):
            g.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=default_help)
        elif "dict" in kind:
            g.add_argument(flag, type=json.loads, default=None, metavar="JSON", help=default_help)
        else:
            typ = int if kind.startswith("int") else float if kind.startswith("float") else str
            g.add_argument(flag, type=typ, default=None, help=default_help)


def engine_config(args: argparse.Namespace) -> EngineConfig:
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(EngineConfig)
             if f.name not in _NOT_FLAGS and getattr(args, f.name, None) is not None}
    return EngineConfig(model=args.model, **given)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=None,
                   help="HF dir, converted dir or random:<preset>; default: the embedded model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/* and /tokenize")
    p.add_argument("--served-model-name", default=None,
                   help=f"the name clients pass as 'model' (default: the model argument, or {DEFAULT_MODEL_NAME!r})")
    p.add_argument("--max-waiting-requests", type=int, default=None,
                   help="answer 503 (Retry-After) while this many sequences wait for a slot (default: no limit)")
    p.add_argument("--strict-fields", action="store_true",
                   help="refuse unknown request fields with a 400 (default: accept, ignore and log them)")
    p.add_argument("--max-n", type=int, default=DEFAULT_MAX_N, help="the most choices (n) one request may ask for")
    p.add_argument("--max-request-tokens", type=int, default=None,
                   help=f"the most tokens one request may generate, n x max_tokens (default: "
                        f"{DEFAULT_REQUEST_CONTEXTS} x max_model_len)")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                   help="the largest request body accepted (413 beyond)")
    p.add_argument("--enable-auto-tool-choice", action="store_true",
                   help='let the model decide whether to call a tool (tool_choice "auto"); needs --tool-call-parser')
    p.add_argument("--tool-call-parser", default=None, choices=["hermes", "llama3_json", "mistral"],
                   help="the format the model writes tool calls in (parsed into OpenAI tool_calls)")
    p.add_argument("--graceful-shutdown-timeout", type=float, default=30.0,
                   help="on SIGTERM, seconds in-flight requests may take to finish")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    add_engine_arguments(p)
    from jaxinfer.server import data_parallel

    data_parallel.add_arguments(p)


def build(args: argparse.Namespace) -> tuple[Any, str]:
    """The app and the name it serves the model under."""
    from jaxinfer.server.app import build_app
    from jaxinfer.server.async_engine import AsyncLLMEngine
    from jaxinfer.server.chat_template import ChatTemplate, load_chat_template

    options = ServerOptions(strict_fields=args.strict_fields, max_n=args.max_n,  # checked before the engine is built
                            max_request_tokens=args.max_request_tokens, max_body_bytes=args.max_body_bytes,
                            enable_auto_tool_choice=args.enable_auto_tool_choice,
                            tool_call_parser=args.tool_call_parser)
    engine = AsyncLLMEngine.from_config(engine_config(args), max_waiting_requests=args.max_waiting_requests)
    llm_engine = engine.engine
    name = args.served_model_name or args.model or DEFAULT_MODEL_NAME
    source = Path(llm_engine.model_source)
    template = load_chat_template(source) if source.is_dir() else None
    chat = None
    if template is not None:
        tok = llm_engine.tokenizer
        bos = tok.decode([tok.bos_token_id], skip_special_tokens=False) if tok and tok.bos_token_id is not None else ""
        eos = tok.decode([tok.eos_token_id], skip_special_tokens=False) if tok and tok.eos_token_id is not None else ""
        chat = ChatTemplate(template, bos, eos)
    app = build_app(engine, name, api_key=args.api_key, chat_template=chat, model_path=llm_engine.model_source,
                    options=options)
    return app, name


def serve(args: argparse.Namespace) -> int:
    from jaxinfer.server import data_parallel

    if data_parallel.uses_router(args):  # N replicas behind SMG (this process imports no JAX)
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        return data_parallel.serve_data_parallel(parser, args)
    import uvicorn

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app, name = build(args)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False,
                            timeout_graceful_shutdown=args.graceful_shutdown_timeout)
    server = uvicorn.Server(config)
    # uvicorn re-raises the signal that stopped it once it has shut down gracefully; with this handler in
    # place that is a no-op and the process exits with status 0 instead of dying of the signal.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    logging.getLogger("jaxinfer.server").info("serving %r on http://%s:%d", name, args.host, args.port)
    server.run()
    return 0
