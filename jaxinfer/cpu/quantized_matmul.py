"""Quantized matmuls on XLA:CPU: the formulations ``quantized_linear`` uses there, and the
microbenchmark that chose them.

A per-channel 8-bit weight goes to the C++ kernels (``jaxinfer.cpu.ffi.product``): up to
``MATVEC_MAX_ROWS`` activation rows (decode) the matvec kernel, which reads it in its stored width (int8 about
three times as fast as the float32 weight through XLA at batch 1); larger products (prefill, big batches) the
gemm kernel, which widens each weight once per call and is bound by arithmetic like a float32 product (on a
CPU with AMX tiles the AMX kernel instead, several times the float32 rate). The
XLA formulation below remains for block-wise fp8 weights, float8-typed ones, and machines without a C++
compiler.

XLA:CPU has no fast integer or mixed-precision gemv: converting a whole 8-bit weight to
float32 and then calling the dot materialises 4x the bytes (5-10x slower than the float32 weight
itself, measured), multiply-and-reduce formulations become slow reduction loops (jax 0.10.2 sends
them to a YNNPACK fusion: ~50x slower), an int8 x int8 -> int32 dot is as slow as the whole
convert, and no XLA flag tried (xnn/ynn dot fusions, oneDNN) changed that. The best found walks the
weight ``[N, K]`` in chunks of rows whose float32 copy fits a core's L2: convert one chunk, let
Eigen multiply it, next chunk (``chunked_dequant_matmul``); memory traffic is then the 8-bit
weight only. On a shared 2-core machine it took 0.7-2.1x the float32 gemv chain's time (noise
too large to rank them); ``time_formulations`` is the measurement to repeat on an idle machine.

e4m3 weights: every elementwise op on a float8 array (even a same-width bitcast) runs about ten
times slower on XLA:CPU than on int8, so the fast path wants the weight's bytes typed int8
(``jaxinfer.quantization.quantized_weight.with_cpu_storage`` does that once, on the host, at no cost) and decodes
them with integer arithmetic (``e4m3_bits_to_float``); an e4m3-typed weight still works, slowly.
"""

from __future__ import annotations

import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.fp8_format import e4m3_bits_to_float

CHUNK_BYTES = 1 << 21  # float32 bytes of one converted chunk: about one core's L2 (2 MB here)
_DOT_NT = (((1,), (1,)), ((), ()))  # x [M, K] . w [rows, K] -> [M, rows]


def decode_weight(chunk: jax.Array, kind: str) -> jax.Array:
    """An 8-bit weight chunk as float32 values (unscaled). ``kind``: "int8" (integers), "e4m3"
    (float8_e4m3fn values) or "e4m3_bits" (e4m3 bit patterns typed int8)."""
    if kind == "e4m3_bits":
        return e4m3_bits_to_float(chunk)
    return chunk.astype(jnp.float32)


def chunk_rows(n: int, k: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Rows per chunk: a power of two with ``rows * K * 4 <= chunk_bytes`` (>= 8, <= N)."""
    rows = 8
    while rows * 2 * k * 4 <= chunk_bytes:
        rows *= 2
    return min(rows, n)


def chunked_dequant_matmul(x: jax.Array, w_q: jax.Array, kind: str, *,
                           block_scale: jax.Array | None = None,
                           block_shape: tuple[int, int] | None = None,
                           chunk_bytes: int = CHUNK_BYTES) -> jax.Array:
    """``x [M, K] (float32) @ decode(w_q [N, K]).T`` -> float32 ``[M, N]``.

    Unscaled, unless ``block_scale [ceil(N/BN), ceil(K/BK)]`` (with ``block_shape (BN, BK)``) is
    given: then each chunk is multiplied by its blocks' scales as it is decoded. A ``fori_loop``
    over row chunks of the weight; the last chunk is shifted back to end at N (it recomputes a few
    rows rather than padding, so the weight is never copied).
    """
    m = x.shape[0]
    n, k = w_q.shape
    rows = chunk_rows(n, k, chunk_bytes)
    x = x.astype(jnp.float32)

    def body(i, out):
        start = jnp.minimum(i * rows, n - rows)
        chunk = decode_weight(jax.lax.dynamic_slice_in_dim(w_q, start, rows, axis=0), kind)
        if block_scale is not None:
            block_rows = (start + jnp.arange(rows)) // block_shape[0]
            scales = jnp.repeat(block_scale[block_rows], block_shape[1], axis=1)[:, :k]
            chunk = chunk * scales
        return jax.lax.dynamic_update_slice_in_dim(out, jax.lax.dot_general(x, chunk, _DOT_NT),
                                                   start, axis=1)

    return jax.lax.fori_loop(0, -(-n // rows), body, jnp.zeros((m, n), jnp.float32))


# ----------------------------------------------------------------------------------------------
# Microbenchmark (not run by the tests; see ``time_formulations``)
# ----------------------------------------------------------------------------------------------


def _best_of(fn: Callable, args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - start)
    return best


def time_formulations(rows: tuple[int, ...] = (1, 4, 8, 16), shapes: tuple[tuple[int, int], ...] | None = None,
                      layers: int = 12, repeats: int = 10, seed: int = 0) -> list[dict]:
    """Time a dependent chain of ``[M, K] x [K, N]`` products per formulation and row count ``M``.

    ``shapes``: the (K, N) of one layer's weights, default the 134M Llama's (``llama-150m``: 4 x 768x768,
    2 x 768x2048, 2048x768), repeated ``layers`` times: hundreds of MB, so the chain streams from memory
    rather than the cache. Each product's input depends on the previous output (XLA cannot run them side by
    side). Formulations: XLA's float32 dot (weight ``[N, K]``, as the engine stores it on a CPU), the C++
    matvec kernel (``jaxinfer.cpu.ffi``) on float32 / int8 / e4m3 weights, and the chunked XLA dequantize
    for int8 (this module). Run it on an idle machine::

        python -c "from jaxinfer.cpu.quantized_matmul import time_formulations as t; [print(r) for r in t()]"
    """
    from jaxinfer.cpu import ffi as cpu_ffi

    shapes = shapes or ((768, 768),) * 4 + ((768, 2048),) * 2 + ((2048, 768),)
    shapes = shapes * layers
    rng = np.random.default_rng(seed)
    dense = [jnp.asarray(rng.standard_normal((n, k), dtype=np.float32) * 0.02) for k, n in shapes]
    ints = [jnp.asarray(rng.integers(-127, 128, (n, k), dtype=np.int8)) for k, n in shapes]
    scales = [jnp.asarray(rng.random(n, dtype=np.float32) * 0.01) for _, n in shapes]
    bits = [jnp.asarray(rng.integers(-126, 127, (n, k), dtype=np.int8) & np.int8(0x77)) for k, n in shapes]
    width = max(k for k, _ in shapes)

    def chain(matmul):
        def f(x, ws, ss):
            total = jnp.float32(0)
            for w, s in zip(ws, ss):
                t = jnp.sum(matmul(x[:, :w.shape[1]], w, s))
                total, x = total + t, x * (1 + 1e-12 * t)  # the next input depends on this output
            return total
        return jax.jit(f)

    cases = [("float32 XLA dot", chain(lambda x, w, s: jax.lax.dot_general(x, w, _DOT_NT)), dense, 4)]
    if cpu_ffi.available():
        cases += [("float32 kernel", chain(lambda x, w, s: cpu_ffi.matvec(x, w)), dense, 4),
                  ("int8 kernel", chain(lambda x, w, s: cpu_ffi.matvec(x, w, s, "int8")), ints, 1),
                  ("e4m3 kernel", chain(lambda x, w, s: cpu_ffi.matvec(x, w, s, "e4m3_bits")), bits, 1),
                  ("float32 gemm kernel", chain(lambda x, w, s: cpu_ffi.gemm(x, w)), dense, 4),
                  ("int8 gemm kernel", chain(lambda x, w, s: cpu_ffi.gemm(x, w, s, "int8")), ints, 1),
                  ("e4m3 gemm kernel", chain(lambda x, w, s: cpu_ffi.gemm(x, w, s, "e4m3_bits")), bits, 1)]
    if cpu_ffi.amx_available():
        cases += [("int8 AMX kernel", chain(lambda x, w, s: cpu_ffi.gemm_amx(x, w, s, "int8")), ints, 1),
                  ("e4m3 AMX kernel", chain(lambda x, w, s: cpu_ffi.gemm_amx(x, w, s, "e4m3_bits")), bits, 1)]
    cases.append(("int8 chunked XLA dequantize",
                  chain(lambda x, w, s: chunked_dequant_matmul(x, w, "int8") * s), ints, 1))
    results = []
    for m in rows:
        x = jnp.asarray(rng.standard_normal((m, width), dtype=np.float32))
        for name, fn, weights, itemsize in cases:
            seconds = _best_of(fn, (x, weights, scales), repeats)
            weight_bytes = sum(k * n for k, n in shapes) * itemsize
            results.append(dict(formulation=name, m=m, layers=layers, ms=round(seconds * 1e3, 3),
                                weight_mb=round(weight_bytes / 1e6, 1),
                                gb_per_s=round(weight_bytes / seconds / 1e9, 1)))
    return results
