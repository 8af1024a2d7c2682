"""How one ragged paged-attention call is cut into Triton programs, and the per-GPU launch defaults.

Used by ``pallas_kernels.ragged_paged_attention`` (the kernel and its wrapper). Nothing here touches a cache:

* the *work list* (``build_work_list``): tiles of up to ``block_q`` consecutive query tokens of one sequence,
  plus zero tiles over the padding rows, so every output row is written by exactly one program;
* the split-K merge (``combine_splits``): the log-sum-exp combine of the partial outputs of ``num_kv_splits``
  programs over one tile's keys;
* the defaults, per GPU: query rows per program (``max_rows``), query heads per program
  (``default_heads_per_program``: the ``G`` query heads of one KV head, or a power-of-two share of them when
  ``G`` alone would overflow the rows, as MLA's one latent head read by all of a layer's heads does), tokens per
  tile (``default_block_q``), keys per KV step and warps (``default_launch``), split-K (``default_num_kv_splits``).

The rules, checked with ``jaxinfer-bench gpu-compile`` (ptxas: no spills):

* Hopper (sm_90) and a compile with no GPU target (interpret mode, cross-lowering): 64 keys per KV step for
  16-bit q (32 for float32), 8 warps once the query block ``rows x Dp`` reaches 128 x 128, else 4; M up to 128
  rows and ``rows x Dp <= 128 x 256`` (the float32 accumulator). ``Dp`` is the padded *value* width, the
  accumulator's: the head_dim, or for MLA's latent rows the latent rank, 512. Those are wider than any K/V row
  and their q block is 576 lanes: at 64 rows x 512 ptxas sat at 255 registers or spilled (96-336 B), with
  4 warps at 16 rows too (148 B); so an accumulator wider than 256 lanes gets ``rows x Dp <= 128 x 128`` (32
  rows) and always 8 warps (at 16 and 32 rows x 512, 64 keys: 153 and 191 registers, no spill).
* Ampere and Ada (sm_80 - sm_89): their mma.sync dots hold both operands in registers, and at the Hopper
  configuration ptxas spilled (up to 136 B per thread for head_dim 256, 16-24 B for 7B prefill and mixed
  steps) or sat at exactly 255 registers. So: 32 keys per KV step (halves the score tile and the K/V
  fragments), 8 warps from ``rows x Dp`` = 64 x 128 on (half the per-thread share of the accumulator), and the
  query block capped at ``rows x Dp <= 128 x 128`` (head_dim 256 gets 64 rows). A 4-warp block below that
  size stays at 4 warps: at 8 the same small block spilled (more threads each holding a fragment of K/V).
"""

from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels.matmul_tiling import cdiv, next_power_of_2

MIN_DOT_DIM = 16  # Triton's tensor-core dot wants every matmul dimension >= 16
_TARGET_PROGRAMS = 256  # split-K aims for about this many programs (~2 per SM on H100/H200)
_MIN_KEYS_PER_SPLIT = 512
_MAX_KV_SPLITS = 16


def _ampere_class(capability: int | None) -> bool:
    """sm_80 - sm_89: dots whose operands live in registers (module docstring)."""
    return capability is not None and capability < 90


def max_rows(head_dim: int, capability: int | None) -> int:
    """The query block's M (tokens x query heads) at most, for an accumulator ``head_dim`` wide: 128 and
    ``M x Dp <= 128 x 256``; on Ampere-class GPUs, and for accumulators wider than 256 lanes (latent rows: 512),
    ``M x Dp <= 128 x 128`` (64 rows for head_dim 256, 32 for MLA's 512)."""
    budget = 128 * 128 if _ampere_class(capability) or next_power_of_2(head_dim) > 256 else 128 * 256
    return max(MIN_DOT_DIM, min(128, budget // next_power_of_2(head_dim)))


def default_heads_per_program(group: int, head_dim: int = 128, capability: int | None = None) -> int:
    """Query heads of one KV head that one program takes: all ``G`` (padded to a power of two) unless that is
    more than ``max_rows`` (MLA's 16-128 heads over one 512-wide latent), then ``max_rows`` of them."""
    return min(next_power_of_2(group), max_rows(head_dim, capability))


def default_block_q(num_tokens: int, num_seqs: int, group: int, head_dim: int = 128,
                    capability: int | None = None) -> int:
    """Query tokens per tile: about the mean q_len, but M = block_q * heads per program within
    [16, ``max_rows``]."""
    heads = default_heads_per_program(group, head_dim, capability)
    floor = max(1, MIN_DOT_DIM // heads)
    ceiling = max(floor, max_rows(head_dim, capability) // heads)
    return min(max(next_power_of_2(cdiv(num_tokens, max(num_seqs, 1))), floor), ceiling)


def default_launch(rows: int, head_dim: int, itemsize: int, capability: int | None) -> tuple[int, int]:
    """(keys per KV-loop step, num_warps) for a query block of ``rows`` x ``head_dim`` on this GPU."""
    padded = next_power_of_2(head_dim)
    size = rows * padded
    if _ampere_class(capability):
        return 32, 8 if size >= 64 * 128 else 4
    return 64 if itemsize <= 2 else 32, 8 if size >= 128 * 128 or padded > 256 else 4


def default_num_kv_splits(num_tokens: int, num_seqs: int, num_kv_heads: int, max_context: int,
                          block_q: int) -> int:
    """Split-K only when the unsplit grid is small and contexts can be long (``num_kv_heads``: programs per
    tile, i.e. KV heads times head blocks)."""
    busy_programs = min(cdiv(num_tokens, block_q) + num_seqs, max(num_tokens, 1)) * num_kv_heads
    if busy_programs >= _TARGET_PROGRAMS or max_context < 2 * _MIN_KEYS_PER_SPLIT:
        return 1
    return max(1, min(_MAX_KV_SPLITS, cdiv(_TARGET_PROGRAMS, busy_programs),
                      max_context // _MIN_KEYS_PER_SPLIT))


def num_tiles(num_tokens: int, num_seqs: int, block_q: int) -> int:
    """Room for every sequence's tiles plus the zero tiles over the padding rows (static)."""
    return cdiv(num_tokens, block_q) + num_seqs + 1


def build_work_list(cu_q_lens, num_tokens: int, block_q: int, tiles: int):
    """[tiles, 4] int32: (seq or -1 for a zero tile, first row, rows, first query in seq)."""
    num_seqs = cu_q_lens.shape[0] - 1
    q_lens = cu_q_lens[1:] - cu_q_lens[:-1]
    cu_tiles = jnp.concatenate([jnp.zeros((1,), jnp.int32),
                                jnp.cumsum(cdiv(q_lens, block_q), dtype=jnp.int32)])
    tile = jnp.arange(tiles, dtype=jnp.int32)
    seq = jnp.clip(jnp.searchsorted(cu_tiles, tile, side="right") - 1, 0, num_seqs - 1)
    first_query = (tile - cu_tiles[seq]) * block_q
    is_seq_tile = tile < cu_tiles[num_seqs]
    pad_first_row = cu_q_lens[num_seqs] + (tile - cu_tiles[num_seqs]) * block_q
    first_row = jnp.where(is_seq_tile, cu_q_lens[seq] + first_query, pad_first_row)
    num_rows = jnp.where(is_seq_tile, jnp.minimum(block_q, q_lens[seq] - first_query),
                         jnp.clip(num_tokens - pad_first_row, 0, block_q))
    return jnp.stack([jnp.where(is_seq_tile, seq, -1), first_row, num_rows,
                      jnp.where(is_seq_tile, first_query, 0)], axis=1).astype(jnp.int32)


def combine_splits(acc, running_max, running_sum, dtype):
    """Log-sum-exp merge: acc [splits, T, Hq, D], max and sum [splits, T, Hq] -> [T, Hq, D]."""
    global_max = jnp.max(running_max, axis=0)
    weight = jnp.exp(running_max - global_max[None])
    total = jnp.sum(weight * running_sum, axis=0)
    out = jnp.sum(weight[..., None] * acc, axis=0) / jnp.where(total > 0.0, total, 1.0)[..., None]
    return out.astype(dtype)
