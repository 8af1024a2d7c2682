"""C++ kernels for XLA:CPU, called through ``jax.ffi``: the small-batch matrix products of decode, and
paged attention of short query runs.

XLA:CPU has no integer or mixed-precision matrix-vector product (an 8-bit weight is widened to float32 in
memory first, which costs more than reading the float32 weight) and its float32 one trails the memory
bandwidth on decode shapes (``jaxinfer.cpu.quantized_matmul``). ``matvec.cc`` streams each weight
once in its stored width (decode: up to ``MATVEC_MAX_ROWS`` activation rows); ``gemm.cc`` widens a weight to
float32 once, panel by panel, and computes register tiles of outer products (8-bit weights from
``GEMM_MIN_ROWS`` rows: prefill and large batches); on CPUs with AMX tiles (Intel Sapphire Rapids and later)
``gemm_amx.cc`` takes those products instead (from ``AMX_MIN_ROWS`` rows), splitting each float32 activation
exactly into three bfloat16 terms (``JAXINFER_CPU_AMX=0`` keeps ``gemm.cc``).
``jaxinfer.model.linear`` and ``jaxinfer.quantization.quantized_weight`` call them on one CPU device (``product``).
``paged_attention.cc`` computes decode and verification attention straight from the paged cache, and
``ragged_attention.cc`` the longer query runs (prompts, prefill chunks) as flash attention in registers
(``jaxinfer.model.attention`` calls them on the CPU).

The sources are compiled with the machine's C++ compiler (``c++`` or ``$CXX``, ``-O3 -march=native``) into
``<cache root>/cpu_ffi/<hash>/`` (``jaxinfer.envs.cache_root``) and their handlers registered with XLA when
``load()`` is called (a CPU engine calls it as it starts; an eager call of a kernel does too), never inside a jit
trace: traced code asks ``loaded()``. Without a compiler, or with ``JAXINFER_CPU_KERNELS=0``, ``load()`` is False
and every caller keeps its XLA formulation: same results, slower. ``attention_backend="xla"`` keeps the XLA
formulations even where the kernels are loaded (``jaxinfer.model.attention.resolve_attention_backend``).
"""

from jaxinfer.cpu.ffi.attention import paged_attention, ragged_attention, use_paged_attention
from jaxinfer.cpu.ffi.build import (
                                    amx_available,
                                    amx_loaded,
                                    available,
                                    compiler,
                                    fingerprint,
                                    load,
                                    loaded,
                                    unavailable_reason,
)
from jaxinfer.cpu.ffi.ops import (
                                  AMX_MIN_ROWS,
                                  GEMM_MIN_ROWS,
                                  MATVEC_MAX_ROWS,
                                  gemm,
                                  gemm_amx,
                                  kernel_for,
                                  matvec,
                                  matvec_reference,
                                  product,
)

__all__ = ["amx_available", "amx_loaded", "available", "compiler", "fingerprint", "load", "loaded",
           "unavailable_reason", "AMX_MIN_ROWS", "GEMM_MIN_ROWS", "MATVEC_MAX_ROWS", "gemm", "gemm_amx", "kernel_for",
           "matvec", "matvec_reference", "product", "paged_attention", "ragged_attention", "use_paged_attention"]
