"""The JAX-facing side of the C++ CPU kernel: ``matvec`` as a ``jax.ffi`` call, its plain-jnp reference,
and when the engine uses it.

Weight kinds: "f32" (float32 ``[N, K]``), "int8" (int8 ``[N, K]`` with a float32 scale per output channel)
and "e4m3_bits" (float8_e4m3fn bit patterns typed int8, the fp8 weights' CPU storage, with the same scales).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxinfer.cpu_ffi import build

# The most activation rows (decode batch, or tokens of a step) the kernel takes, per weight kind. Measured
# on the 2-core Xeon (AVX-512) with the 134M Llama's weights (``jaxinfer.quant_cpu.time_formulations``, a
# dependent chain of its products), against XLA's float32 dot: the float32 kernel is 1.3x at 1 row, 2x at 4,
# 1.1x at 16 and slower from 32 rows; the int8 kernel 3.1x at 1 row, 1.7x at 16, 1.0x at 64, 1.1x at 256 and
# 0.91x at 512 (the best int8 formulation found at every size: XLA's chunked dequantize is 0.81x there); the
# e4m3 kernel (more decode arithmetic) 1.4x at 16 and 0.75x from 64, where XLA's chunked dequantize ties it.
MATVEC_MAX_ROWS = {"f32": 8, "int8": float("inf"), "e4m3_bits": 16}
KINDS = tuple(MATVEC_MAX_ROWS)


def use_matvec(rows: int, x_dtype, kind: str = "f32") -> bool:
    """Whether ``rows`` activation rows of ``x_dtype`` go to the kernel for a ``kind`` weight (building it
    the first time)."""
    return rows <= MATVEC_MAX_ROWS[kind] and jnp.dtype(x_dtype) == jnp.float32 and build.available()


def _check(x, w, scale, kind):
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"want x [M, K] and w [N, K], got {x.shape} and {w.shape}")
    want = jnp.float32 if kind == "f32" else jnp.int8
    if jnp.dtype(w.dtype) != jnp.dtype(want) or jnp.dtype(x.dtype) != jnp.float32:
        raise ValueError(f"kind {kind!r} wants x float32 and w {jnp.dtype(want)}, got {x.dtype} and {w.dtype}")
    if (scale is None) != (kind == "f32") or (scale is not None and tuple(scale.shape) != (w.shape[0],)):
        raise ValueError(f"kind {kind!r} takes {'no scale' if kind == 'f32' else f'a scale [{w.shape[0]}]'}")


def matvec(x: jax.Array, w: jax.Array, scale: jax.Array | None = None, kind: str = "f32") -> jax.Array:
    """``x [M, K] @ decode(w [N, K]).T * scale`` -> float32 ``[M, N]``, by the C++ kernel (fast for small M)."""
    _check(x, w, scale, kind)
    build.require()
    target = {"f32": "jaxinfer_matvec_f32", "int8": "jaxinfer_matvec_int8", "e4m3_bits": "jaxinfer_matvec_e4m3"}
    call = jax.ffi.ffi_call(target[kind], jax.ShapeDtypeStruct((x.shape[0], w.shape[0]), jnp.float32))
    return call(x, w) if scale is None else call(x, w, scale.astype(jnp.float32))


def decode_reference(w: jax.Array, kind: str) -> jax.Array:
    """The weight's values as float32 (plain jnp)."""
    if kind == "e4m3_bits":
        return jax.lax.bitcast_convert_type(w, jnp.float8_e4m3fn).astype(jnp.float32)
    return w.astype(jnp.float32)


def matvec_reference(x, w, scale=None, kind: str = "f32"):
    """``matvec`` in plain jnp (float32 at the highest precision)."""
    y = jnp.dot(x, decode_reference(w, kind).T, precision=jax.lax.Precision.HIGHEST)
    return y if scale is None else y * scale[None, :]

