"""The JAX-facing side of the C++ attention kernels, and when the XLA attention path uses them: short query
runs (``paged_attention.cc``: decodes and verification) and longer ones (``ragged_attention.cc``: prompts and
prefill chunks).

Decode steps on the CPU spent most of their attention time gathering each sequence's K/V blocks into a
contiguous copy before XLA's dot could read them (the 134M Llama at batch 1: ~2 ms of a ~19 ms step); the
kernels read the keys and values in place, through the block table. A 512-token prompt's attention through
XLA's query-block loop ran at ~38 GFLOP/s (the 134M Llama: 10.6 ms per layer, a quarter of the prefill); the
ragged kernel computes it as flash attention in registers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.cpu.ffi import build

_TARGETS = {jnp.dtype(jnp.float32): "f32", jnp.dtype(jnp.int8): "e4m3"}  # cache dtype -> handler suffix


def use_paged_attention(q_dtype, cache_dtype) -> bool:
    """Whether the attention path may hand its query runs to the kernels: on the CPU, float32 queries, a
    float32 cache or the fp8 cache's CPU storage (e4m3 bytes typed int8), kernels loaded. Safe inside a trace:
    it only asks ``build.loaded()`` (never builds)."""
    return (jax.default_backend() == "cpu" and jnp.dtype(q_dtype) == jnp.float32
            and jnp.dtype(cache_dtype) in _TARGETS and build.loaded())


def paged_attention(q, k_cache, v_cache, block_tables, q_lens, kv_lens, *, sm_scale: float,
                    sliding_window: int | None = None) -> jax.Array:
    """Attention of short query runs straight from the paged cache.

    ``q [S, W, Hq, D]`` float32: slot s's queries, query j at position ``kv_lens[s] - q_lens[s] + j`` for
    ``j < q_lens[s]`` (the rest padding); caches ``[N, BS, Hkv, D]`` float32, or e4m3 bytes typed int8;
    ``block_tables [S, MB]``; ``q_lens``, ``kv_lens [S]``. Returns ``[S, W, Hq, D]`` float32: each query's
    softmax(q.k * sm_scale).v over the keys it sees (causal, inside ``sliding_window``); zeros for a query
    that sees none.
    """
    _check_heads_and_types(q, "[S, W, Hq, D]", k_cache, v_cache, sliding_window)
    num_seqs = q.shape[0]
    if block_tables.ndim != 2 or block_tables.shape[0] != num_seqs or q_lens.shape != (num_seqs,) \
            or kv_lens.shape != (num_seqs,):
        raise ValueError("block_tables [S, MB], q_lens [S] and kv_lens [S] must match q's S")
    return _call("paged_attention", q, k_cache, v_cache, block_tables, q_lens, kv_lens, sm_scale, sliding_window)


def ragged_attention(q, k_cache, v_cache, block_tables, cu_q_lens, kv_lens, *, sm_scale: float,
                     sliding_window: int | None = None) -> jax.Array:
    """Attention of a whole ragged step straight from the paged cache (the semantics of
    ``jaxinfer.model.attention.xla_ragged_paged_attention``).

    ``q [T, Hq, D]`` float32: sequence s owns tokens ``cu_q_lens[s]:cu_q_lens[s + 1]``, its query j at position
    ``kv_lens[s] - q_len + j``; caches ``[N, BS, Hkv, D]`` float32, or e4m3 bytes typed int8; ``block_tables
    [S, MB]``; ``cu_q_lens [S + 1]``; ``kv_lens [S]``. Returns ``[T, Hq, D]`` float32: each query's
    softmax(q.k * sm_scale).v over the keys it sees (causal, inside ``sliding_window``); zeros for tokens past
    ``cu_q_lens[S]`` and for a query that sees no key.
    """
    _check_heads_and_types(q, "[T, Hq, D]", k_cache, v_cache, sliding_window)
    num_seqs = block_tables.shape[0] if block_tables.ndim == 2 else -1
    if num_seqs < 0 or cu_q_lens.shape != (num_seqs + 1,) or kv_lens.shape != (num_seqs,):
        raise ValueError("block_tables [S, MB], cu_q_lens [S + 1] and kv_lens [S] must agree on S")
    return _call("ragged_attention", q, k_cache, v_cache, block_tables, cu_q_lens, kv_lens, sm_scale, sliding_window)


def _check_heads_and_types(q, q_layout: str, k_cache, v_cache, sliding_window) -> None:
    """ValueError unless q (heads and head size last) and the caches [N, BS, Hkv, D] fit each other and a kernel."""
    if q.ndim != q_layout.count(",") + 1 or k_cache.ndim != 4 or k_cache.shape != v_cache.shape \
            or k_cache.dtype != v_cache.dtype:
        raise ValueError(f"want q {q_layout} and equal caches [N, BS, Hkv, D], got {q.shape}, {k_cache.shape} and "
                         f"{v_cache.shape}")
    num_heads, head_dim = q.shape[-2:]
    if k_cache.shape[3] != head_dim or num_heads % k_cache.shape[2]:
        raise ValueError(f"q {q.shape} and caches {k_cache.shape} disagree on head size or head groups")
    if jnp.dtype(q.dtype) != jnp.float32 or jnp.dtype(k_cache.dtype) not in _TARGETS:
        raise ValueError(f"want float32 q and float32 or int8 (e4m3 bytes) caches, got {q.dtype}, {k_cache.dtype}")
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be None or >= 1, got {sliding_window}")


def _call(kernel: str, q, k_cache, v_cache, block_tables, lens_a, lens_b, sm_scale, sliding_window):
    build.require(q, k_cache)
    target = f"jaxinfer_{kernel}_{_TARGETS[jnp.dtype(k_cache.dtype)]}"
    call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(q.shape, jnp.float32))
    i32 = jnp.int32
    return call(q, k_cache, v_cache, block_tables.astype(i32), lens_a.astype(i32), lens_b.astype(i32),
                sm_scale=np.float32(sm_scale), sliding_window=np.int64(sliding_window or 0))
