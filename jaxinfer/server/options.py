"""The server's own limits and policies (``jaxinfer serve`` flags), one frozen record.

``strict_fields``: refuse unknown request fields with a 400 instead of ignoring them (the field policy is in
``jaxinfer.server.protocol``). ``max_n``: the most choices one request may ask for (OpenAI's own API
stops at 128). ``max_request_tokens``: the most tokens one request may ask to generate, ``n`` times its
``max_tokens`` (a request without ``max_tokens`` counts what its prompt leaves of the context) — with the
default, 32 full-context generations. ``max_body_bytes``: the largest request body read (a 413 beyond).
Each bound is checked before anything is queued.
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

    def __post_init__(self):
        for name in ("max_n", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_request_tokens is not None and self.max_request_tokens < 1:
            raise ValueError(f"max_request_tokens must be >= 1, got {self.max_request_tokens}")

    def request_token_limit(self, max_model_len: int) -> int:
        if self.max_request_tokens is not None:
            return self.max_request_tokens
        return DEFAULT_REQUEST_CONTEXTS * max_model_len
