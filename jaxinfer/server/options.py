"""The server's own limits and policies (``jaxinfer serve`` flags), one frozen record.

``strict_fields``: refuse unknown request fields with a 400 instead of ignoring them (the field policy is in
``jaxinfer.server.protocol``). ``max_n``: the most choices one request may ask for (OpenAI's own API
stops at 128). ``max_request_tokens``: the most tokens one request may ask to generate, ``n`` times its
``max_tokens`` (a request without ``max_tokens`` counts what its prompt leaves of the context) — with the
default, 32 full-context generations. ``max_body_bytes``: the largest request body read (a 413 beyond).
Each bound is checked before anything is queued.

Tool calling (vLLM's flags): ``tool_call_parser`` names the format the model writes calls in (``hermes``,
``llama3_json``, ``mistral``: ``jaxinfer.server.tool_parsers``); ``enable_auto_tool_choice`` lets the model
decide whether to call (``tool_choice: "auto"``, the default when a request has tools), which needs the parser.
``required`` and named tool choices work without either flag (their calls are forced in the parser's format, or
in hermes' when none is set).
"""

from __future__ import annotations

import dataclasses

DEFAULT_MAX_N = 128
DEFAULT_MAX_BODY_BYTES = 16 << 20
DEFAULT_REQUEST_CONTEXTS = 32  # max_request_tokens defaults to this many times max_model_len


@dataclasses.dataclass(frozen=True)
class ServerOptions:
    strict_fields: bool = False
    max_n: int = DEFAULT_MAX_N
    max_request_tokens: int | None = None  # None: DEFAULT_REQUEST_CONTEXTS * max_model_len
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None

    def __post_init__(self):
        for name in ("max_n", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_request_tokens is not None and self.max_request_tokens < 1:
            raise ValueError(f"max_request_tokens must be >= 1, got {self.max_request_tokens}")
        if self.tool_call_parser is not None:
            from jaxinfer.server.tool_parsers import get_tool_parser

            get_tool_parser(self.tool_call_parser)  # an unknown name is refused at start, listing the valid ones
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("--enable-auto-tool-choice needs --tool-call-parser (the format the model writes calls in)")

    def request_token_limit(self, max_model_len: int) -> int:
        if self.max_request_tokens is not None:
            return self.max_request_tokens
        return DEFAULT_REQUEST_CONTEXTS * max_model_len
