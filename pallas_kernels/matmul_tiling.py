"""How the quantized-matmul kernels tile their work: tile and split-K choices, operand checks, the in-kernel
masked loads and stores, and the one ``pallas_call`` wrapper they share.

The kernels (``fp8_matmul``, ``w8a16_matmul``, ``fp8_block_matmul``) all compute ``x @ w.T`` with
``w`` stored ``[N, K]`` (K-major, the layout HF checkpoints use and the one an fp8 tensor-core dot
wants for its B operand) on Triton, tiled ``block_m x block_n`` with a K loop of ``block_k`` and an
optional split-K. Their number formats are ``fp8_format``; the GPU they target, ``gpu_target``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

ACTIVATION_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32))

_MIN_DOT_DIM = 16  # Triton's tensor-core dot wants every matmul dimension >= 16
_TARGET_PROGRAMS = 264  # split-K aims for about two programs per SM of an H100/H200 (132 SMs)
_MIN_K_STEPS_PER_SPLIT = 4
_MAX_SPLIT_K = 16


def cdiv(a, b):
    return (a + b - 1) // b


def next_power_of_2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def is_power_of_2(n: int) -> bool:
    return isinstance(n, int) and n > 0 and n & (n - 1) == 0


# ----------------------------------------------------------------------------------------------
# Tiles
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GemmTiles:
    """Static launch shape of one quantized matmul: tile sizes, split-K and Triton knobs."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int


def default_split_k(m: int, n: int, k: int, block_m: int, block_n: int, block_k: int) -> int:
    """Split K only when the output tiles alone leave most SMs idle (decode shapes)."""
    programs = cdiv(m, block_m) * cdiv(n, block_n)
    k_steps = cdiv(k, block_k)
    if programs >= _TARGET_PROGRAMS // 2 or k_steps < 2 * _MIN_K_STEPS_PER_SPLIT:
        return 1
    return max(1, min(_MAX_SPLIT_K, cdiv(_TARGET_PROGRAMS, programs),
                      k_steps // _MIN_K_STEPS_PER_SPLIT))


def default_tiles(m: int, n: int, k: int, *, operand_bytes: int, block_k: int | None = None,
                  max_block_n: int = 128) -> GemmTiles:
    """Tile policy: 16-row tiles with narrow N tiles and split-K for decode, 128 x 128 for prefill.

    ``operand_bytes`` is the width of the dot's operands (1 for fp8 x fp8, 2 or 4 otherwise);
    ``block_k`` fixes the K tile (the block-wise format pins it to its block size).
    """
    block_m = min(max(next_power_of_2(m), _MIN_DOT_DIM), 128)
    block_n = min(64 if block_m <= 32 else 128, max_block_n)
    if block_k is None:
        block_k = 128 if operand_bytes == 1 else (64 if block_m >= 128 or operand_bytes == 4 else 128)
    split_k = default_split_k(m, n, k, block_m, block_n, block_k)
    num_warps = 8 if block_m * block_n >= 128 * 128 else 4
    return GemmTiles(block_m, block_n, block_k, split_k, num_warps, num_stages=3 if block_m >= 64 else 4)


def resolve_tiles(m: int, n: int, k: int, *, operand_bytes: int, block_m=None, block_n=None,
                  block_k=None, split_k=None, num_warps=None, num_stages=None,
                  max_block_n: int = 128, fixed_block_k: int | None = None) -> GemmTiles:
    """Defaults for every knob left as None, then validation of the result (ValueError)."""
    auto = default_tiles(m, n, k, operand_bytes=operand_bytes, block_k=fixed_block_k,
                         max_block_n=max_block_n)
    block_m = auto.block_m if block_m is None else block_m
    block_n = auto.block_n if block_n is None else block_n
    block_k = auto.block_k if block_k is None else block_k
    for name, value in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k)):
        if not is_power_of_2(value) or value < _MIN_DOT_DIM:
            raise ValueError(f"{name}={value!r} must be a power of two >= {_MIN_DOT_DIM} "
                             "(Triton block shapes)")
    if operand_bytes == 1 and block_k < 32:
        raise ValueError(f"block_k={block_k} must be >= 32 for an fp8 dot")
    if block_n > max_block_n:
        raise ValueError(f"block_n={block_n} must be <= {max_block_n}")
    if fixed_block_k is not None and block_k != fixed_block_k:
        raise ValueError(f"block_k={block_k} must equal the quantization block ({fixed_block_k})")
    if split_k is None:
        split_k = (auto.split_k if (block_m, block_n, block_k) == (auto.block_m, auto.block_n,
                                                                   auto.block_k)
                   else default_split_k(m, n, k, block_m, block_n, block_k))
    if not isinstance(split_k, int) or split_k < 1:
        raise ValueError(f"split_k must be a positive int, got {split_k!r}")
    num_warps = (8 if block_m * block_n >= 128 * 128 else 4) if num_warps is None else num_warps
    num_stages = auto.num_stages if num_stages is None else num_stages
    return GemmTiles(block_m, block_n, block_k, split_k, num_warps, num_stages)


def check_matmul_operands(x, w_q, *, weight_dtypes, name: str):
    """Shared shape/dtype checks: ``x [M, K]`` float, ``w_q [N, K]`` of an allowed dtype."""
    if x.ndim != 2:
        raise ValueError(f"{name}: x must be [M, K], got shape {x.shape}")
    if jnp.dtype(x.dtype) not in ACTIVATION_DTYPES:
        raise ValueError(f"{name}: x dtype {x.dtype} unsupported; use bfloat16, float16 or float32")
    if w_q.ndim != 2:
        raise ValueError(f"{name}: w_q must be [N, K] (K-major), got shape {w_q.shape}")
    if jnp.dtype(w_q.dtype) not in [jnp.dtype(d) for d in weight_dtypes]:
        allowed = ", ".join(str(jnp.dtype(d)) for d in weight_dtypes)
        raise ValueError(f"{name}: w_q dtype {w_q.dtype} unsupported; expected {allowed}")
    if w_q.shape[1] != x.shape[1]:
        raise ValueError(f"{name}: K of x ({x.shape[1]}) != K of w_q {w_q.shape} (w_q is [N, K])")
    if x.shape[0] < 1 or w_q.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"{name}: empty operands x {x.shape}, w_q {w_q.shape}")


# ----------------------------------------------------------------------------------------------
# In-kernel helpers (Triton): masked tile loads and stores, the K range of a split
# ----------------------------------------------------------------------------------------------


def _bounds_mask(start, size: int, extent: int):
    """[size] bool mask of ``start + i < extent``, or None when every tile fits exactly."""
    if extent % size == 0:
        return None
    return start + jnp.arange(size, dtype=jnp.int32) < extent


def _and(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return a & b


def tile_mask(row0, rows: int, num_rows: int, col0, cols: int, num_cols: int):
    """[rows, cols] mask of the in-bounds elements of a tile, or None when no mask is needed."""
    row_mask = _bounds_mask(row0, rows, num_rows)
    col_mask = _bounds_mask(col0, cols, num_cols)
    return _and(None if row_mask is None else row_mask[:, None],
                None if col_mask is None else col_mask[None, :])


def load_tile(ref, row0, rows: int, col0, cols: int, other=0):
    """A ``[rows, cols]`` tile of a 2-D ref at (row0, col0); out-of-bounds elements read ``other``."""
    mask = tile_mask(row0, rows, ref.shape[0], col0, cols, ref.shape[1])
    tile = ref.at[pl.ds(row0, rows), pl.ds(col0, cols)]
    return plt.load(tile, mask=mask, other=None if mask is None else other)


def load_vector(ref, start, size: int, other=0):
    """``ref[start:start + size]`` of a 1-D ref, out-of-bounds elements reading ``other``."""
    mask = _bounds_mask(start, size, ref.shape[0])
    return plt.load(ref.at[pl.ds(start, size)], mask=mask, other=None if mask is None else other)


def store_tile(ref, row0, col0, value, *, leading=()):
    """Stores the in-bounds part of ``value`` at (row0, col0) of the last two dimensions of a ref,
    at index ``leading`` of the ones before (the split of a split-K partial)."""
    rows, cols = value.shape
    mask = tile_mask(row0, rows, ref.shape[-2], col0, cols, ref.shape[-1])
    plt.store(ref.at[(*leading, pl.ds(row0, rows), pl.ds(col0, cols))], value.astype(ref.dtype),
              mask=mask)


def split_k_range(split, k_steps: int, split_k: int):
    """The K-loop steps ``[lo, hi)`` that split ``split`` of ``split_k`` covers."""
    per_split = cdiv(k_steps, split_k)
    lo = split * per_split
    return lo, jnp.minimum(lo + per_split, k_steps)


def tiled_matmul_call(kernel, operands, *, m: int, n: int, tiles: GemmTiles, out_dtype, interpret: bool, name: str):
    """Run ``kernel`` (one program per ``block_m x block_n`` output tile and K split) over ``operands``: the
    ``[M, N]`` result in ``out_dtype``, the K splits' float32 partial sums added here when ``split_k > 1``."""
    t = tiles
    if t.split_k == 1:
        out_shape = jax.ShapeDtypeStruct((m, n), out_dtype)
    else:
        out_shape = jax.ShapeDtypeStruct((t.split_k, m, n), jnp.float32)
    out = pl.pallas_call(
        kernel,
        out_shape=out_shape,
        grid=(cdiv(m, t.block_m), cdiv(n, t.block_n), t.split_k),
        compiler_params=plt.CompilerParams(num_warps=t.num_warps, num_stages=t.num_stages),
        interpret=interpret,
        name=name,
    )(*operands)
    if t.split_k == 1:
        return out
    return jnp.sum(out, axis=0).astype(out_dtype)
