"""Ragged paged attention on the XLA path (plain jnp), and the switch between attention backends.

Semantics (shared with ``pallas_kernels.ragged_paged_attention``): query ``i`` of sequence ``s`` sits at
position ``kv_lens[s] - q_len[s] + i`` and attends causally to the sequence's keys at positions up to its
own, read from the paged cache through ``block_tables``. The XLA path regroups the flat queries into a
``[S, Q, ...]`` tile (``Q`` = a static bound on the longest query run), gathers each sequence's blocks,
and computes a masked softmax in float32.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

BACKENDS = ("xla", "pallas")
_FINITE_MIN = -1e30  # running-max start: finite, so a chunk with no valid key rescales by exp(0), never NaN


def _online_softmax_step(carry, scores, weighted_sum):
    """Fold one block of masked ``scores`` [..., C] into the running (max, denominator, weighted sum [..., D]);
    ``weighted_sum(probs)`` gives the block's probs @ V [..., D]."""
    run_max, denom, acc = carry
    new_max = jnp.maximum(run_max, scores.max(-1))
    probs = jnp.exp(scores - new_max[..., None])
    rescale = jnp.exp(run_max - new_max)
    return new_max, denom * rescale + probs.sum(-1), acc * rescale[..., None] + weighted_sum(probs)


def _skip_unless(needed, compute, carry):
    """``compute(carry)`` if ``needed`` else ``carry``: a block no query may see is not computed at all."""
    return jax.lax.cond(needed, compute, lambda c: c, carry)


_PREFILL_Q_BLOCK = 64  # queries per block of the prefill loop
_PREFILL_K_BLOCK = 128  # keys per block


def _attend_tile(q_TNH, k_cache, v_cache, block_tables, q_start, q_lens, kv_lens, *, sm_scale, tile, sliding_window,
                 q_block=_PREFILL_Q_BLOCK, k_block=_PREFILL_K_BLOCK):
    """Attention of sequences whose queries fit a [G, tile] grid: returns [G, tile, Hq, D] (float32).

    Blocked like flash attention: queries in blocks of ``q_block`` (a loop over the tile), and for each, keys
    in blocks of ``k_block`` with an online softmax; a key block that no query of the block may see (past
    the last valid query's position: the causal half, the padding of ``tile`` and of the context, or before
    the sliding window) is skipped by a ``lax.cond``. A fresh 288-token prompt bucketed to a 512 x 512 tile
    thus computes ~1/4 of the score tile, and the scores of one block stay in cache (materialising the whole
    [G, Hq, tile, ctx] tensor cost ~30 ms per layer for four such prompts on XLA:CPU).
    """
    num_tokens, num_heads, head_dim = q_TNH.shape
    num_seqs = kv_lens.shape[0]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    q_block = min(q_block, tile)
    num_q_blocks = -(-tile // q_block)
    ctx = block_tables.shape[1] * block_size
    k_block = min(k_block, ctx)
    num_k_blocks = -(-ctx // k_block)
    pad = num_k_blocks * k_block - ctx

    def gather(cache):  # [G, Hkv, C', D], C' padded to whole key blocks (the padding is masked: past kv_len)
        x = cache[block_tables].reshape(num_seqs, ctx, num_kv_heads, head_dim).astype(jnp.float32)
        return jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))).transpose(0, 2, 1, 3)

    k_all, v_all = gather(k_cache), gather(v_cache)
    first_pos = kv_lens - q_lens  # position of each sequence's first query

    def attend_query_block(b):  # -> [G, q_block, Hq, D]
        j = b * q_block + jnp.arange(q_block)
        q_valid = j[None, :] < q_lens[:, None]  # [G, Qb]
        q = q_TNH[jnp.clip(q_start[:, None] + j[None, :], 0, num_tokens - 1)].astype(jnp.float32) * sm_scale
        q = q.reshape(num_seqs, q_block, num_kv_heads, group, head_dim).transpose(0, 2, 3, 1, 4)
        q = q.reshape(num_seqs, num_kv_heads, group * q_block, head_dim)
        q_pos = first_pos[:, None] + j[None, :]  # [G, Qb]
        last_key = jnp.max(jnp.where(q_valid, q_pos, -1))
        first_key = 0  # the first key any query of the block may see
        if sliding_window is not None:
            first_key = jnp.min(jnp.where(q_valid, q_pos, jnp.iinfo(jnp.int32).max)) - sliding_window + 1

        def visit(carry, kb):
            def compute(carry):
                k = jax.lax.dynamic_slice_in_dim(k_all, kb * k_block, k_block, axis=2)
                v = jax.lax.dynamic_slice_in_dim(v_all, kb * k_block, k_block, axis=2)
                scores = jnp.einsum("skqd,skcd->skqc", q, k).reshape(num_seqs, num_kv_heads, group, q_block, k_block)
                k_pos = kb * k_block + jnp.arange(k_block)
                mask = (k_pos[None, None, :] <= q_pos[:, :, None]) & q_valid[:, :, None]  # [G, Qb, Kb]
                if sliding_window is not None:
                    mask &= k_pos[None, None, :] > q_pos[:, :, None] - sliding_window
                scores = jnp.where(mask[:, None, None], scores, -jnp.inf)

                def weighted_sum(probs):  # [G, Hkv, group, Qb, Kb] -> [G, Hkv, group, Qb, D], as one matmul
                    flat = probs.reshape(num_seqs, num_kv_heads, group * q_block, k_block)
                    return jnp.einsum("skqc,skcd->skqd", flat, v).reshape(*probs.shape[:-1], head_dim)

                return _online_softmax_step(carry, scores, weighted_sum)

            needed = (kb * k_block <= last_key) & ((kb + 1) * k_block > first_key)
            return _skip_unless(needed, compute, carry), None

        stats_shape = (num_seqs, num_kv_heads, group, q_block)
        init = (jnp.full(stats_shape, _FINITE_MIN, jnp.float32), jnp.zeros(stats_shape, jnp.float32),
                jnp.zeros((*stats_shape, head_dim), jnp.float32))
        (_, denom, acc), _ = jax.lax.scan(visit, init, jnp.arange(num_k_blocks))
        out = (acc / jnp.where(denom > 0, denom, 1.0)[..., None]).transpose(0, 3, 1, 2, 4)
        return out.reshape(num_seqs, q_block, num_heads, head_dim)

    if num_q_blocks == 1:
        return attend_query_block(0)[:, :tile]
    out = jax.lax.map(attend_query_block, jnp.arange(num_q_blocks))  # [nb, G, Qb, Hq, D]
    return out.transpose(1, 0, 2, 3, 4).reshape(num_seqs, num_q_blocks * q_block, num_heads, head_dim)[:, :tile]


_DECODE_CHUNK_BYTES = 1 << 20  # K gathered per chunk of the short-query loop: small enough to stay in cache
SHORT_QUERY_MAX = 16  # a group whose query runs are at most this long attends like decodes (no tile)


def _attend_short_queries(q_TNH, k_cache, v_cache, block_tables, q_start, q_lens, kv_lens, *, width, sm_scale,
                          sliding_window, chunk_bytes=_DECODE_CHUNK_BYTES):
    """Attention of sequences with at most ``width`` queries each (decodes: 1; verification of k speculative
    tokens: 1 + k), the last at position kv_len - 1: returns [S, width, Hq, D] (float32).

    The context is visited once, in chunks of blocks, with an online softmax (running max, denominator and
    weighted sum) for all of a sequence's queries together, so the gathered K/V and the scores of one chunk
    stay small: gathering a whole long context at once made XLA:CPU allocate and page-fault tens of
    megabytes per layer (16 sequences x 1K keys: 45 ms -> 9 ms per layer), and the prefill tile's per-block
    gathers cost 1.5x this loop for 16 sequences verifying 4 tokens. Chunks that no query needs (past the
    longest context, which the bucketed block-table width leaves, or before every sliding window) are
    skipped.
    """
    num_tokens, num_heads, head_dim = q_TNH.shape
    num_seqs, max_blocks = block_tables.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    rows = width * group  # query rows per (sequence, KV head), ordered (query, head in group)
    j = jnp.arange(width)
    q_valid = j[None, :] < q_lens[:, None]  # [S, W]
    q = q_TNH[jnp.clip(q_start[:, None] + j[None, :], 0, num_tokens - 1)]  # [S, W, Hq, D]
    q = q.reshape(num_seqs, width, num_kv_heads, group, head_dim).transpose(0, 2, 1, 3, 4)
    q = q.reshape(num_seqs, num_kv_heads, rows, head_dim).astype(jnp.float32) * sm_scale
    q_pos = (kv_lens - q_lens)[:, None] + j[None, :]  # [S, W]
    row_pos = jnp.repeat(jnp.where(q_valid, q_pos, -1), group, axis=1)  # [S, rows]; -1: sees no key
    column_bytes = num_seqs * block_size * num_kv_heads * head_dim * 4
    chunk = 1
    while chunk * 2 * column_bytes <= chunk_bytes and chunk * 2 <= max_blocks:
        chunk *= 2
    num_chunks = -(-max_blocks // chunk)
    keys = chunk * block_size
    tables = jnp.pad(block_tables, ((0, 0), (0, num_chunks * chunk - max_blocks)))
    tables = tables.reshape(num_seqs, num_chunks, chunk).transpose(1, 0, 2)

    last_key = jnp.max(jnp.where(q_valid, q_pos, -1))  # chunks past every query (block-table padding): skipped
    first_key = 0
    if sliding_window is not None:
        live = q_valid & (q_pos >= 0)  # a slot with kv_len 0 (a draft row sitting a round out) sees nothing
        first_key = jnp.min(jnp.where(live, q_pos, jnp.iinfo(jnp.int32).max)) - sliding_window + 1

    def visit(carry, chunk_and_index):
        table, index = chunk_and_index

        def compute(carry):
            k = k_cache[table].reshape(num_seqs, keys, num_kv_heads, head_dim).astype(jnp.float32)
            v = v_cache[table].reshape(num_seqs, keys, num_kv_heads, head_dim).astype(jnp.float32)
            scores = jnp.einsum("skqd,sckd->skqc", q, k)
            k_pos = index * keys + jnp.arange(keys)
            valid = k_pos[None, None, :] <= row_pos[:, :, None]  # [S, rows, C]
            if sliding_window is not None:
                valid &= k_pos[None, None, :] > row_pos[:, :, None] - sliding_window
            scores = jnp.where(valid[:, None], scores, -jnp.inf)
            return _online_softmax_step(carry, scores, lambda probs: jnp.einsum("skgc,sckd->skgd", probs, v))

        needed = (index * keys <= last_key) & ((index + 1) * keys > first_key)
        return _skip_unless(needed, compute, carry), None

    init = (jnp.full((num_seqs, num_kv_heads, rows), _FINITE_MIN, jnp.float32),
            jnp.zeros((num_seqs, num_kv_heads, rows), jnp.float32),
            jnp.zeros((num_seqs, num_kv_heads, rows, head_dim), jnp.float32))
    (_, denom, acc), _ = jax.lax.scan(visit, init, (tables, jnp.arange(num_chunks)))
    out = acc / jnp.where(denom > 0, denom, 1.0)[..., None]  # [S, Hkv, rows, D]
    out = out.reshape(num_seqs, num_kv_heads, width, group, head_dim).transpose(0, 2, 1, 3, 4)
    return out.reshape(num_seqs, width, num_heads, head_dim)


def xla_ragged_paged_attention(
    q_TNH, k_cache, v_cache, block_tables, cu_q_lens, kv_lens, *, sm_scale, max_q_len, num_prefill_slots=None,
    sliding_window=None, decode_chunk_bytes=_DECODE_CHUNK_BYTES, prefill_q_block=_PREFILL_Q_BLOCK,
    prefill_k_block=_PREFILL_K_BLOCK, short_query_max=SHORT_QUERY_MAX,
):
    """q_TNH [T, Hq, D]; caches [N, BS, Hkv, D]; returns [T, Hq, D] (zeros for padding tokens).

    Sequence slots ``[0, P)`` (``P = num_prefill_slots``, static) may have up to ``max_q_len`` queries and
    are computed on a [P, max_q_len] grid; slots ``[P, S)`` must have at most one query (decodes) and are
    computed on an [S - P, 1] grid, so a long prefill chunk does not pad every decode to its length.
    ``P = None`` puts every slot in the first group. Decodes visit their context in chunks of about
    ``decode_chunk_bytes`` of gathered keys (see ``_attend_short_queries``), and so does the first group when
    ``max_q_len <= short_query_max`` (speculative verification, short prompts); longer query runs are
    computed in blocks of ``prefill_q_block`` queries x ``prefill_k_block`` keys (see ``_attend_tile``).
    """
    num_tokens = q_TNH.shape[0]
    num_seqs = kv_lens.shape[0]
    P = num_seqs if num_prefill_slots is None else num_prefill_slots
    q_lens = cu_q_lens[1:] - cu_q_lens[:-1]
    t = jnp.arange(num_tokens)
    out = jnp.zeros(q_TNH.shape, jnp.float32)
    if P > 0:
        if max_q_len <= short_query_max:
            tile = _attend_short_queries(q_TNH, k_cache, v_cache, block_tables[:P], cu_q_lens[:P], q_lens[:P],
                                         kv_lens[:P], width=max_q_len, sm_scale=sm_scale,
                                         sliding_window=sliding_window, chunk_bytes=decode_chunk_bytes)
        else:
            tile = _attend_tile(q_TNH, k_cache, v_cache, block_tables[:P], cu_q_lens[:P], q_lens[:P], kv_lens[:P],
                                sm_scale=sm_scale, tile=max_q_len, sliding_window=sliding_window,
                                q_block=prefill_q_block, k_block=prefill_k_block)
        seq = jnp.clip(jnp.searchsorted(cu_q_lens[: P + 1], t, side="right") - 1, 0, P - 1)
        idx = t - cu_q_lens[seq]
        in_a = (t < cu_q_lens[P]) & (idx < max_q_len)
        out = jnp.where(in_a[:, None, None], tile[seq, jnp.clip(idx, 0, max_q_len - 1)], out)
    if P < num_seqs:
        rest = _attend_short_queries(q_TNH, k_cache, v_cache, block_tables[P:], cu_q_lens[P:-1], q_lens[P:],
                                     kv_lens[P:], width=1, sm_scale=sm_scale, sliding_window=sliding_window,
                                     chunk_bytes=decode_chunk_bytes)[:, 0]
        k = jnp.clip(t - cu_q_lens[P], 0, num_seqs - P - 1)
        in_b = (t >= cu_q_lens[P]) & (t < cu_q_lens[-1])
        out = jnp.where(in_b[:, None, None], rest[k], out)
    return out.astype(q_TNH.dtype)


def get_attention_fn(
    backend: str,
    *,
    max_q_len: int,
    sliding_window: int | None,
    interpret: bool | None = None,
    num_prefill_slots: int | None = None,
):
    """Return ``fn(q, k_cache, v_cache, block_tables, cu_q_lens, kv_lens, sm_scale=...)`` for a backend."""
    if backend == "xla":
        return functools.partial(xla_ragged_paged_attention, max_q_len=max_q_len, sliding_window=sliding_window,
                                 num_prefill_slots=num_prefill_slots)
    if backend == "pallas":
        from pallas_kernels.ragged_paged_attention import ragged_paged_attention

        return functools.partial(ragged_paged_attention, sliding_window=sliding_window, interpret=interpret)
    raise ValueError(f"attention_backend must be one of {BACKENDS} or 'auto', got {backend!r}")
