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

Latent rows (DeepSeek's MLA, ``jaxinfer.model.mla``): with ``v_cache=None`` and ``value_dim=Dv`` there is one
cache whose rows are both the keys (all ``D`` lanes: the latent ``c_kv`` then the rope key) and the values
(their first ``Dv`` lanes, ``c_kv``); the output is ``[T, Hq, Dv]``. Each row is read once per KV step for both
dots, and the ``q . k`` dot is taken in two parts, ``Dv`` lanes and ``D - Dv`` lanes, each padded to a power
of two on its own (512 + 64, where padding 576 whole would make 1024).

Grid and work list
------------------
The grid is ``(num_tiles, Hkv * head_blocks, num_kv_splits)``. A *tile* is up to ``block_q`` consecutive
query tokens of one sequence; the work list that maps tiles to rows (``paged_attention_launch.build_work_list``)
is built from ``cu_q_lens`` in the wrapper, with zero tiles over the padding rows so every output element is
written by exactly one program.

One program handles one tile, ``heads_per_program`` query heads of one kv head (all ``G`` of them, padded
to a power of two, unless that overflows the query block: MLA's 16-128 heads over one latent) and one kv
split. The heads go into the matmul's M dimension: row ``m`` of the ``[block_q * Hp, Dp]`` query block is
token ``m // Hp``, head ``m % Hp`` of the program's head block (``Hp`` heads per program, ``Dp`` the lanes
rounded up to a power of two, as Triton blocks must be; the padded heads and lanes are masked on load and
store, so no array is ever padded or copied). The KV loop (``lax.fori_loop``) walks the tile's key range
``block_kv`` keys (``kv_pages_per_step`` pages) at a time, gathering each key's row through the block table,
with an online softmax in float32.

Split-K ("flash decoding"): with ``num_kv_splits > 1`` each program covers one contiguous share of
the tile's KV steps and writes an unnormalised float32 partial output plus its running max and sum;
a log-sum-exp combine in plain jnp merges them. It is picked automatically when few programs would
cover long contexts (``default_num_kv_splits``).

Memory layout: every array stays in global memory in the caller's layout (no BlockSpecs); the
kernel computes element pointers itself, so the paged cache is read in place. Split-K partials are
``[splits, T, Hq, Dv]`` (float32) plus ``[splits, T, Hq]`` for the max and the sum.

The configuration per GPU (tile sizes, keys per step, warps, checked spill-free with ``jaxinfer-bench
gpu-compile``) is ``pallas_kernels.paged_attention_launch``'s; every knob can still be set by hand.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from pallas_kernels import gpu_target
from pallas_kernels.matmul_tiling import cdiv, is_power_of_2, next_power_of_2
from pallas_kernels.paged_attention_launch import (
    MIN_DOT_DIM,
    build_work_list,
    combine_splits,
    default_block_q,
    default_heads_per_program,
    default_launch,
    default_num_kv_splits,
    num_tiles,
)

_FP8_CACHE_DTYPE = jnp.dtype(jnp.float8_e4m3fn)  # an fp8 KV cache: e4m3 K/V read with float q
_SUPPORTED_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32))
_RUNNING_MAX_INIT = -1e30  # finite, so rows that see no key give exp(-inf - init) = 0, never NaN
_MAX_HEAD_DIM = 256  # K/V rows of their own
_MAX_LATENT_DIM, _MAX_LATENT_REST = 512, 256  # latent rows: the value lanes, and the key-only lanes after them


@dataclasses.dataclass(frozen=True)
class _KernelConfig:
    """Every static number the kernel body needs (hashable, so it can sit in a partial)."""

    num_tokens: int  # T
    num_q_heads: int  # Hq
    num_kv_heads: int  # Hkv
    head_dim: int  # D: the key width (q . k)
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
    value_dim: int | None = None  # latent rows (MLA): the values are the keys' first value_dim lanes; None: a V cache
    heads_per_program: int = 1  # Hp: query heads of one kv head per program (a power of two)

    @property
    def group(self) -> int:
        return self.num_q_heads // self.num_kv_heads

    @property
    def head_blocks(self) -> int:
        return cdiv(self.group, self.heads_per_program)

    @property
    def rows(self) -> int:  # the matmul's M: query tokens x query heads of the program
        return self.block_q * self.heads_per_program

    @property
    def key_parts(self) -> tuple[tuple[int, int, int], ...]:
        """(first lane, lanes, padded lanes) of each part of the ``q . k`` dot; part 0 is also the value's."""
        if self.value_dim is None:
            return ((0, self.head_dim, next_power_of_2(self.head_dim)),)
        padded = lambda n: max(MIN_DOT_DIM, next_power_of_2(n))  # noqa: E731
        rest = self.head_dim - self.value_dim
        return (0, self.value_dim, padded(self.value_dim)), (self.value_dim, rest, padded(rest))

    @property
    def value_width(self) -> int:
        return self.key_parts[0][1]


# ----------------------------------------------------------------------------------------------
# 1. Kernel body
# ----------------------------------------------------------------------------------------------


def _attention_kernel(work_ref, cu_q_lens_ref, kv_lens_ref, block_tables_ref, q_ref, k_ref, *refs,
                      cfg: _KernelConfig):
    v_ref, refs = (None, refs) if cfg.value_dim is not None else (refs[0], refs[1:])
    sinks_ref, out_refs = (refs[0], refs[1:]) if cfg.sinks else (None, refs)
    tile, program_heads, split = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    kv_head, head_block = program_heads // cfg.head_blocks, program_heads % cfg.head_blocks
    seq, first_row, num_rows, first_query = (work_ref[tile, i] for i in range(4))

    # Row m of the query block is token m // Hp of the tile, query head m % Hp of this program's head block.
    m = jnp.arange(cfg.rows, dtype=jnp.int32)
    token_in_tile = jax.lax.div(m, jnp.int32(cfg.heads_per_program))
    head_in_group = head_block * cfg.heads_per_program + jax.lax.rem(m, jnp.int32(cfg.heads_per_program))
    row_valid = (token_in_tile < num_rows) & (head_in_group < cfg.group)
    # Every load and store is masked, so masked-out indices may point anywhere (nothing is
    # accessed there on a GPU). Indices stay distinct: interpret mode writes a masked-out element
    # back, so a duplicate (clamped) index could clobber a valid one.
    q_row = (first_row + token_in_tile)[:, None]
    q_head = (kv_head * cfg.group + head_in_group)[:, None]
    # Per part of the key row: its lanes, and which are real (None when the width is a power of two already:
    # no lane mask at all keeps Triton's vectorised loads).
    lanes = [(start + jnp.arange(padded, dtype=jnp.int32)[None, :],
              None if width == padded else jnp.arange(padded, dtype=jnp.int32)[None, :] < width)
             for start, width, padded in cfg.key_parts]
    with_lanes = lambda mask, part: mask if lanes[part][1] is None else mask & lanes[part][1]  # noqa: E731
    value_lane = lanes[0][0]
    store_mask = with_lanes(row_valid[:, None], 0)

    def store(acc, running_max, running_sum):
        if cfg.num_kv_splits == 1:
            out = acc / jnp.where(running_sum > 0.0, running_sum, 1.0)[:, None]
            (o_ref,) = out_refs
            plt.store(o_ref.at[q_row, q_head, value_lane], out.astype(o_ref.dtype), mask=store_mask)
        else:
            acc_ref, max_ref, sum_ref = out_refs
            plt.store(acc_ref.at[split, q_row, q_head, value_lane], acc, mask=store_mask)
            plt.store(max_ref.at[split, q_row[:, 0], q_head[:, 0]], running_max, mask=row_valid)
            plt.store(sum_ref.at[split, q_row[:, 0], q_head[:, 0]], running_sum, mask=row_valid)

    def initial_state():
        return (jnp.zeros((cfg.rows, cfg.key_parts[0][2]), jnp.float32),
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
        steps_per_split = cdiv(cdiv(keys_end, cfg.block_kv) - step_lo, cfg.num_kv_splits)
        split_lo = step_lo + split * steps_per_split
        split_hi = jnp.minimum(split_lo + steps_per_split, cdiv(keys_end, cfg.block_kv))

        q_parts = [plt.load(q_ref.at[q_row, q_head, lane], mask=with_lanes(row_valid[:, None], p), other=0.0)
                   for p, (lane, _) in enumerate(lanes)]
        precision = jax.lax.Precision.HIGHEST if cfg.precise_dots else None
        widen = (lambda x: x.astype(q_parts[0].dtype)) if cfg.fp8_cache else (lambda x: x)  # noqa: E731

        def kv_step(step, state):
            acc, running_max, running_sum = state
            key = step * cfg.block_kv + jnp.arange(cfg.block_kv, dtype=jnp.int32)  # positions [BK]
            key_valid = (key >= keys_start) & (key < keys_end)
            page = plt.load(block_tables_ref.at[seq, key // cfg.block_size], mask=key_valid,
                            other=0)
            page = jnp.clip(page, 0, cfg.num_blocks - 1)[:, None]
            slot = (key % cfg.block_size)[:, None]
            # Masked-out keys load as 0 (never NaN: 0 * NaN in the PV matmul would poison a row). An e4m3 cache
            # (kv_cache_dtype="fp8") is widened to q's dtype in registers.
            k_parts = [widen(plt.load(k_ref.at[page, slot, kv_head, lane], mask=with_lanes(key_valid[:, None], p),
                                      other=0.0)) for p, (lane, _) in enumerate(lanes)]
            if v_ref is None:  # latent rows: the values are the keys' first part
                v = k_parts[0]
            else:
                v = widen(plt.load(v_ref.at[page, slot, kv_head, value_lane],
                                   mask=with_lanes(key_valid[:, None], 0), other=0.0))
            scores = functools.reduce(jnp.add, [
                jax.lax.dot_general(qp, kp, (((1,), (1,)), ((), ())), precision=precision,
                                    preferred_element_type=jnp.float32)
                for qp, kp in zip(q_parts, k_parts)]) * cfg.sm_scale
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


def _ragged_paged_attention_call(q, k_cache, v_cache, block_tables, cu_q_lens, kv_lens, sinks=None, *,
                                 cfg: _KernelConfig, num_warps: int, num_stages: int,
                                 interpret: bool):
    tiles = num_tiles(cfg.num_tokens, kv_lens.shape[0], cfg.block_q)
    work = build_work_list(cu_q_lens, cfg.num_tokens, cfg.block_q, tiles)
    t, hq, dv = cfg.num_tokens, cfg.num_q_heads, cfg.value_width
    if cfg.num_kv_splits == 1:
        out_shape = jax.ShapeDtypeStruct((t, hq, dv), q.dtype)
    else:
        ns = cfg.num_kv_splits
        out_shape = (jax.ShapeDtypeStruct((ns, t, hq, dv), jnp.float32),
                     jax.ShapeDtypeStruct((ns, t, hq), jnp.float32),
                     jax.ShapeDtypeStruct((ns, t, hq), jnp.float32))
    caches = (k_cache,) if v_cache is None else (k_cache, v_cache)
    outs = pl.pallas_call(
        functools.partial(_attention_kernel, cfg=cfg),
        out_shape=out_shape,
        grid=(tiles, cfg.num_kv_heads * cfg.head_blocks, cfg.num_kv_splits),
        compiler_params=plt.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="ragged_paged_attention",
    )(work, cu_q_lens, kv_lens, block_tables, q, *caches, *(() if sinks is None else (sinks,)))
    if cfg.num_kv_splits == 1:
        return outs
    return combine_splits(*outs, q.dtype)


# ----------------------------------------------------------------------------------------------
# 3. Validated public function
# ----------------------------------------------------------------------------------------------


def _validate_caches(q, k_cache, v_cache, value_dim):
    if k_cache.ndim != 4:
        raise ValueError(f"k_cache must be [num_blocks, block_size, Hkv, D], got {k_cache.shape}")
    d = q.shape[-1]
    if v_cache is None:  # latent rows
        if value_dim is None:
            raise ValueError("v_cache=None means latent rows (MLA): give value_dim, the values' lanes at the "
                             "start of each key row")
        if not isinstance(value_dim, int) or not 0 < value_dim < d:
            raise ValueError(f"value_dim must be an int in (0, head_dim={d}), got {value_dim!r}")
        if value_dim > _MAX_LATENT_DIM or d - value_dim > _MAX_LATENT_REST:
            raise ValueError(f"latent rows of {value_dim} value lanes + {d - value_dim} key-only lanes: at most "
                             f"{_MAX_LATENT_DIM} + {_MAX_LATENT_REST} are supported")
        caches = (k_cache,)
    else:
        if value_dim is not None:
            raise ValueError("value_dim is for latent rows only (v_cache=None): with a V cache the values are its "
                             "rows")
        if v_cache.shape != k_cache.shape:
            raise ValueError(f"v_cache shape {v_cache.shape} != k_cache shape {k_cache.shape}")
        if d > _MAX_HEAD_DIM:
            raise ValueError(f"head_dim {d} > {_MAX_HEAD_DIM} is not supported (latent rows, as MLA's, go as "
                             "v_cache=None with value_dim)")
        caches = (k_cache, v_cache)
    if any(jnp.dtype(c.dtype) != jnp.dtype(k_cache.dtype) for c in caches) or jnp.dtype(k_cache.dtype) not in (
            jnp.dtype(q.dtype), _FP8_CACHE_DTYPE):
        raise ValueError(f"q and the caches must share a dtype (or the caches be float8_e4m3fn), got "
                         f"{q.dtype}, {', '.join(str(c.dtype) for c in caches)}")


def _validate(q, k_cache, v_cache, block_tables, cu_q_lens, kv_lens, sm_scale, sliding_window, soft_cap=None,
              sinks=None, value_dim=None):
    if q.ndim != 3:
        raise ValueError(f"q must be [T, Hq, D], got shape {q.shape}")
    _validate_caches(q, k_cache, v_cache, value_dim)
    if jnp.dtype(q.dtype) not in _SUPPORTED_DTYPES:
        raise ValueError(f"dtype {q.dtype} unsupported; use bfloat16, float16 or float32")
    _, hq, d = q.shape
    _, bs, hkv, dk = k_cache.shape
    if dk != d:
        raise ValueError(f"head_dim of q ({d}) != head_dim of the cache ({dk})")
    if hkv < 1 or hq % hkv:
        raise ValueError(f"Hq={hq} must be a multiple of Hkv={hkv}")
    if not is_power_of_2(bs):
        raise ValueError(f"block_size must be a power of two, got {bs}")
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
    "sm_scale", "sliding_window", "soft_cap", "value_dim", "interpret", "block_q", "heads_per_program",
    "kv_pages_per_step", "num_kv_splits", "num_warps", "num_stages"))
def ragged_paged_attention(q, k_cache, v_cache, block_tables, cu_q_lens, kv_lens, *,
                           sm_scale: float, sliding_window: int | None = None, soft_cap: float | None = None,
                           sinks: jax.Array | None = None, value_dim: int | None = None,
                           interpret: bool | None = None, block_q: int | None = None,
                           heads_per_program: int | None = None, kv_pages_per_step: int | None = None,
                           num_kv_splits: int | None = None, num_warps: int | None = None,
                           num_stages: int | None = None):
    """Attention of ragged query batches over a paged KV cache (see the module docstring).

    ``v_cache=None`` with ``value_dim``: latent rows (MLA), the values being the first ``value_dim`` lanes of
    each key row; the result is then ``[T, Hq, value_dim]``.

    Knobs (None = automatic): ``block_q`` query tokens per tile (power of two); ``heads_per_program`` query
    heads of one kv head per program (power of two, at most the group rounded up to one: larger is taken as
    that; block_q * heads_per_program >= 16);
    ``kv_pages_per_step`` cache pages per KV-loop step (power of two; keys per step >= 16);
    ``num_kv_splits`` split-K partitions (1 = off); ``num_warps`` / ``num_stages`` for Triton.
    ``interpret=None`` interprets the kernel unless the default backend is a GPU.
    Returns ``[T, Hq, D]`` (latent rows: ``[T, Hq, value_dim]``) in q's dtype.
    """
    _validate(q, k_cache, v_cache, block_tables, cu_q_lens, kv_lens, sm_scale, sliding_window, soft_cap, sinks,
              value_dim)
    t, hq, d = q.shape
    num_blocks, bs, hkv, _ = k_cache.shape
    s, mb = block_tables.shape
    group = hq // hkv
    acc_width = d if value_dim is None else value_dim  # the accumulator's lanes: what the defaults budget for
    interpret = gpu_target.resolve_interpret(interpret)
    capability = None if interpret else gpu_target.gpu_compute_capability()  # the knobs' defaults depend on it
    if heads_per_program is None:
        heads_per_program = default_heads_per_program(group, acc_width, capability)
    if not is_power_of_2(heads_per_program):
        raise ValueError(f"heads_per_program={heads_per_program} must be a power of two")
    heads_per_program = min(heads_per_program, next_power_of_2(group))
    if block_q is None:
        block_q = default_block_q(t, s, group, acc_width, capability)
    if not is_power_of_2(block_q) or block_q * heads_per_program < MIN_DOT_DIM:
        raise ValueError(f"block_q={block_q} must be a power of two with block_q * "
                         f"{heads_per_program} (query heads per program) >= {MIN_DOT_DIM}")
    default_keys, default_warps = default_launch(block_q * heads_per_program, acc_width, q.dtype.itemsize,
                                                 capability)
    if kv_pages_per_step is None:
        kv_pages_per_step = max(1, default_keys // bs)
    if not is_power_of_2(kv_pages_per_step) or kv_pages_per_step * bs < MIN_DOT_DIM:
        raise ValueError(f"kv_pages_per_step={kv_pages_per_step} must be a power of two with "
                         f"kv_pages_per_step * block_size >= {MIN_DOT_DIM}")
    head_blocks = cdiv(group, heads_per_program)
    if num_kv_splits is None:
        num_kv_splits = default_num_kv_splits(t, s, hkv * head_blocks, mb * bs, block_q)
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
        fp8_cache=jnp.dtype(k_cache.dtype) == _FP8_CACHE_DTYPE, sinks=sinks is not None, value_dim=value_dim,
        heads_per_program=heads_per_program)
    as_i32 = lambda x: x.astype(jnp.int32)  # noqa: E731
    return _ragged_paged_attention_call(
        q, k_cache, v_cache, as_i32(block_tables), as_i32(cu_q_lens), as_i32(kv_lens),
        None if sinks is None else sinks.astype(jnp.float32), cfg=cfg,
        num_warps=num_warps, num_stages=num_stages, interpret=interpret)


# ----------------------------------------------------------------------------------------------
# 4. Plain-jnp reference
# ----------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("sm_scale", "sliding_window", "soft_cap", "value_dim"))
def ragged_paged_attention_reference(q, k_cache, v_cache, block_tables, cu_q_lens, kv_lens, *,
                                     sm_scale: float, sliding_window: int | None = None,
                                     soft_cap: float | None = None, sinks: jax.Array | None = None,
                                     value_dim: int | None = None):
    """Same contract as ``ragged_paged_attention``: dense masked softmax, one sequence at a time (with
    ``sinks``: one more logit per head in the softmax, whose probability multiplies no value; with
    ``v_cache=None``: latent rows, the values being the first ``value_dim`` lanes of the keys' rows).

    For each sequence slot it gathers all ``MB * BS`` key slots named by its block table, then masks
    explicitly: which query rows are its own, which keys are live (``< kv_len``), causality and the
    window. Float32 throughout; dead keys' values are zeroed so poison in unused slots cannot leak.
    """
    if v_cache is None:
        v_cache = k_cache[..., :value_dim]
    num_tokens, num_q_heads, value_width = q.shape[0], q.shape[1], v_cache.shape[-1]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    num_seqs, max_blocks = block_tables.shape
    token = jnp.arange(num_tokens)
    key_pos = jnp.arange(max_blocks * block_size)
    hi = jax.lax.Precision.HIGHEST
    out = jnp.zeros((num_tokens, num_q_heads, value_width), jnp.float32)
    for s in range(num_seqs):
        q_start, q_end, kv_len = cu_q_lens[s], cu_q_lens[s + 1], kv_lens[s]
        own_row = (token >= q_start) & (token < q_end)  # [T]
        query_pos = kv_len - (q_end - q_start) + (token - q_start)  # [T]
        live_key = key_pos < kv_len  # [K]
        blocks, slots = block_tables[s, key_pos // block_size], key_pos % block_size
        # [K, Hkv, D] -> [K, Hq, D]: query head h reads kv head h // group (values: [K, Hq, Dv]).
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
