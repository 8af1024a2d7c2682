"""The paged KV cache: allocation and the in-place write of new keys and values.

Layout, per layer: ``k`` and ``v`` of shape ``[num_blocks, block_size, num_kv_heads, head_dim]``. A cache slot
``s`` is block ``s // block_size``, offset ``s % block_size``. The whole cache is a list (one entry per layer) of
``(k, v)`` tuples and is donated to the jitted step, which updates it in place.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxinfer.config import ModelConfig

KVCache = list  # list[tuple[jax.Array, jax.Array]], one (k, v) per layer


def allocate_kv_cache(cfg: ModelConfig, num_blocks: int, block_size: int, dtype) -> KVCache:
    shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
    return [(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in range(cfg.num_layers)]


def kv_cache_bytes_per_block(cfg: ModelConfig, block_size: int, dtype) -> int:
    return 2 * cfg.num_layers * block_size * cfg.kv_size * jnp.dtype(dtype).itemsize


def write_kv(cache: jax.Array, new: jax.Array, slot_mapping: jax.Array) -> jax.Array:
    """Write ``new`` [T, Hkv, D] into ``cache`` [N, BS, Hkv, D] at flat slots ``slot_mapping`` [T].

    A loop of single-token dynamic-update-slices: XLA performs it in place on the donated buffer
    (a batched scatter allocated a full temporary copy of the cache on XLA:CPU).
    """
    num_blocks, block_size = cache.shape[:2]
    flat = cache.reshape(num_blocks * block_size, *cache.shape[2:])
    new = new.astype(cache.dtype)

    def body(i, buf):
        return jax.lax.dynamic_update_slice(buf, new[i][None], (slot_mapping[i], 0, 0))

    flat = jax.lax.fori_loop(0, new.shape[0], body, flat)
    return flat.reshape(cache.shape)
