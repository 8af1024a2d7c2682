"""jaxinfer's OpenAI-compatible HTTP server (``jaxinfer serve``) and the async engine it drives.

``AsyncLLMEngine`` (``jaxinfer.server.async_engine``) needs only the standard library and is usable without
the HTTP layer; the HTTP layer (``app``, ``serving``, ``metrics``, ``launch``) needs the ``server`` extra:
``pip install "jaxinfer[server]"`` (FastAPI, uvicorn, prometheus-client, jinja2).
"""

from jaxinfer.server.async_engine import AsyncLLMEngine, EngineDeadError, EngineOverloadedError

__all__ = ["AsyncLLMEngine", "EngineDeadError", "EngineOverloadedError"]
