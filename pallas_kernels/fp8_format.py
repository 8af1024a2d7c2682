"""The fp8 / int8 formats the quantized kernels and the engine share: constants, scales, quantization of
activations (plain jnp: the kernels' prologues and references) and an integer-only e4m3 decoder.

Conventions (the same everywhere in jaxinfer):

* e4m3 is ``float8_e4m3fn``: largest finite value 448, no infinities. Values are always clipped to
  +-448 before the cast, so nothing saturates to NaN.
* A scale multiplies to dequantize: ``real = quantized * scale`` (``scale = absmax / 448`` for fp8,
  ``absmax / 127`` for int8). An all-zero row or block gets scale 1 and quantizes to zeros.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

E4M3 = jnp.dtype(jnp.float8_e4m3fn)
E4M3_MAX = 448.0
INT8_MAX = 127.0

def absmax_scale(absmax: jax.Array, qmax: float) -> jax.Array:
    """``absmax / qmax`` in float32, or 1 where absmax is 0 (so zeros quantize to zeros)."""
    absmax = absmax.astype(jnp.float32)
    return jnp.where(absmax > 0.0, absmax / qmax, 1.0)


def saturate_to_e4m3(values: jax.Array) -> jax.Array:
    """Round float32 values to e4m3, clipping to +-448 first (a plain cast would give NaN)."""
    return jnp.clip(values, -E4M3_MAX, E4M3_MAX).astype(E4M3)


def quantize_rows_fp8(x: jax.Array, static_scale: jax.Array | None = None):
    """Per-token (row) e4m3 quantization of ``x [M, K]``: ``(xq [M, K] e4m3, scale [M] f32)``.

    ``static_scale`` (a scalar, e.g. a checkpoint's ``input_scale``) replaces the dynamic absmax
    scale; values beyond ``448 * static_scale`` then saturate.
    """
    x = x.astype(jnp.float32)
    if static_scale is None:
        scale = absmax_scale(jnp.max(jnp.abs(x), axis=1), E4M3_MAX)
    else:
        scale = jnp.broadcast_to(jnp.asarray(static_scale, jnp.float32).reshape(()), x.shape[:1])
    return saturate_to_e4m3(x / scale[:, None]), scale


def quantize_groups_fp8(x: jax.Array, group: int):
    """Per-token, per-``group`` columns e4m3 quantization of ``x [M, K]`` (DeepSeek-V3's 1 x 128).

    Returns ``(xq [M, K] e4m3, scale [M, ceil(K / group)] f32)``; the last group may be partial.
    """
    m, k = x.shape
    num_groups = -(-k // group)
    padded = jnp.pad(x.astype(jnp.float32), ((0, 0), (0, num_groups * group - k)))
    grouped = padded.reshape(m, num_groups, group)
    scale = absmax_scale(jnp.max(jnp.abs(grouped), axis=2), E4M3_MAX)
    xq = saturate_to_e4m3(grouped / scale[:, :, None]).reshape(m, num_groups * group)[:, :k]
    return xq, scale


def e4m3_bits_to_float(bits: jax.Array) -> jax.Array:
    """Decode e4m3 (``float8_e4m3fn``) bit patterns, given as unsigned or int32 values, to float32.

    Integer and bit operations only, so it also runs where no fp8 conversion exists (Triton on
    sm80, where Pallas refuses to cast from e4m3). Normal numbers are rebuilt as float32 bits
    (exponent rebased from bias 7 to 127); subnormals as ``mantissa * 2**-9``, so no float32
    subnormal (which a GPU may flush) is ever formed. The NaN pattern (0x7f/0xff) decodes to
    +-480; quantization here never produces it.
    """
    b = bits.astype(jnp.int32)
    sign_bit = jax.lax.shift_left(b & 0x80, 24)
    normal_bits = jax.lax.shift_left(b & 0x7F, 20) + (120 << 23)
    normal = jax.lax.bitcast_convert_type(sign_bit | normal_bits, jnp.float32)
    subnormal = (b & 0x07).astype(jnp.float32) * (2.0**-9)
    subnormal = jnp.where((b & 0x80) != 0, -subnormal, subnormal)
    return jnp.where((b & 0x78) == 0, subnormal, normal)
