"""Quantized matmuls on XLA:CPU: the formulation ``quantized_linear`` uses there, and the
microbenchmark that chose it.

XLA:CPU has no fast integer or mixed-precision gemv (FACTS.md): converting a whole 8-bit weight to
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
(``jaxinfer.quantization.with_cpu_storage`` does that once, on the host, at no cost) and decodes
them with integer arithmetic (``e4m3_bits_to_float``); an e4m3-typed weight still works, slowly.
"""

from __future__ import annotations

import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.quant_common import E4M3, e4m3_bits_to_float

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


def dequant_matmul(x: jax.Array, w_q: jax.Array, kind: str) -> jax.Array:
    """The plain formulation: decode the whole weight, one dot (what XLA does with ``x @ w``)."""
    return jax.lax.dot_general(x.astype(jnp.float32), decode_weight(w_q, kind), _DOT_NT)


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


def time_formulations(m: int = 1, k: int = 4096, n: int = 11008, layers: int = 6,
                      repeats: int = 10, chunk_bytes: tuple[int, ...] = (1 << 20, 1 << 21, 1 << 22),
                      seed: int = 0) -> list[dict]:
    """Time a chain of ``layers`` distinct ``[M, K] x [K, N]`` matmuls per formulation.

    A chain, because one matrix alone may sit in the last-level cache (this machine's L3 holds
    hundreds of MB) and flatter the float32 baseline. Returns one dict per formulation with its
    best time (ms), weight bytes read and the resulting GB/s. Run it on an idle machine::

        python -c "from jaxinfer.quant_cpu import time_formulations as t; [print(r) for r in t()]"
    """
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((m, k), dtype=np.float32))
    dense = [jnp.asarray(rng.standard_normal((k, n), dtype=np.float32) * 0.02) for _ in range(layers)]
    ints = [jnp.asarray(rng.integers(-127, 128, (n, k), dtype=np.int8)) for _ in range(layers)]
    fp8 = [jnp.asarray(np.asarray(w.T).astype(E4M3)) for w in dense]
    fp8_bits = [jnp.asarray(np.asarray(w).view(np.int8)) for w in fp8]

    def chain(matmul):  # every output is used, so XLA cannot drop any chunk's work
        return jax.jit(lambda x, ws: sum(jnp.sum(matmul(x, w)) for w in ws))

    float32 = ("float32 x @ w", chain(lambda x, w: x @ w), dense, 4)
    cases = [float32]
    cases.append(("int8 dequantize whole, dot", chain(lambda x, w: dequant_matmul(x, w, "int8")),
                  ints, 1))
    for size in chunk_bytes:
        for kind, weights in (("int8", ints), ("e4m3_bits", fp8_bits), ("e4m3", fp8)):
            fn = chain(lambda x, w, kind=kind, size=size: chunked_dequant_matmul(
                x, w, kind, chunk_bytes=size))
            cases.append((f"{kind} chunked ({size >> 10} KiB chunks)", fn, weights, 1))
    cases.append((float32[0] + " (again: drift = noise)",) + float32[1:])
    results = []
    for name, fn, weights, itemsize in cases:
        seconds = _best_of(fn, (x, weights), repeats)
        weight_bytes = layers * k * n * itemsize
        results.append(dict(formulation=name, m=m, k=k, n=n, layers=layers,
                            ms=round(seconds * 1e3, 3), weight_mb=round(weight_bytes / 1e6, 1),
                            gb_per_s=round(weight_bytes / seconds / 1e9, 1)))
    return results
