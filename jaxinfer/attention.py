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


def xla_ragged_paged_attention(
    q_TNH, k_cache, v_cache, block_tables, cu_q_lens, kv_lens, *, sm_scale, max_q_len, sliding_window=None
):
    """q_TNH [T, Hq, D]; caches [N, BS, Hkv, D]; returns [T, Hq, D] (zeros for padding tokens)."""
    num_tokens, num_heads, head_dim = q_TNH.shape
    num_seqs = kv_lens.shape[0]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    q_lens = cu_q_lens[1:] - cu_q_lens[:-1]  # [S]

    # Flat tokens -> [S, Q] tile.
    j = jnp.arange(max_q_len)
    src = cu_q_lens[:-1, None] + j[None, :]  # [S, Q]
    q_valid = j[None, :] < q_lens[:, None]
    q_SQNH = q_TNH[jnp.clip(src, 0, num_tokens - 1)]
    q_SQKGH = q_SQNH.reshape(num_seqs, max_q_len, num_kv_heads, group, head_dim)

    # Gather each sequence's context: [S, C, Hkv, D] with C = MB * BS.
    ctx = block_tables.shape[1] * block_size
    k_SCKH = k_cache[block_tables].reshape(num_seqs, ctx, num_kv_heads, head_dim)
    v_SCKH = v_cache[block_tables].reshape(num_seqs, ctx, num_kv_heads, head_dim)

    scores = jnp.einsum(
        "sqkgh,sckh->skgqc", q_SQKGH.astype(jnp.float32), k_SCKH.astype(jnp.float32)
    ) * sm_scale
    q_pos = (kv_lens - q_lens)[:, None] + j[None, :]  # [S, Q]
    k_pos = jnp.arange(ctx)
    mask = (k_pos[None, None, :] <= q_pos[:, :, None]) & q_valid[:, :, None]  # [S, Q, C]
    if sliding_window is not None:
        mask &= k_pos[None, None, :] > q_pos[:, :, None] - sliding_window
    scores = jnp.where(mask[:, None, None], scores, -jnp.inf)
    row_max = jnp.max(scores, axis=-1, keepdims=True)
    row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
    probs = jnp.exp(scores - row_max)
    denom = jnp.sum(probs, axis=-1, keepdims=True)
    probs = probs / jnp.where(denom > 0, denom, 1.0)
    out_SKGQH = jnp.einsum("skgqc,sckh->skgqh", probs, v_SCKH.astype(jnp.float32))
    out_SQNH = out_SKGQH.transpose(0, 3, 1, 2, 4).reshape(num_seqs, max_q_len, num_heads, head_dim)

    # [S, Q] tile -> flat tokens.
    t = jnp.arange(num_tokens)
    seq_of_token = jnp.clip(jnp.searchsorted(cu_q_lens, t, side="right") - 1, 0, num_seqs - 1)
    idx_in_seq = t - cu_q_lens[seq_of_token]
    valid = (t < cu_q_lens[-1]) & (idx_in_seq < max_q_len)
    out = out_SQNH[seq_of_token, jnp.clip(idx_in_seq, 0, max_q_len - 1)]
    return jnp.where(valid[:, None, None], out, 0.0).astype(q_TNH.dtype)


def get_attention_fn(backend: str, *, max_q_len: int, sliding_window: int | None, interpret: bool | None = None):
    """Return ``fn(q, k_cache, v_cache, block_tables, cu_q_lens, kv_lens, sm_scale=...)`` for a backend."""
    if backend == "xla":
        return functools.partial(xla_ragged_paged_attention, max_q_len=max_q_len, sliding_window=sliding_window)
    if backend == "pallas":
        from pallas_kernels.ragged_paged_attention import ragged_paged_attention

        return functools.partial(ragged_paged_attention, sliding_window=sliding_window, interpret=interpret)
    raise ValueError(f"attention_backend must be one of {BACKENDS} or 'auto', got {backend!r}")
