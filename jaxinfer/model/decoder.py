"""The decoder as pure functions over a params pytree (Llama, Mistral, Qwen2, Qwen3; MoE: Mixtral,
Qwen2-MoE, Qwen3-MoE).

``forward(params, kv_cache, batch, cfg, attn_fn, moe_fn=...)`` runs one ragged step: it embeds the flat
tokens, and per layer writes the new keys and values into the paged cache and attends over it, then returns
the logits of the tokens named by ``batch.logits_indices`` together with the updated cache. The layer loop
is unrolled in Python over a list of per-layer param dicts, so every weight and cache buffer is used in
place. The params layout is declared in ``jaxinfer.model.weights`` (on one GPU the query, key and value
weights are one, ``jaxinfer.model.fused_qkv``); every projection goes through
``jaxinfer.model.linear.linear``; an MoE layer's MLP is ``moe_fn`` (``jaxinfer.model.moe.moe_block`` by default).

The model knows nothing of devices: run under ``jit`` with sharded params and cache, and with ``attn_fn`` /
``moe_fn`` wrapped by ``jaxinfer.model.sharding_plan`` (``shard_map`` over the local heads / experts), it is the
tensor- and expert-parallel model. Each layer runs in a ``jax.named_scope`` ("layer3"), so compiled
collectives can be attributed to layers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.config.model import ModelConfig, rope_inv_freq
from jaxinfer.model.fused_qkv import qkv_projection
from jaxinfer.model.kv_cache import KVCache, write_kv
from jaxinfer.model.linear import linear
from jaxinfer.model.moe import moe_block
from jaxinfer.model.step_batch import StepBatch


def rms_norm(x, weight, eps):
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight * x32.astype(x.dtype)


def rope_cos_sin(cfg: ModelConfig, positions):
    """cos, sin of shape [T, D] for HF's half-split rotary layout."""
    inv_freq = jnp.asarray(np.asarray(rope_inv_freq(cfg), dtype=np.float32))
    freqs = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x_TNH, cos, sin):
    half = x_TNH.shape[-1] // 2
    x32 = x_TNH.astype(jnp.float32)
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos[:, None, :] + rotated * sin[:, None, :]).astype(x_TNH.dtype)


def attention_block(lp, x, cos, sin, layer_cache, batch: StepBatch, cfg: ModelConfig, attn_fn):
    num_tokens = x.shape[0]
    q, k, v = qkv_projection(lp, x, cfg.q_size, cfg.kv_size, linear)
    if cfg.attention_bias:
        q, k, v = q + lp["bq"], k + lp["bk"], v + lp["bv"]
    q = q.reshape(num_tokens, cfg.num_heads, cfg.head_dim)
    k = k.reshape(num_tokens, cfg.num_kv_heads, cfg.head_dim)
    v = v.reshape(num_tokens, cfg.num_kv_heads, cfg.head_dim)
    if cfg.qk_norm:
        q = rms_norm(q, lp["q_norm"], cfg.rms_norm_eps)
        k = rms_norm(k, lp["k_norm"], cfg.rms_norm_eps)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    k_cache = write_kv(layer_cache[0], k, batch.slot_mapping)
    v_cache = write_kv(layer_cache[1], v, batch.slot_mapping)
    out = attn_fn(
        q, k_cache, v_cache, batch.block_tables, batch.cu_q_lens, batch.kv_lens, sm_scale=cfg.head_dim**-0.5
    )
    return linear(out.reshape(num_tokens, cfg.q_size), lp["wo"]), (k_cache, v_cache)


def mlp_block(lp, x):
    return linear(jax.nn.silu(linear(x, lp["w_gate"])) * linear(x, lp["w_up"]), lp["w_down"])


def forward(params, kv_cache: KVCache, batch: StepBatch, cfg: ModelConfig, attn_fn, moe_fn=moe_block,
            gather_logits=None):
    """One ragged step. Returns (logits [L, V] float32, new kv_cache).

    ``moe_fn(lp, x, valid, cfg) -> [T, H]`` computes an MoE layer's MLP (``valid``: the real, non-padding
    tokens); unused by dense models. ``gather_logits(logits) -> logits``: where the vocabulary is padded
    (``cfg.vocab_padding``), applied before the padding's columns are dropped (the sharded model's
    ``ShardingPlan.gather_logits``: gather the vocab-parallel logits first, then slice locally)."""
    with jax.named_scope("embed"):
        x = params["embed"][batch.token_ids]
    cos, sin = rope_cos_sin(cfg, batch.positions)
    valid = jnp.arange(x.shape[0]) < batch.cu_q_lens[-1]
    new_cache = []
    for i, (lp, layer_cache) in enumerate(zip(params["layers"], kv_cache)):
        with jax.named_scope(f"layer{i}"):
            h = rms_norm(x, lp["attn_norm"], cfg.rms_norm_eps)
            attn_out, layer_cache = attention_block(lp, h, cos, sin, layer_cache, batch, cfg, attn_fn)
            x = x + attn_out
            h = rms_norm(x, lp["mlp_norm"], cfg.rms_norm_eps)
            x = x + (moe_fn(lp, h, valid, cfg) if cfg.is_moe else mlp_block(lp, h))
        new_cache.append(layer_cache)
    with jax.named_scope("lm_head"):
        x = rms_norm(x[batch.logits_indices], params["final_norm"], cfg.rms_norm_eps)
        if "lm_head" in params:
            logits = linear(x, params["lm_head"], out_dtype=jnp.float32)
        else:  # tied: the embedding table transposed
            logits = jnp.dot(x, params["embed"].T, preferred_element_type=jnp.float32)
        if cfg.vocab_padding:  # the rows a vocabulary-parallel split padded on: never sampled, never seen
            if gather_logits is not None:
                logits = gather_logits(logits)
            logits = logits[:, :cfg.vocab_size]
    return logits, new_cache
