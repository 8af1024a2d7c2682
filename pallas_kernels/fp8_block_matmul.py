"""Block-wise FP8 matmul (128 x 128 weight blocks, 1 x 128 activation groups; the DeepSeek-V3 /
Qwen3-FP8 format): a Pallas (Triton) kernel and its plain-jnp reference.

Semantics
---------
``fp8_block_matmul(x [M, K], w_q [N, K] e4m3, w_scale [ceil(N / BN), ceil(K / BK)])`` with
weight blocks ``(BN, BK)`` (default 128 x 128) returns ``x @ dequant(w).T`` as ``[M, N]`` in x's
dtype, where ``dequant(w)[n, k] = w_q[n, k] * w_scale[n // BN, k // BK]``. (Checkpoints call this
scale ``weight_scale_inv``: it multiplies to dequantize despite its name.) The activations are
quantized dynamically per token and per group of ``BK`` columns in an XLA prologue
(``x_scale [M, ceil(K / BK)]``), so every K step of ``BK`` columns is one e4m3 dot whose float32
result is scaled by ``x_scale[:, g]`` (per row) times ``w_scale[n // BN, g]`` (one number per
program, as ``block_n`` divides ``BN``) before it joins the accumulator::

    out[m, n] = sum_g x_scale[m, g] * w_scale[n // BN, g] * sum_{k in group g} xq[m, k] * w_q[n, k]

The last group may be partial (K not a multiple of BK); loads past M, N, K are masked.

Grid ``(cdiv(M, block_m), cdiv(N, block_n), split_k)`` with ``block_k = BK``; split-K partials are
float32 and summed in jnp, as in ``fp8_matmul``. Needs fp8 tensor cores (sm_89+).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from pallas_kernels import fp8_format as fp8
from pallas_kernels import gpu_target
from pallas_kernels import matmul_tiling as tiling

DEFAULT_BLOCK_SHAPE = (128, 128)


@dataclasses.dataclass(frozen=True)
class _KernelConfig:
    m: int
    n: int
    k: int
    tiles: tiling.GemmTiles
    weight_block_n: int  # BN: rows of w_q per weight-scale block


# ----------------------------------------------------------------------------------------------
# 1. Kernel body
# ----------------------------------------------------------------------------------------------


def _fp8_block_matmul_kernel(x_ref, w_ref, x_scale_ref, w_scale_ref, out_ref, *,
                             cfg: _KernelConfig):
    t = cfg.tiles
    row0 = pl.program_id(0) * t.block_m
    col0 = pl.program_id(1) * t.block_n
    weight_block_row = col0 // cfg.weight_block_n  # block_n divides BN: one scale row per program
    lo, hi = tiling.split_k_range(pl.program_id(2), tiling.cdiv(cfg.k, t.block_k), t.split_k)
    rows_in_bounds = None
    if cfg.m % t.block_m:
        rows_in_bounds = row0 + jnp.arange(t.block_m, dtype=jnp.int32) < cfg.m

    def k_step(group, acc):
        k0 = group * t.block_k
        x = tiling.load_tile(x_ref, row0, t.block_m, k0, t.block_k, other=0.0)  # [bm, BK] e4m3
        w = tiling.load_tile(w_ref, col0, t.block_n, k0, t.block_k, other=0.0)  # [bn, BK] e4m3
        x_scale = plt.load(x_scale_ref.at[pl.ds(row0, t.block_m), group], mask=rows_in_bounds,
                           other=None if rows_in_bounds is None else 0.0)  # [bm]
        w_scale = w_scale_ref[weight_block_row, group]  # scalar
        partial = jax.lax.dot_general(x, w, (((1,), (1,)), ((), ())),
                                      preferred_element_type=jnp.float32)
        return acc + partial * (x_scale * w_scale)[:, None]

    acc = jax.lax.fori_loop(lo, hi, k_step, jnp.zeros((t.block_m, t.block_n), jnp.float32))
    tiling.store_tile(out_ref, row0, col0, acc, leading=(pl.program_id(2),) if t.split_k > 1 else ())


# ----------------------------------------------------------------------------------------------
# 2. pallas_call wrapper
# ----------------------------------------------------------------------------------------------


def _fp8_block_matmul_call(xq, w_q, x_scale, w_scale, *, cfg: _KernelConfig, out_dtype,
                           interpret: bool):
    return tiling.tiled_matmul_call(functools.partial(_fp8_block_matmul_kernel, cfg=cfg), (xq, w_q, x_scale, w_scale), m=cfg.m, n=cfg.n, tiles=cfg.tiles,
                                out_dtype=out_dtype, interpret=interpret, name="fp8_block_matmul")


# ----------------------------------------------------------------------------------------------
# 3. Validated public function
# ----------------------------------------------------------------------------------------------


def _validate(x, w_q, w_scale, block_shape):
    tiling.check_matmul_operands(x, w_q, weight_dtypes=(fp8.E4M3,), name="fp8_block_matmul")
    if (len(block_shape) != 2 or not all(tiling.is_power_of_2(b) and b >= 32 for b in block_shape)):
        raise ValueError(f"fp8_block_matmul: block_shape must be two powers of two >= 32, got "
                         f"{block_shape!r}")
    n, k = w_q.shape
    want = (tiling.cdiv(n, block_shape[0]), tiling.cdiv(k, block_shape[1]))
    if w_scale.shape != want:
        raise ValueError(f"fp8_block_matmul: w_scale must be [ceil(N/{block_shape[0]}), "
                         f"ceil(K/{block_shape[1]})] = {list(want)} for w_q {list(w_q.shape)}, got "
                         f"{list(w_scale.shape)}")


@functools.partial(jax.jit, static_argnames=(
    "block_shape", "out_dtype", "interpret", "block_m", "block_n", "split_k", "num_warps",
    "num_stages"))
def fp8_block_matmul(x, w_q, w_scale, *, block_shape: tuple[int, int] = DEFAULT_BLOCK_SHAPE,
                     out_dtype=None, interpret: bool | None = None, block_m: int | None = None,
                     block_n: int | None = None, split_k: int | None = None,
                     num_warps: int | None = None, num_stages: int | None = None):
    """Block-wise FP8 ``x [M, K] @ dequant(w_q [N, K], w_scale).T`` (see the module docstring).

    ``block_shape``: the weight-scale block ``(BN, BK)``; activations are grouped by BK. Knobs
    (None = automatic): ``block_m``, ``block_n`` (must divide BN), ``split_k``, Triton's
    ``num_warps`` / ``num_stages``. Returns ``[M, N]`` in ``out_dtype`` (default: x's dtype).
    """
    block_shape = tuple(block_shape)
    _validate(x, w_q, w_scale, block_shape)
    interpret = gpu_target.resolve_interpret(interpret)
    gpu_target.require_fp8_tensor_cores(interpret, "block-wise fp8", "Load the checkpoint dequantized "
                                "(jaxinfer.quantization.quantized_weight.dequantize) instead.")
    m, k = x.shape
    n = w_q.shape[0]
    weight_block_n, group = block_shape
    tiles = tiling.resolve_tiles(m, n, k, operand_bytes=1, block_m=block_m, block_n=block_n,
                             block_k=group, split_k=split_k, num_warps=num_warps,
                             num_stages=num_stages, max_block_n=weight_block_n,
                             fixed_block_k=group)
    xq, x_scale = fp8.quantize_groups_fp8(x, group)
    out_dtype = jnp.dtype(x.dtype if out_dtype is None else out_dtype)
    cfg = _KernelConfig(m, n, k, tiles, weight_block_n)
    return _fp8_block_matmul_call(xq, w_q, x_scale, w_scale.astype(jnp.float32), cfg=cfg,
                                  out_dtype=out_dtype, interpret=interpret)


# ----------------------------------------------------------------------------------------------
# 4. Plain-jnp reference
# ----------------------------------------------------------------------------------------------


def dequantize_blocks(w_q, w_scale, block_shape=DEFAULT_BLOCK_SHAPE):
    """``w_q [N, K] * w_scale`` expanded over its ``block_shape`` blocks, in float32."""
    n, k = w_q.shape
    expanded = jnp.repeat(jnp.repeat(w_scale.astype(jnp.float32), block_shape[0], axis=0),
                          block_shape[1], axis=1)[:n, :k]
    return w_q.astype(jnp.float32) * expanded


@functools.partial(jax.jit, static_argnames=("block_shape", "out_dtype"))
def fp8_block_matmul_reference(x, w_q, w_scale, *, block_shape=DEFAULT_BLOCK_SHAPE,
                               out_dtype=None):
    """Same contract as ``fp8_block_matmul``: quantize x per (token, group), dequantize both, one
    float32 dot."""
    block_shape = tuple(block_shape)
    group = block_shape[1]
    xq, x_scale = fp8.quantize_groups_fp8(x, group)
    x_deq = xq.astype(jnp.float32) * jnp.repeat(x_scale, group, axis=1)[:, :x.shape[1]]
    out = jnp.dot(x_deq, dequantize_blocks(w_q, w_scale, block_shape).T,
                  precision=jax.lax.Precision.HIGHEST)
    return out.astype(x.dtype if out_dtype is None else out_dtype)
