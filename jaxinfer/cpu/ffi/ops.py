"""The JAX-facing side of the C++ matrix-product kernels: ``matvec`` and ``gemm`` as ``jax.ffi`` calls, their
plain-jnp reference, and which one the engine uses for how many rows (``kernel_for``, ``product``).

Weight kinds: "f32" (float32 ``[N, K]``), "int8" (int8 ``[N, K]`` with a float32 scale per output channel)
and "e4m3_bits" (float8_e4m3fn bit patterns typed int8, the fp8 weights' CPU storage, with the same scales),
and "bf16" (bfloat16 ``[N, K]``, no scale: a ``dtype="bfloat16"`` model's weights on a CPU, float32 activations).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxinfer.cpu.ffi import build

# Which C++ kernel takes a product of M activation rows, per weight kind: the matvec kernel up to
# MATVEC_MAX_ROWS, the gemm kernel from GEMM_MIN_ROWS, XLA's own dot otherwise (float32 only). Measured on the
# 2-core Xeon (AVX-512) over a dependent chain of the 134M Llama's products (4 layers,
# ``jaxinfer.cpu.quantized_matmul.time_formulations``), in ms at M = 1 / 8 / 16 / 32 / 48 / 64 / 128:
#   float32  XLA dot 5.1 / 10.0 / 11.0 / 13.2 / 15.3 / 18.1 / 43.9; matvec 3.0 / 5.4 / 7.5 / 12.1 / 16.4 / 20.8
#   int8     matvec 1.1 / 2.9 / 4.8 / 10.3 / 12.9 / 17.3; gemm 8.6 at 16, 9.0 at 32, 15.0 / 16.0 / 28.4
#   e4m3     matvec 1.9 / 3.7 / 6.4 / 13.5; gemm 9.5 at 16, 9.9 at 32, 15.5 / 15.4 / 28.6
# (the matvec kernel streams the weight: best while reading it dominates; the gemm kernel widens it to float32
# once and is bound by arithmetic; at 512 rows gemm int8 / e4m3 108 ms vs XLA float32 116). Inside the model
# (``jaxinfer-bench quant``) XLA's float32 dot beat the gemm kernel where the chain called them even or the
# kernel ahead (its dots fuse their neighbours; a custom call fuses nothing): decode at batch 128 216-221 vs
# 232-238 ms, prefill of 256 tokens 195 vs 227-235 ms and of 512 424-431 vs 455-497 ms; so float32 never takes
# the gemm kernel, and its matvec threshold keeps the chain's clear margin (1.5x at 16 rows, 1.1x at 32).
# On CPUs with AMX tiles the 8-bit products from AMX_MIN_ROWS rows go to ``gemm_amx`` (bfloat16 tiles, the
# activations split exactly into three terms), measured per call on the same Xeon (min of 40, ms, int8,
# [K, N] = 768x768 / 768x2048 / 2048x768): 16 rows AMX 0.081 / 0.263 / 0.221 vs matvec 0.095 / 0.248 / 0.244;
# 32 rows 0.118 / 0.298 / 0.279 vs matvec 0.175 / 0.466 / 0.487; 512 rows 1.23 / 2.14 / 2.57 vs XLA's float32
# dot 2.04 / 5.44 / 5.67 (1.7-2.5x; the gemm kernel is ~0.85x XLA there). In the model (quant bench,
# bench/results/cpu-2026-12-01-session9) a 512-token prefill takes 256 ms with int8 weights, 425 with float32.
# bfloat16 weights: the matvec kernel up to 64 rows (it reads them once, in their width; XLA's dot beyond, on the
# weight widened to float32 in the graph)
MATVEC_MAX_ROWS = {"f32": 16, "int8": 16, "e4m3_bits": 16, "bf16": 64}
GEMM_MIN_ROWS = {"f32": float("inf"), "int8": 17, "e4m3_bits": 17, "bf16": float("inf")}
AMX_MIN_ROWS = {"f32": float("inf"), "int8": 17, "e4m3_bits": 17, "bf16": float("inf")}
UNSCALED = ("f32", "bf16")
KINDS = tuple(MATVEC_MAX_ROWS)
GEMM_KINDS = ("f32", "int8", "e4m3_bits")  # the gemm kernel's (bfloat16 weights beyond 64 rows go to XLA)


def kernel_for(rows: int, x_dtype, kind: str = "f32") -> str | None:
    """"matvec", "gemm", "gemm_amx" or None (XLA) for a product of ``rows`` activation rows of ``x_dtype`` with a
    ``kind`` weight. Safe inside a trace: it only asks whether the kernels are loaded (``build.loaded()``)."""
    if jnp.dtype(x_dtype) != jnp.float32 or not build.loaded():
        return None
    if rows <= MATVEC_MAX_ROWS[kind]:
        return "matvec"
    if rows >= AMX_MIN_ROWS[kind] and build.amx_loaded():
        return "gemm_amx"
    return "gemm" if rows >= GEMM_MIN_ROWS[kind] else None


def _check(x, w, scale, kind):
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"want x [M, K] and w [N, K], got {x.shape} and {w.shape}")
    want = {"f32": jnp.float32, "bf16": jnp.bfloat16}.get(kind, jnp.int8)
    if jnp.dtype(w.dtype) != jnp.dtype(want) or jnp.dtype(x.dtype) != jnp.float32:
        raise ValueError(f"kind {kind!r} wants x float32 and w {jnp.dtype(want)}, got {x.dtype} and {w.dtype}")
    if (scale is None) != (kind in UNSCALED) or (scale is not None and tuple(scale.shape) != (w.shape[0],)):
        raise ValueError(f"kind {kind!r} takes {'no scale' if kind in UNSCALED else f'a scale [{w.shape[0]}]'}")


def _call(algorithm: str, x, w, scale, kind):
    _check(x, w, scale, kind)
    if algorithm != "matvec" and kind not in GEMM_KINDS:
        raise ValueError(f"the {algorithm} kernel takes kinds {GEMM_KINDS}, not {kind!r} (matvec does)")
    build.require(x, w)
    target = f"jaxinfer_{algorithm}_{'e4m3' if kind == 'e4m3_bits' else kind}"
    call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((x.shape[0], w.shape[0]), jnp.float32))
    return call(x, w) if scale is None else call(x, w, scale.astype(jnp.float32))


def product(x: jax.Array, w: jax.Array, scale: jax.Array | None = None, kind: str = "f32") -> jax.Array | None:
    """``x [M, K] @ decode(w [N, K]).T * scale`` by the kernel ``kernel_for`` picks, or None where XLA's dot is
    the faster formulation or the kernels are not loaded (an eager call loads them the first time; a traced one
    never does: ``build.load()`` first)."""
    build.ensure_loaded_for(x, w)
    algorithm = kernel_for(x.shape[0], x.dtype, kind)
    return None if algorithm is None else _call(algorithm, x, w, scale, kind)


def matvec(x: jax.Array, w: jax.Array, scale: jax.Array | None = None, kind: str = "f32") -> jax.Array:
    """``x [M, K] @ decode(w [N, K]).T * scale`` -> float32 ``[M, N]``, by the C++ matvec kernel: each weight
    row's dot products with up to 8 activation rows at a time (fast for small M: it streams the weight)."""
    return _call("matvec", x, w, scale, kind)


def gemm(x: jax.Array, w: jax.Array, scale: jax.Array | None = None, kind: str = "f32") -> jax.Array:
    """The same product by the C++ gemm kernel: register tiles of outer products over panels of the weight
    widened to float32 once (fast for large M: arithmetic-bound)."""
    return _call("gemm", x, w, scale, kind)


def gemm_amx(x: jax.Array, w: jax.Array, scale: jax.Array, kind: str = "int8") -> jax.Array:
    """The same product (8-bit kinds only) on AMX tiles: the float32 activations split exactly into three
    bfloat16 terms, the weight packed as bfloat16 once per call (needs ``build.amx_available()``)."""
    if kind in UNSCALED:
        raise ValueError("gemm_amx takes 8-bit weights (kind 'int8' or 'e4m3_bits'), not 'f32'")
    build.require(x, w)
    if not build.amx_loaded():
        raise RuntimeError("AMX tiles are not usable here (CPU, OS or JAXINFER_CPU_AMX=0)")
    return _call("gemm_amx", x, w, scale, kind)


def decode_reference(w: jax.Array, kind: str) -> jax.Array:
    """The weight's values as float32 (plain jnp)."""
    if kind == "e4m3_bits":
        return jax.lax.bitcast_convert_type(w, jnp.float8_e4m3fn).astype(jnp.float32)
    return w.astype(jnp.float32)


def matvec_reference(x, w, scale=None, kind: str = "f32"):
    """``matvec`` in plain jnp (float32 at the highest precision)."""
    y = jnp.dot(x, decode_reference(w, kind).T, precision=jax.lax.Precision.HIGHEST)
    return y if scale is None else y * scale[None, :]

