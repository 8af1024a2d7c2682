"""FP8 W8A8 matmul (e4m3 x e4m3, per-channel weight scales, per-token activation scales): a Pallas
(Triton) kernel and its plain-jnp reference.

Semantics
---------
``fp8_matmul(x [M, K], w_q [N, K] e4m3, w_scale [N])`` returns ``x @ dequant(w).T`` as
``[M, N]`` in x's dtype, computed the FP8 way: a small XLA prologue quantizes each row (token) of
x to e4m3 with its own scale ``absmax(row) / 448`` (or with a static per-tensor ``input_scale``
from a checkpoint, saturating at +-448); the kernel multiplies e4m3 by e4m3 with float32
accumulation and applies both scales in its epilogue::

    out[m, n] = (sum_k xq[m, k] * w_q[n, k]) * x_scale[m] * w_scale[n]

The weight is stored ``[N, K]`` (K-major), so the dot's B operand is the K-major layout fp8
tensor cores want and no transpose is ever materialised.

Grid
----
``(cdiv(M, block_m), cdiv(N, block_n), split_k)``. One program owns a ``block_m x block_n``
output tile and walks its share of K ``block_k`` at a time; loads past M, N or K are masked (read
as zero), so no operand is padded or copied. Decode (M <= 16) uses 16-row tiles and, when the
output tiles alone would leave SMs idle, split-K: each split writes its scaled float32 partial
``[split_k, M, N]`` and a jnp sum merges them.

fp8 tensor cores exist from sm_89 (Ada, Hopper): on an A100 this refuses to run; use
``pallas_kernels.w8a16_matmul`` (weight-only, dequantized in the kernel) there.
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


@dataclasses.dataclass(frozen=True)
class _KernelConfig:
    m: int
    n: int
    k: int
    tiles: tiling.GemmTiles


# ----------------------------------------------------------------------------------------------
# 1. Kernel body
# ----------------------------------------------------------------------------------------------


def _fp8_matmul_kernel(x_ref, w_ref, x_scale_ref, w_scale_ref, out_ref, *, cfg: _KernelConfig):
    t = cfg.tiles
    row0 = pl.program_id(0) * t.block_m
    col0 = pl.program_id(1) * t.block_n
    lo, hi = tiling.split_k_range(pl.program_id(2), tiling.cdiv(cfg.k, t.block_k), t.split_k)

    def k_step(step, acc):
        k0 = step * t.block_k
        x = tiling.load_tile(x_ref, row0, t.block_m, k0, t.block_k, other=0.0)  # [bm, bk] e4m3
        w = tiling.load_tile(w_ref, col0, t.block_n, k0, t.block_k, other=0.0)  # [bn, bk] e4m3
        return acc + jax.lax.dot_general(x, w, (((1,), (1,)), ((), ())),
                                         preferred_element_type=jnp.float32)

    acc = jax.lax.fori_loop(lo, hi, k_step, jnp.zeros((t.block_m, t.block_n), jnp.float32))
    x_scale = tiling.load_vector(x_scale_ref, row0, t.block_m, other=0.0)
    w_scale = tiling.load_vector(w_scale_ref, col0, t.block_n, other=0.0)
    out = acc * x_scale[:, None] * w_scale[None, :]
    tiling.store_tile(out_ref, row0, col0, out, leading=(pl.program_id(2),) if t.split_k > 1 else ())


# ----------------------------------------------------------------------------------------------
# 2. pallas_call wrapper
# ----------------------------------------------------------------------------------------------


def _fp8_matmul_call(xq, w_q, x_scale, w_scale, *, cfg: _KernelConfig, out_dtype, interpret: bool):
    return tiling.tiled_matmul_call(functools.partial(_fp8_matmul_kernel, cfg=cfg), (xq, w_q, x_scale, w_scale), m=cfg.m, n=cfg.n, tiles=cfg.tiles,
                                out_dtype=out_dtype, interpret=interpret, name="fp8_matmul")


# ----------------------------------------------------------------------------------------------
# 3. Validated public function
# ----------------------------------------------------------------------------------------------


def _validate(x, w_q, w_scale, input_scale):
    tiling.check_matmul_operands(x, w_q, weight_dtypes=(fp8.E4M3,), name="fp8_matmul")
    if w_scale.shape != (w_q.shape[0],):
        raise ValueError(f"fp8_matmul: w_scale must be [N] = [{w_q.shape[0]}], got {w_scale.shape}")
    if input_scale is not None and input_scale.size != 1:
        raise ValueError(f"fp8_matmul: input_scale must be a scalar (per-tensor), got shape "
                         f"{input_scale.shape}")


@functools.partial(jax.jit, static_argnames=(
    "out_dtype", "interpret", "block_m", "block_n", "block_k", "split_k", "num_warps",
    "num_stages"))
def fp8_matmul(x, w_q, w_scale, input_scale=None, *, out_dtype=None,
               interpret: bool | None = None, block_m: int | None = None,
               block_n: int | None = None, block_k: int | None = None,
               split_k: int | None = None, num_warps: int | None = None,
               num_stages: int | None = None):
    """``x [M, K] @ (w_q [N, K] e4m3 * w_scale [N, None]).T`` the W8A8 way (module docstring).

    ``input_scale``: None for dynamic per-token activation scales, else a per-tensor scalar.
    Knobs (None = automatic): tile sizes (powers of two >= 16; block_k >= 32), ``split_k``,
    ``num_warps`` / ``num_stages`` for Triton. ``interpret=None`` interprets the kernel unless the
    default backend is a GPU. Returns ``[M, N]`` in ``out_dtype`` (default: x's dtype).
    """
    _validate(x, w_q, w_scale, input_scale)
    interpret = gpu_target.resolve_interpret(interpret)
    gpu_target.require_fp8_tensor_cores(interpret, "fp8 W8A8", "Use the weight-only kernel "
                                "pallas_kernels.w8a16_matmul (quantization='fp8_w8a16') instead.")
    m, k = x.shape
    n = w_q.shape[0]
    tiles = tiling.resolve_tiles(m, n, k, operand_bytes=1, block_m=block_m, block_n=block_n,
                             block_k=block_k, split_k=split_k, num_warps=num_warps,
                             num_stages=num_stages)
    xq, x_scale = fp8.quantize_rows_fp8(x, input_scale)
    out_dtype = jnp.dtype(x.dtype if out_dtype is None else out_dtype)
    return _fp8_matmul_call(xq, w_q, x_scale, w_scale.astype(jnp.float32),
                            cfg=_KernelConfig(m, n, k, tiles), out_dtype=out_dtype,
                            interpret=interpret)


# ----------------------------------------------------------------------------------------------
# 4. Plain-jnp reference
# ----------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("out_dtype",))
def fp8_matmul_reference(x, w_q, w_scale, input_scale=None, *, out_dtype=None):
    """Same contract as ``fp8_matmul``: quantize x per token, dequantize both, one float32 dot."""
    xq, x_scale = fp8.quantize_rows_fp8(x, input_scale)
    x_deq = xq.astype(jnp.float32) * x_scale[:, None]
    w_deq = w_q.astype(jnp.float32) * w_scale.astype(jnp.float32)[:, None]
    out = jnp.dot(x_deq, w_deq.T, precision=jax.lax.Precision.HIGHEST)
    return out.astype(x.dtype if out_dtype is None else out_dtype)
