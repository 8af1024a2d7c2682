"""jaxinfer: an LLM inference engine in JAX and Pallas, with vLLM's public API.

    from jaxinfer import LLM, SamplingParams
    llm = LLM()  # the embedded default model
    out = llm.generate(["def fib(n):"], SamplingParams(temperature=0.0, max_tokens=32))

The public names are imported on first use, so the host-side packages (``jaxinfer.core``: scheduler, block
manager, sequences, tokenizer) can be imported without JAX.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_PUBLIC = {  # name -> the module that defines it
    "LLM": "jaxinfer.llm",
    "LLMEngine": "jaxinfer.llm_engine",
    "EngineConfig": "jaxinfer.config.engine",
    "SamplingParams": "jaxinfer.sampling_params",
    "StructuredOutputsParams": "jaxinfer.sampling_params",
    "RequestOutput": "jaxinfer.outputs",
    "CompletionOutput": "jaxinfer.outputs",
    "RequestMetrics": "jaxinfer.outputs",
    "Logprob": "jaxinfer.outputs",
}
__all__ = list(_PUBLIC)

if TYPE_CHECKING:
    from jaxinfer.config.engine import EngineConfig
    from jaxinfer.llm import LLM
    from jaxinfer.llm_engine import LLMEngine
    from jaxinfer.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
    from jaxinfer.sampling_params import SamplingParams, StructuredOutputsParams


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'jaxinfer' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
