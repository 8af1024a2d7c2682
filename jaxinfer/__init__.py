"""jaxinfer: an LLM inference engine in JAX and Pallas, with vLLM's public API.

    from jaxinfer import LLM, SamplingParams
    llm = LLM()  # the embedded default model
    out = llm.generate(["def fib(n):"], SamplingParams(temperature=0.0, max_tokens=32))
"""

from jaxinfer.config.engine import EngineConfig
from jaxinfer.llm import LLM
from jaxinfer.llm_engine import LLMEngine
from jaxinfer.outputs import CompletionOutput, RequestMetrics, RequestOutput
from jaxinfer.sampling_params import SamplingParams

__all__ = [
    "LLM",
    "LLMEngine",
    "EngineConfig",
    "SamplingParams",
    "RequestOutput",
    "CompletionOutput",
    "RequestMetrics",
]
