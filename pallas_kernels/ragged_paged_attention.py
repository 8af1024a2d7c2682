"""Ragged paged attention for one layer: a Pallas (Triton) kernel and its plain-jnp reference.

One call serves decode (q_len 1), prefill chunks and speculative verification (q_len up to 64 and
more) in the same batch. It knows nothing of the engine: arrays in, arrays out.

Semantics
---------
``q [T, Hq, D]`` holds the query tokens of all sequences back to back; sequence slot ``s`` owns
rows ``cu_q_lens[s]:cu_q_lens[s+1]``; rows past ``cu_q_lens[S]`` are padding (output zeros). Its
context has ``kv_lens[s]`` tokens, the last ``q_len`` of which are the new queries (their K/V are
already in the cache), so query ``i`` sits at position ``kv_lens[s] - q_len + i`` and sees keys
``0..position`` (only keys ``> position - sliding_window`` if a window is set). Key ``j`` lives
at ``k_cache[block_tables[s, j // BS], j % BS]``. Query head ``h`` reads kv head ``h // G`` with
``G = Hq // Hkv``. The caches share q's dtype, or are float8_e4m3fn (an fp8 KV cache: each key and
value is widened to q's dtype as it is loaded; scales are the caller's, folded into q and the output).
Optional: ``soft_cap`` (Gemma 2: scores ``cap * tanh(s / cap)``) and ``sinks [Hq]`` (GPT-OSS: one more logit
per head in each softmax's denominator, weighting no value; the online softmax starts from it in split 0).

Grid and work list
------------------
The grid is ``(num_tiles, Hkv, num_kv_splits)``. A *tile* is up to ``block_q`` consecutive query
tokens of one sequence. Grid sizes are static while tiles depend on the data, so the wrapper builds
a small int32 work list ``[num_tiles, 4] = (seq, first row in q, rows, index of the first row among
its sequence's queries)`` with ``num_tiles = cdiv(T, block_q) + S + 1``: room for every sequence's
tiles plus "zero tiles" (``seq = -1``) covering the padding rows, so every output element is
written by exactly one program; leftover tiles have 0 rows and do nothing.

One program handles one tile, one kv head and one kv split. GQA packs the ``G`` query heads of its
kv head into the matmul's M dimension: row ``m`` of the ``[block_q * Gp, Dp]`` query block is token
``m // Gp``, head ``m % Gp`` (``Gp``, ``Dp``: ``G``, ``D`` rounded up to powers of two, as Triton
blocks must be; the padded heads and lanes are masked on load and store, so no array is ever padded
or copied). The KV loop (``lax.fori_loop``) walks the tile's key range ``block_kv`` keys
(``kv_pages_per_step`` pages) at a time, gathering each key's row through the block table, with an
online softmax in float32.

Split-K ("flash decoding"): with ``num_kv_splits > 1`` each program covers one contiguous share of
the tile's KV steps and writes an unnormalised float32 partial output plus its running max and sum;
a log-sum-exp combine in plain jnp merges them. It is picked automatically when few programs would
cover long contexts (``default_num_kv_splits``).

Memory layout: every array stays in global memory in the caller's layout (no BlockSpecs); the
kernel computes element pointers itself, so the paged cache is read in place. Split-K partials are
``[splits, T, Hq, D]`` (float32) plus ``[splits, T, Hq]`` for the max and the sum.

Configuration per GPU (``default_launch``; every knob can still be set by hand), checked with ``jaxinfer-bench
gpu-compile`` (ptxas: no spills, on every case of the GPU suite and the engine's 7B steps):

* Hopper (sm_90) and a compile with no GPU target (interpret mode, cross-lowering): 64 keys per KV step for
  16-bit q (32 for float32), 8 warps once the query block ``rows x Dp`` reaches 128 x 128, else 4; M up to 128
  rows. Triton's Hopper dots read their operands from shared memory, so the registers hold mostly the
  accumulator: the largest blocks stay under 255 registers per thread.
* Ampere and Ada (sm_80 - sm_89): their mma.sync dots hold both operands in registers, and at the Hopper
  configuration ptxas spilled (up to 136 B per thread for head_dim 256, 16-24 B for 7B prefill and mixed
  steps) or sat at exactly 255 registers. So: 32 keys per KV step (halves the score tile and the K/V
  fragments), 8 warps from ``rows x Dp`` = 64 x 128 on (half the per-thread share of the accumulator), and the
  query block capped at ``rows x Dp <= 128 x 128`` (head_dim 256 gets 64 rows). A 4-warp block below that
  size stays at 4 warps: at 8 the same small block spilled (more threads each holding a fragment of K/V).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from pallas_kernels import gpu_target

_FP8_CACHE_DTYPE = jnp.dtype(jnp.float8_e4m3fn)  # an fp8 KV cache: e4m3 K/V read with float q
_SUPPORTED_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32))
_RUNNING_MAX_INIT = -1e30  # finite, so rows that see no key give exp(-inf - init) = 0, never NaN
_MIN_DOT_DIM = 16  # Triton's tensor-core dot wants every matmul dimension >= 16
_TARGET_PROGRAMS = 256  # split-K aims for about this many programs (~2 per SM on H100/H200)
_MIN_KEYS_PER_SPLIT = 512
_MAX_KV_SPLITS = 16


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _is_power_of_2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _cdiv(a, b):
    return (a + b - 1) // b


@dataclasses.dataclass(frozen=True)
class _KernelConfig:
    """Every static number the kernel body needs (hashable, so it can sit in a partial)."""

    num_tokens: int  # T
    num_q_heads: int  # Hq
    num_kv_heads: int  # Hkv
    head_dim: int  # D
    num_blocks: int  # N
    block_size: int  # BS
    block_q: int  # query tokens per tile
    block_kv: int  # keys per KV-loop step
    num_kv_splits: int
    sm_scale: float
    sliding_window: int | None
    soft_cap: float | None  # Gemma 2's cap * tanh(score / cap) on the scaled scores; None: off
    precise_dots: bool  # float32 inputs: IEEE dots, not TF32
    fp8_cache: bool = False  # K/V stored float8_e4m3fn (their per-layer scales are folded in by the caller)
    sinks: bool = False  # a [Hq] float32 input: GPT-OSS's per-head logit in every softmax's denominator

    @property
    def group(self) -> int:
        return self.num_q_heads // self.num_kv_heads

    @property
    def group_padded(self) -> int:
        return _next_power_of_2(self.group)

    @property
    def head_dim_padded(self) -> int:
        return _next_power_of_2(self.head_dim)

    @property
    def rows(self) -> int:  # the matmul's M: query tokens x query heads of one kv head
        return self.block_q * self.group_padded


# ----------------------------------------------------------------------------------------------
# 1. Kernel body
# ----------------------------------------------------------------------------------------------


def _attention_kernel(work_ref, cu_q_lens_ref, kv_lens_ref, block_tables_ref, q_ref, k_ref, v_ref,
                      *refs, cfg: _KernelConfig):
    sinks_ref, out_refs = (refs[0], refs[1:]) if cfg.sinks else (None, refs)
    tile, kv_head, split = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    seq, first_row, num_rows, first_query = (work_ref[tile, i] for i in range(4))

    # Row m of the query block is token m // Gp of the tile, query head m % Gp of this kv head.
    m = jnp.arange(cfg.rows, dtype=jnp.int32)
    token_in_tile = jax.lax.div(m, jnp.int32(cfg.group_padded))
    head_in_group = jax.lax.rem(m, jnp.int32(cfg.group_padded))
    row_valid = (token_in_tile < num_rows) & (head_in_group < cfg.group)
    # Every load and store is masked, so masked-out indices may point anywhere (nothing is
    # accessed there on a GPU). Indices stay distinct: interpret mode writes a masked-out element
    # back, so a duplicate (clamped) index could clobber a valid one.
    q_row = (first_row + token_in_tile)[:, None]
    q_head = (kv_head * cfg.group + head_in_group)[:, None]
    lane = jnp.arange(cfg.head_dim_padded, dtype=jnp.int32)[None, :]
    # D already a power of two: no lane mask at all (keeps Triton's vectorised loads).
    lane_valid = None if cfg.head_dim == cfg.head_dim_padded else lane < cfg.head_dim
    with_lanes = lambda mask: mask if lane_valid is None else mask & lane_valid
    store_mask = with_lanes(row_valid[:, None])

    def store(acc, running_max, running_sum):
        if cfg.num_kv_splits == 1:
            out = acc / jnp.where(running_sum > 0.0, running_sum, 1.0)[:, None]
            (o_ref,) = out_refs
            plt.store(o_ref.at[q_row, q_head, lane], out.astype(o_ref.dtype), mask=store_mask)
        else:
            acc_ref, max_ref, sum_ref = out_refs
            plt.store(acc_ref.at[split, q_row, q_head, lane], acc, mask=store_mask)
            plt.store(max_ref.at[split, q_row[:, 0], q_head[:, 0]], running_max, mask=row_valid)
            plt.store(sum_ref.at[split, q_row[:, 0], q_head[:, 0]], running_sum, mask=row_valid)

    def initial_state():
        return (jnp.zeros((cfg.rows, cfg.head_dim_padded), jnp.float32),
                jnp.full((cfg.rows,), _RUNNING_MAX_INIT, jnp.float32),
                jnp.zeros((cfg.rows,), jnp.float32))

    def with_sink(state):
        """The sink (GPT-OSS) as the softmax's first term: max = sink, sum = exp(0); in split 0 only, so the
        merged denominator counts it once."""
        if not cfg.sinks:
            return state
        sink = plt.load(sinks_ref.at[q_head[:, 0]], mask=row_valid, other=0.0).astype(jnp.float32)
        acc, running_max, running_sum = state
        first = split == 0
        return acc, jnp.where(first, sink, running_max), jnp.where(first, 1.0, running_sum)

    @pl.when(seq < 0)  # a zero tile: padding rows of q
    def _():
        store(*initial_state())

    @pl.when((seq >= 0) & (num_rows > 0))
    def _():
        q_len = cu_q_lens_ref[seq + 1] - cu_q_lens_ref[seq]
        context_start = kv_lens_ref[seq] - q_len  # position of the sequence's first query
        position = (context_start + first_query + token_in_tile)[:, None]  # [rows, 1]
        keys_end = context_start + first_query + num_rows  # exclusive; the tile's last position + 1
        if cfg.sliding_window is None:
            keys_start = jnp.int32(0)
        else:
            keys_start = jnp.maximum(context_start + first_query - cfg.sliding_window + 1, 0)
        step_lo = keys_start // cfg.block_kv
        steps_per_split = _cdiv(_cdiv(keys_end, cfg.block_kv) - step_lo, cfg.num_kv_splits)
        split_lo = step_lo + split * steps_per_split
        split_hi = jnp.minimum(split_lo + steps_per_split, _cdiv(keys_end, cfg.block_kv))

        q = plt.load(q_ref.at[q_row, q_head, lane], mask=store_mask, other=0.0)
        precision = jax.lax.Precision.HIGHEST if cfg.precise_dots else None

        def kv_step(step, state):
            acc, running_max, running_sum = state
            key = step * cfg.block_kv + jnp.arange(cfg.block_kv, dtype=jnp.int32)  # positions [BK]
            key_valid = (key >= keys_start) & (key < keys_end)
            page = plt.load(block_tables_ref.at[seq, key // cfg.block_size], mask=key_valid,
                            other=0)
            page = jnp.clip(page, 0, cfg.num_blocks - 1)[:, None]
            slot = (key % cfg.block_size)[:, None]
            # Masked-out keys load as 0 (never NaN: 0 * NaN in the PV matmul would poison a row).
            kv_mask = with_lanes(key_valid[:, None])
            k = plt.load(k_ref.at[page, slot, kv_head, lane], mask=kv_mask, other=0.0)
            v = plt.load(v_ref.at[page, slot, kv_head, lane], mask=kv_mask, other=0.0)
            if cfg.fp8_cache:  # e4m3 K/V (kv_cache_dtype="fp8"): widened to q's dtype in registers
                k, v = k.astype(q.dtype), v.astype(q.dtype)
            scores = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=precision,
                                         preferred_element_type=jnp.float32) * cfg.sm_scale
            if cfg.soft_cap is not None:
                scores = cfg.soft_cap * jnp.tanh(scores / cfg.soft_cap)
            # Causality (and the window) imply keys_start <= key < keys_end. Rows that are not
            # stored (padding tokens / heads) need no mask: their scores are finite anyway.
            visible = key[None, :] <= position
            if cfg.sliding_window is not None:
                visible &= key[None, :] > position - cfg.sliding_window
            scores = jnp.where(visible, scores, -jnp.inf)
            new_max = jnp.maximum(running_max, jnp.max(scores, axis=1))
            rescale = jnp.exp(running_max - new_max)
            probs = jnp.exp(scores - new_max[:, None])
            running_sum = running_sum * rescale + jnp.sum(probs, axis=1)
            acc = acc * rescale[:, None] + jax.lax.dot_general(
                probs.astype(v.dtype), v, (((1,), (0,)), ((), ())), precision=precision,
                preferred_element_type=jnp.float32)
            return acc, new_max, running_sum

        store(*jax.lax.fori_loop(split_lo, split_hi, kv_step, with_sink(initial_state())))


# ----------------------------------------------------------------------------------------------
# 2. pallas_call wrapper
# ----------------------------------------------------------------------------------------------


def _build_work_list(cu_q_lens: jax.Array, num_tokens: int, block_q: int, num_tiles: int):
    """[num_tiles, 4] int32: (seq or -1 for a zero tile, first row, rows, first query in seq)."""
    num_seqs = cu_q_lens.shape[0] - 1
    q_lens = cu_q_lens[1:] - cu_q_lens[:-1]
    cu_tiles = jnp.concatenate([jnp.zeros((1,), jnp.int32),
                                jnp.cumsum(_cdiv(q_lens, block_q), dtype=jnp.int32)])
    tile = jnp.arange(num_tiles, dtype=jnp.int32)
    seq = jnp.clip(jnp.searchsorted(cu_tiles, tile, side="right") - 1, 0, num_seqs - 1)
    first_query = (tile - cu_tiles[seq]) * block_q
    is_seq_tile = tile < cu_tiles[num_seqs]
    pad_first_row = cu_q_lens[num_seqs] + (tile - cu_tiles[num_seqs]) * block_q
    first_row = jnp.where(is_seq_tile, cu_q_lens[seq] + first_query, pad_first_row)
    num_rows = jnp.where(is_seq_tile, jnp.minimum(block_q, q_lens[seq] - first_query),
                         jnp.clip(num_tokens - pad_first_row, 0, block_q))
    return jnp.stack([jnp.where(is_seq_tile, seq, -1), first_row, num_rows,
                      jnp.where(is_seq_tile, first_query, 0)], axis=1).astype(jnp.int32)


def _combine_splits(acc, running_max, running_sum, dtype):
    """Log-sum-exp merge: acc [splits, T, Hq, D], max and sum [splits, T, Hq] -> [T, Hq, D]."""
    global_max = jnp.max(running_max, axis=0)
    weight = jnp.exp(running_max - global_max[None])
    total = jnp.sum(weight * running_sum, axis=0)
    out = jnp.sum(weight[..., None] * acc, axis=0) / jnp.where(total > 0.0, total, 1.0)[..., None]
    return out.astype(dtype)


def _ragged_paged_attention_call(q, k_cache, v_cache, block_tables, cu_q_lens, kv_lens, sinks=None, *,
                                 cfg: _KernelConfig, num_warps: int, num_stages: int,
                                 interpret: bool):
    num_seqs = kv_lens.shape[0]
    num_tiles = _cdiv(cfg.num_tokens, cfg.block_q) + num_seqs + 1
    work = _build_work_list(cu_q_lens, cfg.num_tokens, cfg.block_q, num_tiles)
    t, hq, d = q.shape
    if cfg.num_kv_splits == 1:
        out_shape = jax.ShapeDtypeStruct((t, hq, d), q.dtype)
    else:
        ns = cfg.num_kv_splits
        out_shape = (jax.ShapeDtypeStruct((ns, t, hq, d), jnp.float32),
                     jax.ShapeDtypeStruct((ns, t, hq), jnp.float32),
                     jax.ShapeDtypeStruct((ns, t, hq), jnp.float32))
    outs = pl.pallas_call(
        functools.partial(_attention_kernel, cfg=cfg),
        out_shape=out_shape,
        grid=(num_tiles, cfg.num_kv_heads, cfg.num_kv_splits),
        compiler_params=plt.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="ragged_paged_attention",
    )(work, cu_q_lens, kv_lens, block_tables, q, k_cache, v_cache, *(() if sinks is None else (sinks,)))
    if cfg.num_kv_splits == 1:
        return outs
    return _combine_splits(*outs, q.dtype)


# ----------------------------------------------------------------------------------------------
# 3. Validated public function
# ----------------------------------------------------------------------------------------------


def _ampere_class(capability: int | None) -> bool:
    """sm_80 - sm_89: dots whose operands live in registers (module docstring, "Configuration per GPU")."""
    return capability is not None and capability < 90


def max_rows(head_dim: int, capability: int | None) -> int:
    """The query block's M (tokens x padded query heads) at most: 128, and on Ampere-class GPUs
    ``128 * 128 / Dp`` (64 rows for head_dim 256)."""
    if _ampere_class(capability):
        return max(_MIN_DOT_DIM, min(128, 128 * 128 // _next_power_of_2(head_dim)))
    return 128


def default_block_q(num_tokens: int, num_seqs: int, group: int, head_dim: int = 128,
                    capability: int | None = None) -> int:
    """Query tokens per tile: about the mean q_len, but M = block_q * Gp within [16, ``max_rows``]."""
    group_padded = _next_power_of_2(group)
    floor = max(1, _MIN_DOT_DIM // group_padded)
    ceiling = max(floor, max_rows(head_dim, capability) // group_padded)
    return min(max(_next_power_of_2(_cdiv(num_tokens, max(num_seqs, 1))), floor), ceiling)


def default_launch(rows: int, head_dim: int, itemsize: int, capability: int | None) -> tuple[int, int]:
    """(keys per KV-loop step, num_warps) for a query block of ``rows`` x ``head_dim`` on this GPU."""
    size = rows * _next_power_of_2(head_dim)
    if _ampere_class(capability):
        return 32, 8 if size >= 64 * 128 else 4
    return 64 if itemsize <= 2 else 32, 8 if size >= 128 * 128 else 4


def default_num_kv_splits(num_tokens: int, num_seqs: int, num_kv_heads: int, max_context: int,
                          block_q: int) -> int:
    """Split-K only when the unsplit grid is small and contexts can be long."""
    busy_programs = min(_cdiv(num_tokens, block_q) + num_seqs, max(num_tokens, 1)) * num_kv_heads
    if busy_programs >= _TARGET_PROGRAMS or max_context < 2 * _MIN_KEYS_PER_SPLIT:
        return 1
    return max(1, min(_MAX_KV_SPLITS, _cdiv(_TARGET_PROGRAMS, busy_programs),
                      max_context // _MIN_KEYS_PER_SPLIT))


def _validate(q, k_cache, v_cache, block_tables, cu_q_lens, kv_lens, sm_scale, sliding_window, soft_cap=None,
              sinks=None):
    if q.ndim != 3:
        raise ValueError(f"q must be [T, Hq, D], got shape {q.shape}")
    if k_cache.ndim != 4:
        raise ValueError(f"k_cache must be [num_blocks, block_size, Hkv, D], got {k_cache.shape}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache shape {v_cache.shape} != k_cache shape {k_cache.shape}")
    if jnp.dtype(k_cache.dtype) != jnp.dtype(v_cache.dtype) or jnp.dtype(k_cache.dtype) not in (
            jnp.dtype(q.dtype), _FP8_CACHE_DTYPE):
        raise ValueError(f"q, k_cache, v_cache must share a dtype (or the caches be float8_e4m3fn), got "
                         f"{q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    if jnp.dtype(q.dtype) not in _SUPPORTED_DTYPES:
        raise ValueError(f"dtype {q.dtype} unsupported; use bfloat16, float16 or float32")
    _, hq, d = q.shape
    _, bs, hkv, dk = k_cache.shape
    if dk != d:
        raise ValueError(f"head_dim of q ({d}) != head_dim of the cache ({dk})")
    if hkv < 1 or hq % hkv:
        raise ValueError(f"Hq={hq} must be a multiple of Hkv={hkv}")
    if not _is_power_of_2(bs):
        raise ValueError(f"block_size must be a power of two, got {bs}")
    if d > 256:
        raise ValueError(f"head_dim {d} > 256 is not supported")
    if block_tables.ndim != 2 or kv_lens.ndim != 1 or cu_q_lens.ndim != 1:
        raise ValueError("block_tables must be [S, MB], kv_lens [S], cu_q_lens [S+1]; got "
                         f"{block_tables.shape}, {kv_lens.shape}, {cu_q_lens.shape}")
    s = kv_lens.shape[0]
    if s < 1 or block_tables.shape[0] != s or cu_q_lens.shape[0] != s + 1:
        raise ValueError("need S >= 1 with block_tables [S, MB], kv_lens [S], cu_q_lens [S+1]; got "
                         f"{block_tables.shape}, {kv_lens.shape}, {cu_q_lens.shape}")
    for name, arr in zip(("block_tables", "cu_q_lens", "kv_lens"),
                         (block_tables, cu_q_lens, kv_lens)):
        if not jnp.issubdtype(arr.dtype, jnp.integer):
            raise ValueError(f"{name} must be an integer array, got {arr.dtype}")
    if not isinstance(sm_scale, (int, float)) or not sm_scale > 0:
        raise ValueError(f"sm_scale must be a positive Python float, got {sm_scale!r}")
    if sliding_window is not None and (not isinstance(sliding_window, int) or sliding_window < 1):
        raise ValueError(f"sliding_window must be None or a positive int, got {sliding_window!r}")
    if soft_cap is not None and (not isinstance(soft_cap, (int, float)) or not soft_cap > 0):
        raise ValueError(f"soft_cap must be None or a positive Python float, got {soft_cap!r}")
    if sinks is not None and (sinks.shape != (hq,) or not jnp.issubdtype(sinks.dtype, jnp.floating)):
        raise ValueError(f"sinks must be a float array of shape [Hq] = ({hq},), got {sinks.shape} {sinks.dtype}")


@functools.partial(jax.jit, static_argnames=(
    "sm_scale", "sliding_window", "soft_cap", "interpret", "block_q", "kv_pages_per_step", "num_kv_splits",
    "num_warps", "num_stages"))
def ragged_paged_attention(q, k_cache, v_cache, block_tables, cu_q_lens, kv_lens, *,
                           sm_scale: float, sliding_window: int | None = None, soft_cap: float | None = None,
                           sinks: jax.Array | None = None, interpret: bool | None = None, block_q: int | None = None,
                           kv_pages_per_step: int | None = None, num_kv_splits: int | None = None,
                           num_warps: int | None = None, num_stages: int | None = None):
    """Attention of ragged query batches over a paged KV cache (see the module docstring).

    Knobs (None = automatic): ``block_q`` query tokens per tile (power of two, block_q * Gp >= 16);
    ``kv_pages_per_step`` cache pages per KV-loop step (power of two; keys per step >= 16);
    ``num_kv_splits`` split-K partitions (1 = off); ``num_warps`` / ``num_stages`` for Triton.
    ``interpret=None`` interprets the kernel unless the default backend is a GPU.
    Returns ``[T, Hq, D]`` in q's dtype.
    """
    _validate(q, k_cache, v_cache, block_tables, cu_q_lens, kv_lens, sm_scale, sliding_window, soft_cap, sinks)
    t, hq, d = q.shape
    num_blocks, bs, hkv, _ = k_cache.shape
    s, mb = block_tables.shape
    group_padded = _next_power_of_2(hq // hkv)
    interpret = gpu_target.resolve_interpret(interpret)
    capability = None if interpret else gpu_target.gpu_compute_capability()  # the knobs' defaults depend on it
    if block_q is None:
        block_q = default_block_q(t, s, hq // hkv, d, capability)
    if not _is_power_of_2(block_q) or block_q * group_padded < _MIN_DOT_DIM:
        raise ValueError(f"block_q={block_q} must be a power of two with block_q * "
                         f"{group_padded} (padded query heads per kv head) >= {_MIN_DOT_DIM}")
    default_keys, default_warps = default_launch(block_q * group_padded, d, q.dtype.itemsize, capability)
    if kv_pages_per_step is None:
        kv_pages_per_step = max(1, default_keys // bs)
    if not _is_power_of_2(kv_pages_per_step) or kv_pages_per_step * bs < _MIN_DOT_DIM:
        raise ValueError(f"kv_pages_per_step={kv_pages_per_step} must be a power of two with "
                         f"kv_pages_per_step * block_size >= {_MIN_DOT_DIM}")
    if num_kv_splits is None:
        num_kv_splits = default_num_kv_splits(t, s, hkv, mb * bs, block_q)
    if not isinstance(num_kv_splits, int) or num_kv_splits < 1:
        raise ValueError(f"num_kv_splits must be a positive int, got {num_kv_splits!r}")
    if num_warps is None:
        num_warps = default_warps
    if num_stages is None:
        num_stages = 2
    cfg = _KernelConfig(
        num_tokens=t, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, num_blocks=num_blocks,
        block_size=bs, block_q=block_q, block_kv=kv_pages_per_step * bs,
        num_kv_splits=num_kv_splits, sm_scale=float(sm_scale), sliding_window=sliding_window,
        soft_cap=None if soft_cap is None else float(soft_cap), precise_dots=jnp.dtype(q.dtype) == jnp.float32,
        fp8_cache=jnp.dtype(k_cache.dtype) == _FP8_CACHE_DTYPE, sinks=sinks is not None)
    as_i32 = lambda x: x.astype(jnp.int32)
    return _ragged_paged_attention_call(
        q, k_cache, v_cache, as_i32(block_tables), as_i32(cu_q_lens), as_i32(kv_lens),
        None if sinks is None else sinks.astype(jnp.float32), cfg=cfg,
        num_warps=num_warps, num_stages=num_stages, interpret=interpret)


# ----------------------------------------------------------------------------------------------
# 4. Plain-jnp reference
# ----------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("sm_scale", "sliding_window", "soft_cap"))
def ragged_paged_attention_reference(q, k_cache, v_cache, block_tables, cu_q_lens, kv_lens, *,
                                     sm_scale: float, sliding_window: int | None = None,
                                     soft_cap: float | None = None, sinks: jax.Array | None = None):
    """Same contract as ``ragged_paged_attention``: dense masked softmax, one sequence at a time (with
    ``sinks``: one more logit per head in the softmax, whose probability multiplies no value).

    For each sequence slot it gathers all ``MB * BS`` key slots named by its block table, then masks
    explicitly: which query rows are its own, which keys are live (``< kv_len``), causality and the
    window. Float32 throughout; dead keys' values are zeroed so poison in unused slots cannot leak.
    """
    num_tokens, num_q_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    num_seqs, max_blocks = block_tables.shape
    token = jnp.arange(num_tokens)
    key_pos = jnp.arange(max_blocks * block_size)
    hi = jax.lax.Precision.HIGHEST
    out = jnp.zeros((num_tokens, num_q_heads, head_dim), jnp.float32)
    for s in range(num_seqs):
        q_start, q_end, kv_len = cu_q_lens[s], cu_q_lens[s + 1], kv_lens[s]
        own_row = (token >= q_start) & (token < q_end)  # [T]
        query_pos = kv_len - (q_end - q_start) + (token - q_start)  # [T]
        live_key = key_pos < kv_len  # [K]
        blocks, slots = block_tables[s, key_pos // block_size], key_pos % block_size
        # [K, Hkv, D] -> [K, Hq, D]: query head h reads kv head h // group.
        k = jnp.repeat(k_cache[blocks, slots].astype(jnp.float32), group, axis=1)
        v = jnp.repeat(v_cache[blocks, slots].astype(jnp.float32), group, axis=1)
        v = jnp.where(live_key[:, None, None], v, 0.0)
        visible = own_row[:, None] & live_key[None, :] & (key_pos[None, :] <= query_pos[:, None])
        if sliding_window is not None:
            visible &= key_pos[None, :] > query_pos[:, None] - sliding_window
        scores = jnp.einsum("thd,khd->htk", q.astype(jnp.float32), k, precision=hi) * sm_scale
        if soft_cap is not None:
            scores = soft_cap * jnp.tanh(scores / soft_cap)
        scores = jnp.where(visible[None], scores, -jnp.inf)
        if sinks is None:
            probs = jax.nn.softmax(scores, axis=-1)
        else:
            sink = jnp.broadcast_to(sinks.astype(jnp.float32)[:, None, None], (*scores.shape[:2], 1))
            probs = jax.nn.softmax(jnp.concatenate([scores, sink], axis=-1), axis=-1)[..., :-1]
        seq_out = jnp.einsum("htk,khd->thd", probs, v, precision=hi)
        out = jnp.where(own_row[:, None, None], seq_out, out)  # rows of other sequences: NaN-free
    return out.astype(q.dtype)
