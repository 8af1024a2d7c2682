"""The paged KV cache: allocation and the in-place write of new keys and values.

Layout, per layer: ``k`` and ``v`` of shape ``[num_blocks, block_size, num_kv_heads, head_dim]``. A cache slot
``s`` is block ``s // block_size``, offset ``s % block_size``. The whole cache is a list (one entry per layer) of
``(k, v)`` tuples and is donated to the jitted step, which updates it in place. Under tensor parallelism
each array is sharded over the KV-head axis (``model.sharding_plan.ShardingPlan.kv_cache_sharding``): every device holds
all blocks for its own heads, so the block ids are the same on every device.

A multi-head latent attention model (DeepSeek, ``cfg.is_mla``) caches one array per layer instead, a 1-tuple
``(latent,)`` of shape ``[num_blocks, block_size, 1, kv_lora_rank + qk_rope_head_dim]`` (``jaxinfer.model.mla``):
the compressed latent and the rotated RoPE key, replicated on every device under tensor parallelism.

With ``kv_cache_dtype="fp8"`` the arrays are float8_e4m3fn (on the CPU: their bytes typed int8, see
``FP8_BITS_KV_DTYPE``): writes saturate at +-448, and the per-layer scales are folded into the model's weights
by ``jaxinfer.quantization.kv_cache`` (nothing here knows them).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ModelConfig

KVCache = list  # list[tuple[jax.Array, jax.Array]], one (k, v) per layer (MLA: one (latent,) per layer)
FP8_KV_DTYPE = jnp.dtype(jnp.float8_e4m3fn)  # kv_cache_dtype="fp8" (per-layer scales: jaxinfer.quantization.kv_cache)
# The same e4m3 bytes typed int8: the fp8 cache's storage on the CPU, where XLA scatters into a float8 array
# by copying the whole cache (measured: a 64-token write into a 7 MB layer cache 3.1 ms vs 0.04 ms as int8)
FP8_BITS_KV_DTYPE = jnp.dtype(jnp.int8)


def allocate_kv_cache(cfg: ModelConfig, num_blocks: int, block_size: int, dtype, sharding=None) -> KVCache:
    """Zeroed cache arrays; ``sharding``: where each array lives (None: the default device). Each array is
    created in place on its devices (no host or single-device copy of the whole cache)."""
    zeros = _zeros_fn(kv_cache_array_shape(cfg, num_blocks, block_size), jnp.dtype(dtype), sharding)
    return [tuple(zeros() for _ in range(cfg.kv_cache_arrays)) for _ in range(cfg.num_layers)]


def kv_cache_array_shape(cfg: ModelConfig, num_blocks: int, block_size: int) -> tuple[int, int, int, int]:
    """Shape of each cache array of a layer: [N, BS, Hkv, D], or MLA's [N, BS, 1, kv_lora_rank + rope dim]."""
    return (num_blocks, block_size, cfg.num_kv_heads, cfg.kv_cache_head_dim)


@functools.lru_cache(maxsize=None)
def _zeros_fn(shape, dtype, sharding):
    return jax.jit(lambda: jnp.zeros(shape, dtype), out_shardings=sharding)


def kv_cache_bytes_per_block(cfg: ModelConfig, block_size: int, dtype) -> int:
    return block_size * cfg.kv_cache_bytes_per_token(jnp.dtype(dtype).itemsize)


def write_kv(cache: jax.Array, new: jax.Array, slot_mapping: jax.Array) -> jax.Array:
    """Write ``new`` [T, Hkv, D] into ``cache`` [N, BS, Hkv, D] at flat slots ``slot_mapping`` [T].

    One scatter indexed by (block, offset): XLA performs it in place on the donated buffer. (Scattering into
    a flattened [N*BS, ...] view, or a loop of dynamic-update-slices, made XLA:CPU copy the whole cache.)
    Slots are unique except for padding tokens, which all land in the reserved null block 0.

    A single-token write is padded with a second one into the null slot: XLA turns a one-element scatter
    into a dynamic-update-slice, which XLA:CPU then performs on a copy of the cache (a batch-1 decode step
    copied ~40% of the cache: 20 ms instead of 4 ms with a 100 MB cache).
    """
    block_size = cache.shape[1]
    if slot_mapping.shape[0] == 1:
        new = jnp.concatenate([new, jnp.zeros_like(new)])
        slot_mapping = jnp.concatenate([slot_mapping, jnp.zeros_like(slot_mapping)])  # slot 0: the null slot
    if jnp.dtype(cache.dtype) in (FP8_KV_DTYPE, FP8_BITS_KV_DTYPE):  # saturate: e4m3 has no inf (-> NaN)
        limit = float(jnp.finfo(FP8_KV_DTYPE).max)
        new = jnp.clip(new.astype(jnp.float32), -limit, limit).astype(FP8_KV_DTYPE)
        if jnp.dtype(cache.dtype) == FP8_BITS_KV_DTYPE:
            new = jax.lax.bitcast_convert_type(new, FP8_BITS_KV_DTYPE)
    return cache.at[slot_mapping // block_size, slot_mapping % block_size].set(
        new.astype(cache.dtype), unique_indices=True
    )
