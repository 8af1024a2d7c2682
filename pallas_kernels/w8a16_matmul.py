"""Weight-only W8A16 matmul (int8 or e4m3 weights, per-channel scales, 16/32-bit activations): a
Pallas (Triton) kernel and its plain-jnp reference.

Semantics
---------
``w8a16_matmul(x [M, K], w_q [N, K], w_scale [N])`` returns ``x @ (w_q * w_scale[:, None]).T``
as ``[M, N]`` in x's dtype. Activations are not quantized: the kernel reads the 8-bit weight tile,
converts it to x's dtype in registers (exact: int8 and e4m3 values are all representable in
bfloat16, float16 and float32), multiplies in x's dtype with float32 accumulation (IEEE for
float32 inputs) and applies the per-channel scale once in the epilogue. Only 8-bit weights are
read from memory, which is the point at decode.

This is the path for GPUs without fp8 tensor cores (A100, sm_80). Triton cannot even convert from
e4m3 there (Pallas refuses the cast below sm_89), so fp8 weights are decoded from their bits
(``fp8_decode="bits"``: the wrapper reinterprets them as uint8, a free bitcast, and the kernel
rebuilds each value with integer operations, see ``matmul_tiling.e4m3_bits_to_float``). On sm_89+
``fp8_decode="native"`` converts with the hardware instruction. ``None`` picks per platform.

Grid, masking and split-K are as in ``fp8_matmul``: ``(cdiv(M, block_m), cdiv(N, block_n),
split_k)``, masked loads past M, N, K, scaled float32 partials merged by a jnp sum.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels import fp8_format as fp8
from pallas_kernels import gpu_target
from pallas_kernels import matmul_tiling as tiling

WEIGHT_DTYPES = (jnp.dtype(jnp.int8), fp8.E4M3)
FP8_DECODES = ("native", "bits")


@dataclasses.dataclass(frozen=True)
class _KernelConfig:
    m: int
    n: int
    k: int
    tiles: tiling.GemmTiles
    weight_kind: str  # "int8" | "e4m3" (native convert) | "e4m3_bits" (uint8 bit patterns)
    precise_dots: bool  # float32 activations: IEEE dots, not TF32


def _dequantize_tile(w, weight_kind: str, dtype):
    """8-bit weight tile -> x's dtype, without its scale (applied in the epilogue)."""
    if weight_kind == "e4m3_bits":
        return fp8.e4m3_bits_to_float(w).astype(dtype)
    return w.astype(dtype)


# ----------------------------------------------------------------------------------------------
# 1. Kernel body
# ----------------------------------------------------------------------------------------------


def _w8a16_matmul_kernel(x_ref, w_ref, w_scale_ref, out_ref, *, cfg: _KernelConfig):
    t = cfg.tiles
    row0 = pl.program_id(0) * t.block_m
    col0 = pl.program_id(1) * t.block_n
    lo, hi = tiling.split_k_range(pl.program_id(2), tiling.cdiv(cfg.k, t.block_k), t.split_k)
    precision = jax.lax.Precision.HIGHEST if cfg.precise_dots else None
    w_zero = 0.0 if cfg.weight_kind == "e4m3" else 0  # a float literal for an fp8 ref

    def k_step(step, acc):
        k0 = step * t.block_k
        x = tiling.load_tile(x_ref, row0, t.block_m, k0, t.block_k, other=0.0)  # [bm, bk]
        w = tiling.load_tile(w_ref, col0, t.block_n, k0, t.block_k, other=w_zero)  # [bn, bk] 8-bit
        w = _dequantize_tile(w, cfg.weight_kind, x.dtype)
        return acc + jax.lax.dot_general(x, w, (((1,), (1,)), ((), ())), precision=precision,
                                         preferred_element_type=jnp.float32)

    acc = jax.lax.fori_loop(lo, hi, k_step, jnp.zeros((t.block_m, t.block_n), jnp.float32))
    w_scale = tiling.load_vector(w_scale_ref, col0, t.block_n, other=0.0)
    out = acc * w_scale[None, :]
    tiling.store_tile(out_ref, row0, col0, out, leading=(pl.program_id(2),) if t.split_k > 1 else ())


# ----------------------------------------------------------------------------------------------
# 2. pallas_call wrapper
# ----------------------------------------------------------------------------------------------


def _w8a16_matmul_call(x, w_q, w_scale, *, cfg: _KernelConfig, interpret: bool):
    if cfg.weight_kind == "e4m3_bits":
        w_q = jax.lax.bitcast_convert_type(w_q, jnp.uint8)  # same bytes; no fp8 type in the kernel
    return tiling.tiled_matmul_call(functools.partial(_w8a16_matmul_kernel, cfg=cfg), (x, w_q, w_scale), m=cfg.m, n=cfg.n, tiles=cfg.tiles,
                                out_dtype=x.dtype, interpret=interpret, name="w8a16_matmul")


# ----------------------------------------------------------------------------------------------
# 3. Validated public function
# ----------------------------------------------------------------------------------------------


def default_fp8_decode(interpret: bool) -> str:
    """"bits" on a GPU older than sm_89 (no e4m3 conversion there), else "native" (also in
    interpret mode and when cross-lowering without a GPU: pass "bits" to target an A100)."""
    capability = None if interpret else gpu_target.gpu_compute_capability()
    return "bits" if capability is not None and not gpu_target.has_fp8_tensor_cores(capability) else "native"


def _validate(x, w_q, w_scale, fp8_decode):
    tiling.check_matmul_operands(x, w_q, weight_dtypes=WEIGHT_DTYPES, name="w8a16_matmul")
    if w_scale.shape != (w_q.shape[0],):
        raise ValueError(f"w8a16_matmul: w_scale must be [N] = [{w_q.shape[0]}], got {w_scale.shape}")
    if fp8_decode is not None and fp8_decode not in FP8_DECODES:
        raise ValueError(f"w8a16_matmul: fp8_decode must be None or one of {FP8_DECODES}, got "
                         f"{fp8_decode!r}")


@functools.partial(jax.jit, static_argnames=(
    "fp8_decode", "interpret", "block_m", "block_n", "block_k", "split_k", "num_warps",
    "num_stages"))
def w8a16_matmul(x, w_q, w_scale, *, fp8_decode: str | None = None,
                 interpret: bool | None = None, block_m: int | None = None,
                 block_n: int | None = None, block_k: int | None = None,
                 split_k: int | None = None, num_warps: int | None = None,
                 num_stages: int | None = None):
    """``x [M, K] @ (w_q [N, K] * w_scale [N, None]).T``, weights dequantized in the kernel.

    ``w_q`` is int8 or float8_e4m3fn; ``fp8_decode`` ("native" | "bits" | None = per platform)
    says how e4m3 weights become numbers (module docstring). Other knobs as in ``fp8_matmul``.
    Returns ``[M, N]`` in x's dtype.
    """
    _validate(x, w_q, w_scale, fp8_decode)
    interpret = gpu_target.resolve_interpret(interpret)
    m, k = x.shape
    n = w_q.shape[0]
    if jnp.dtype(w_q.dtype) == jnp.dtype(jnp.int8):
        weight_kind = "int8"
    else:
        decode = default_fp8_decode(interpret) if fp8_decode is None else fp8_decode
        weight_kind = "e4m3" if decode == "native" else "e4m3_bits"
    tiles = tiling.resolve_tiles(m, n, k, operand_bytes=x.dtype.itemsize, block_m=block_m,
                             block_n=block_n, block_k=block_k, split_k=split_k,
                             num_warps=num_warps, num_stages=num_stages)
    cfg = _KernelConfig(m, n, k, tiles, weight_kind,
                        precise_dots=jnp.dtype(x.dtype) == jnp.dtype(jnp.float32))
    return _w8a16_matmul_call(x, w_q, w_scale.astype(jnp.float32), cfg=cfg, interpret=interpret)


# ----------------------------------------------------------------------------------------------
# 4. Plain-jnp reference
# ----------------------------------------------------------------------------------------------


@jax.jit
def w8a16_matmul_reference(x, w_q, w_scale):
    """Same contract as ``w8a16_matmul``: dequantize the weight, one float32 dot."""
    w_deq = w_q.astype(jnp.float32) * w_scale.astype(jnp.float32)[:, None]
    out = jnp.dot(x.astype(jnp.float32), w_deq.T, precision=jax.lax.Precision.HIGHEST)
    return out.astype(x.dtype)
