"""OpenAI's Responses API (``POST /v1/responses``, ``GET /v1/responses/{id}``): being written."""

from __future__ import annotations


def add_responses_routes(app, serving, authorize, read, respond) -> None:
    """Adds the Responses API's routes to ``app`` (see the module docstring)."""
